"""The episode record: the unit that is dispatched, scored, written and read back."""

from callgrove.episode.codec import episode_from_wire, episode_to_wire, token_array
from callgrove.episode.files import load, save
from callgrove.episode.io import (
    EpisodeWriter,
    encode_episode,
    read_episodes,
    read_located_episodes,
    write_episodes,
)
from callgrove.episode.record import (
    AGENT_STARTS,
    LOGPROB_DTYPE,
    PURPOSES,
    TOKEN_DTYPE,
    Agent,
    Call,
    Episode,
)

__all__ = [
    "AGENT_STARTS",
    "LOGPROB_DTYPE",
    "PURPOSES",
    "TOKEN_DTYPE",
    "Agent",
    "Call",
    "Episode",
    "EpisodeWriter",
    "encode_episode",
    "episode_from_wire",
    "episode_to_wire",
    "load",
    "read_episodes",
    "read_located_episodes",
    "save",
    "token_array",
    "write_episodes",
]
