"""The training configuration: one TOML file, validated at load, every key overridable.

Unknown keys and wrong types are errors that name the key (`ConfigError: dispatch.group_size:
expected int, got str`). `load_config(path, overrides)` applies `section.key=value` overrides
(values parsed as TOML, falling back to a plain string) before validating, so the command line
can set anything the file can.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from callgrove.formats.ranges import check_choice, check_range
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.dispatcher import DispatchSettings
from callgrove.orchestrator.step import AlgorithmSettings
from callgrove.policy import SamplingParams
from callgrove.policy.backends import LearnerConfig, ModelSettings

EXECUTORS = ("local", "ray")
WANDB_MODES = ("offline", "online")


class ConfigError(ValueError):
    pass


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class RunSection(_Section):
    steps: int = 20
    out: str = "runs/train"
    seed: int = 0
    executor: str = "local"
    eval_every: int = 0
    """Evaluate after every this many steps (0: never)."""
    eval_repeats: int = 1
    keep_freed_memory: bool = True
    """Have glibc's malloc keep freed memory, so each step's arrays reuse the last step's
    pages instead of faulting in fresh ones (`callgrove.orchestrator.memory`); the process then
    never gives memory back."""

    def __post_init__(self) -> None:
        check_range("steps", self.steps, at_least=0)
        check_range("seed", self.seed, at_least=0)  # the generators of tasks take no negatives
        check_choice("executor", self.executor, EXECUTORS)
        check_range("eval_every", self.eval_every, at_least=0)
        check_range("eval_repeats", self.eval_repeats, at_least=1)


class EnvSection(_Section):
    name: str = "relay"
    options: dict[str, Any] = {}


class SamplingSection(_Section):
    max_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = msgspec.field(default_factory=list)
    """Stop strings: a completion ends once its text ends one (the renderer reads it)."""

    def __post_init__(self) -> None:
        sampling_params(self, ())  # the sampler's own checks


def sampling_params(section: SamplingSection, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    return SamplingParams(
        max_tokens=section.max_tokens,
        temperature=section.temperature,
        top_p=section.top_p,
        stop_token_ids=stop_token_ids,
        stop=tuple(section.stop),
    )


class DispatchSection(_Section):
    group_size: int = 8
    groups_per_step: int = 4
    max_in_flight: int = 256
    max_off_policy_steps: int = 1
    episode_timeout: float | None = 300.0

    def __post_init__(self) -> None:
        DispatchSettings(**msgspec.structs.asdict(self))  # the dispatcher's own checks


class AlgorithmSection(_Section):
    name: str = "hierarchical_grpo"
    scope: str = "seat"
    scale_by_std: bool = False
    local_seats: list[str] = msgspec.field(default_factory=lambda: ["helper"])
    decay: float = 0.9

    def __post_init__(self) -> None:
        algorithm_settings(self)  # the algorithms' own checks


def algorithm_settings(section: AlgorithmSection) -> AlgorithmSettings:
    return AlgorithmSettings(
        name=section.name,
        scope=section.scope,
        scale_by_std=section.scale_by_std,
        local_seats=tuple(section.local_seats),
        decay=section.decay,
    )


class DegeneracySection(_Section):
    gibberish_logprob: float = -9.0
    gibberish_tokens: int = 2
    repetition_logprob: float = -0.01
    repetition_run: int = 64
    drop: list[str] = msgspec.field(default_factory=lambda: ["gibberish", "repetition"])

    def __post_init__(self) -> None:
        degeneracy_settings(self, ())  # the detectors' own checks


def degeneracy_settings(
    section: DegeneracySection, stop_token_ids: tuple[int, ...]
) -> DegeneracySettings:
    return DegeneracySettings(
        gibberish_logprob=section.gibberish_logprob,
        gibberish_tokens=section.gibberish_tokens,
        repetition_logprob=section.repetition_logprob,
        repetition_run=section.repetition_run,
        drop=tuple(section.drop),
        stop_token_ids=stop_token_ids,
    )


class MonitorSection(_Section):
    live: bool = True
    plot: bool = True
    samples_per_step: int = 16
    wandb: bool = False
    wandb_project: str = "callgrove"
    wandb_entity: str = ""
    """The W&B team or user the run goes to (empty: the account's default)."""
    wandb_name: str = ""
    """The run's name in W&B (empty: the run's id)."""
    wandb_mode: str = "offline"
    """`offline`: written under OUT/wandb only (`wandb sync` uploads it); `online` uploads."""
    tensorboard: bool = False

    def __post_init__(self) -> None:
        check_range("samples_per_step", self.samples_per_step, at_least=0)
        check_choice("wandb_mode", self.wandb_mode, WANDB_MODES)


class RaySection(_Section):
    address: str = ""
    """Empty: start a local Ray; else a cluster address (`ray://host:10001` or `auto`)."""
    env_workers: int = 2

    def __post_init__(self) -> None:
        check_range("env_workers", self.env_workers, at_least=1)


class DataSection(_Section):
    """`[data]`: what `[train] objective = "sft"` trains on instead of episodes of `[env]`."""

    paths: list[str] = []
    """Folders or files of Claude Code sessions, Codex rollouts or callgrove episode files
    (JSON Lines; each file's kind is read from its first lines)."""
    rows_per_step: int = 8
    max_row_tokens: int = 0
    """Cut each row to its first this many tokens (0: whole rows)."""
    allow_dropped_content: bool = False
    """Train even where the model's chat template leaves message content (such as tool calls)
    out of the tokens; counted and reported. By default that is an error."""

    def __post_init__(self) -> None:
        check_range("rows_per_step", self.rows_per_step, at_least=1)
        check_range("max_row_tokens", self.max_row_tokens, at_least=0)


class TrainConfig(_Section):
    run: RunSection = msgspec.field(default_factory=RunSection)
    env: EnvSection = msgspec.field(default_factory=EnvSection)
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    sampling: SamplingSection = msgspec.field(default_factory=SamplingSection)
    dispatch: DispatchSection = msgspec.field(default_factory=DispatchSection)
    algorithm: AlgorithmSection = msgspec.field(default_factory=AlgorithmSection)
    train: LearnerConfig = msgspec.field(default_factory=LearnerConfig)
    degeneracy: DegeneracySection = msgspec.field(default_factory=DegeneracySection)
    monitor: MonitorSection = msgspec.field(default_factory=MonitorSection)
    ray: RaySection = msgspec.field(default_factory=RaySection)
    data: DataSection = msgspec.field(default_factory=DataSection)


@dataclass(frozen=True)
class Resolved:
    """The settings objects the loop runs with, built (and so checked) from a config."""

    config: TrainConfig
    dispatch: DispatchSettings
    sampling: SamplingParams
    algorithm: AlgorithmSettings
    degeneracy: DegeneracySettings


def resolve(config: TrainConfig, stop_token_ids: tuple[int, ...]) -> Resolved:
    """The settings objects of a config (each section was checked when it was read)."""
    return Resolved(
        config,
        DispatchSettings(**msgspec.structs.asdict(config.dispatch)),
        sampling_params(config.sampling, stop_token_ids),
        algorithm_settings(config.algorithm),
        degeneracy_settings(config.degeneracy, stop_token_ids),
    )


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read, override and validate a config (no path: the defaults)."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from None
        except OSError as error:
            raise ConfigError(f"{path}: {error.strerror}") from None
    for key, value in (overrides or {}).items():
        set_dotted(raw, key, value)
    return config_from_dict(raw, source=str(path or "defaults"))


def config_from_dict(raw: dict[str, Any], source: str = "config") -> TrainConfig:
    try:
        return msgspec.convert(raw, TrainConfig)
    except msgspec.ValidationError as error:
        raise ConfigError(f"{source}: {_readable(str(error))}") from None


# What a resumed run may set otherwise than the run it continues: how far it goes, where and how
# it runs, what it reports. Anything else would make the steps before and after disagree.
CHANGEABLE_ON_RESUME = (
    "run.steps",
    "run.out",
    "run.executor",
    "run.eval_every",
    "run.eval_repeats",
    "run.keep_freed_memory",
    "monitor.*",
    "ray.*",
)


def check_resume(started: dict[str, Any], config: TrainConfig, folder: str) -> None:
    """Refuse to continue a run (its config as saved, `started`) with other settings than
    `CHANGEABLE_ON_RESUME`; the error names each changed one."""
    before = msgspec.to_builtins(config_from_dict(started, source=f"{folder}'s checkpoint"))
    now = msgspec.to_builtins(config)
    changed = [
        f"{section}.{key} {before[section].get(key)!r} -> {value!r}"
        for section, values in now.items()
        for key, value in values.items()
        if before[section].get(key) != value
        and f"{section}.{key}" not in CHANGEABLE_ON_RESUME
        and f"{section}.*" not in CHANGEABLE_ON_RESUME
    ]
    if changed:
        raise ConfigError(
            f"{folder} was started with other settings ({', '.join(changed)}); a run continues "
            f"with the settings it started with (only {', '.join(CHANGEABLE_ON_RESUME)} may "
            "change): set them back, or start a new run in another run.out"
        )


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` with the value read as TOML (`4`, `true`, `"x"`, `[1, 2]`), else a
    plain string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected section.key=value")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `section.key` in a raw (not yet validated) config."""
    *sections, key = dotted.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {section} is not a section")
    node[key] = value


def _readable(message: str) -> str:
    """msgspec's `Object contains unknown field `x` - at `$.run`` as `run.x: unknown key`."""
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?", message)
    if unknown:
        where = ".".join(p for p in (unknown.group(2), unknown.group(1)) if p)
        return f"{where}: unknown key"
    typed = re.match(r"(.*) - at `\$\.?([^`]*)`", message)
    if typed:
        return f"{typed.group(2)}: {typed.group(1)}"
    return message


def to_toml(config: TrainConfig) -> str:
    """The resolved config as TOML (written next to a run's outputs)."""
    lines = []
    for section, values in msgspec.to_builtins(config).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    raise TypeError(f"cannot write {value!r} as TOML")
