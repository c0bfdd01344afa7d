"""The episode record: the unit that is dispatched, scored, written and read back."""

from callgrove.episode.binary import (
    BinaryEpisodeWriter,
    is_binary,
    read_binary_episodes,
    write_binary_episodes,
)
from callgrove.episode.codec import episode_from_wire, episode_to_wire, token_array
from callgrove.episode.files import (
    EpisodeFormat,
    convert,
    format_for,
    load,
    load_located,
    open_writer,
    register,
    save,
)
from callgrove.episode.io import (
    EpisodeWriter,
    encode_episode,
    read_episodes,
    read_located_episodes,
    write_episodes,
)
from callgrove.episode.provenance import Gap, Spawn
from callgrove.episode.record import (
    AGENT_STARTS,
    LOGPROB_DTYPE,
    PURPOSES,
    TOKEN_DTYPE,
    Agent,
    Call,
    EnvInfo,
    Episode,
    EpisodeError,
    PolicySpan,
    Run,
    sampling_record,
)
from callgrove.episode.staleness import OffPolicySteps, off_policy_steps
from callgrove.episode.stats import AgentTally, Spread, Stats

__all__ = [
    "AGENT_STARTS",
    "LOGPROB_DTYPE",
    "PURPOSES",
    "TOKEN_DTYPE",
    "Agent",
    "AgentTally",
    "BinaryEpisodeWriter",
    "Call",
    "EnvInfo",
    "Episode",
    "EpisodeError",
    "EpisodeFormat",
    "EpisodeWriter",
    "Gap",
    "OffPolicySteps",
    "PolicySpan",
    "Run",
    "Spawn",
    "Spread",
    "Stats",
    "convert",
    "encode_episode",
    "episode_from_wire",
    "episode_to_wire",
    "format_for",
    "is_binary",
    "load",
    "load_located",
    "off_policy_steps",
    "open_writer",
    "read_binary_episodes",
    "read_episodes",
    "read_located_episodes",
    "register",
    "sampling_record",
    "save",
    "token_array",
    "write_binary_episodes",
    "write_episodes",
]
