"""The training configuration: one TOML file, validated at load, every key overridable.

Unknown keys and wrong types are errors that name the key (`ConfigError: dispatch.group_size:
expected int, got str`), and a mistyped name (a key, a table, a choice) says the one it is
closest to (`trian: unknown key (did you mean 'train'?)`). `load_config(path, overrides)`
applies `section.key=value` overrides (values parsed as TOML, falling back to a plain string)
before validating, so the command line can set anything the file can.
"""

from __future__ import annotations

import ast
import re
import tomllib
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from callgrove.credit import ALGORITHMS, GRPO, Algorithm, BuiltinAlgorithm
from callgrove.errors import UsageError, did_you_mean
from callgrove.formats.ranges import check_choice, check_range
from callgrove.models.settings import MODEL_KINDS, ModelSettings, TinyModel, VllmModel, model_table
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.dispatcher import DispatchSettings
from callgrove.policy import SamplingParams
from callgrove.rows import RowSettings
from callgrove.train.settings import LearnerSettings, check_world_size

EXECUTORS = ("local", "ray")
_DEFAULT_ALGORITHM = GRPO
WANDB_MODES = ("offline", "online")


class ConfigError(UsageError, ValueError):
    """A training config (its file, or a `--set`) that cannot be used: named before the run."""


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
        if not self.out.strip():  # an empty path is the current folder, taken over silently
            raise ConfigError("out must name a folder, not be empty")
        check_range("steps", self.steps, at_least=0)
        # The generators of tasks take no negatives, torch's none of 64 bits or more.
        check_range("seed", self.seed, at_least=0, below=2**63)
        check_choice("executor", self.executor, EXECUTORS)
        check_range("eval_every", self.eval_every, at_least=0)
        check_range("eval_repeats", self.eval_repeats, at_least=1)


class EnvSection(_Section):
    name: str = "relay"
    options: dict[str, Any] = {}


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
    model: ModelSettings = msgspec.field(default_factory=TinyModel)
    """A tagged union: `kind` (tiny, hf or vllm) picks the model, and only its own settings may
    follow (`callgrove.models.settings`)."""
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    dispatch: DispatchSettings = msgspec.field(default_factory=DispatchSettings)
    algorithm: BuiltinAlgorithm = msgspec.field(default_factory=_DEFAULT_ALGORITHM)
    """A tagged union: `name` picks the algorithm, and only its own settings may follow."""
    train: LearnerSettings = msgspec.field(default_factory=LearnerSettings)
    degeneracy: DegeneracySettings = msgspec.field(default_factory=DegeneracySettings)
    monitor: MonitorSection = msgspec.field(default_factory=MonitorSection)
    ray: RaySection = msgspec.field(default_factory=RaySection)
    data: DataSection = msgspec.field(default_factory=DataSection)
    rows: RowSettings = msgspec.field(default_factory=RowSettings)

    def __post_init__(self) -> None:
        if self.sampling.seed is not None:
            # One seed on every call would draw the same completion for every episode of a group.
            raise ConfigError("sampling.seed: a run seeds its sampler from run.seed")
        if isinstance(self.model, VllmModel) and self.train.objective != "rl":
            raise ConfigError('model.kind: an sft run samples nothing (kind = "hf", not "vllm")')


@dataclass(frozen=True)
class Resolved:
    """What the loop runs with beyond the config: the settings that also stop at the chat format's
    stop tokens, and a fresh algorithm (one that learns keeps its state on itself)."""

    config: TrainConfig
    sampling: SamplingParams
    degeneracy: DegeneracySettings
    algorithm: Algorithm


def resolve(config: TrainConfig, stop_token_ids: tuple[int, ...]) -> Resolved:
    def with_stops(given: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(dict.fromkeys(given + stop_token_ids))

    return Resolved(
        config,
        msgspec.structs.replace(
            config.sampling, stop_token_ids=with_stops(config.sampling.stop_token_ids)
        ),
        msgspec.structs.replace(
            config.degeneracy, stop_token_ids=with_stops(config.degeneracy.stop_token_ids)
        ),
        msgspec.structs.replace(config.algorithm),
    )


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read, override and validate a config (no path: the defaults)."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from None
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"{path}: not valid TOML: not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
        except OSError as error:
            raise ConfigError(f"{path}: {error.strerror}") from None
    overrides = overrides or {}
    source = str(path or "defaults")
    if "model.name" in overrides and "model.kind" not in overrides:
        # A name given alone picks its kind (`kind` in the file named the file's model).
        model = raw.get("model")
        if isinstance(model, dict):
            model.pop("kind", None)
    if "algorithm.name" in overrides:
        _keep_the_named_algorithms_keys(raw, overrides, source)
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    config = config_from_dict(raw, source=source)
    # Here, not in `config_from_dict`: a checkpoint's config, from a larger machine, still loads.
    try:
        check_world_size(config.train.world_size)  # a config's ranks run on the CPU (gloo)
    except UsageError as error:
        raise ConfigError(f"{source}: {error}") from None
    return config


def _keep_the_named_algorithms_keys(
    raw: dict[str, Any], overrides: dict[str, Any], source: str
) -> None:
    """With `--set algorithm.name=X`, leave out the file's `[algorithm]` keys that X does not
    take, with a warning naming them.

    Left out rather than refused: the command line names the algorithm to run, and the file's
    settings for the one the file named mean nothing to another (`--set algorithm.name=grpo`
    on a file tuned for `hierarchical_grpo` should run GRPO, not ask to edit the file first), as
    `model.name` leaves out the file's `kind` and the reference decoder's sizes. The keys both
    take (`scale_by_std`, ...) carry over; a key X does not take given by `--set` itself is
    still an error."""
    table = raw.get("algorithm")
    name = overrides["algorithm.name"]
    if not isinstance(table, dict) or name not in ALGORITHMS:
        return  # no table to carry over; an unknown name is refused with the choices
    before = table.get("name", _DEFAULT_ALGORITHM.__struct_config__.tag)
    if before == name:
        return
    dropped = [
        key
        for key in table
        if key != "name"
        and key not in ALGORITHMS[name].__struct_fields__
        and f"algorithm.{key}" not in overrides
    ]
    for key in dropped:
        del table[key]
    if dropped:
        keys = ", ".join(f"algorithm.{key}" for key in dropped)
        warnings.warn(
            f"{source}: {keys}: not a setting of algorithm {name!r} (--set algorithm.name), "
            f"left out (the file sets it for {before!r})",
            stacklevel=3,
        )


def config_from_dict(raw: dict[str, Any], source: str = "config") -> TrainConfig:
    model = raw.get("model")
    if isinstance(model, dict):
        kind = model.get("kind")
        if isinstance(kind, str) and kind not in MODEL_KINDS:
            raise ConfigError(
                f"{source}: model.kind must be one of {tuple(MODEL_KINDS)}, not {kind!r}"
                + did_you_mean(kind, MODEL_KINDS)
            )
        try:
            raw["model"], notes = model_table(model)
        except ValueError as error:
            raise ConfigError(f"{source}: {error}") from None
        for note in notes:
            warnings.warn(f"{source}: {note}", stacklevel=2)
    algorithm = raw.get("algorithm")
    if isinstance(algorithm, dict):
        name = algorithm.setdefault("name", _DEFAULT_ALGORITHM.__struct_config__.tag)
        try:
            check_choice("name", name, ALGORITHMS)
        except ValueError as error:
            raise ConfigError(f"{source}: algorithm: {_suggest(str(error))}") from None
    try:
        return msgspec.convert(raw, TrainConfig)
    except msgspec.ValidationError as error:
        raise ConfigError(f"{source}: {_readable(str(error), raw)}") from None


# What a resumed run may set otherwise than the run it continues: how far it goes, where and how
# it runs (the learner's ranks included: their step is the one process's; and the tokens of a
# micro-batch, which split the same step otherwise), what it reports.
# Anything else would make the steps before and after disagree.
CHANGEABLE_ON_RESUME = (
    "run.steps",
    "run.out",
    "run.executor",
    "run.eval_every",
    "run.eval_repeats",
    "run.keep_freed_memory",
    "train.world_size",
    "train.seq_len",
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


def _readable(message: str, raw: dict[str, Any]) -> str:
    """msgspec's `Object contains unknown field `x` - at `$.run`` as `run.x: unknown key`, with
    the key it is closest to; a key of another algorithm than the one named says so."""
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?", message)
    if unknown:
        key, table = unknown.group(1), unknown.group(2) or ""
        where = ".".join(p for p in (table, key) if p)
        hint = did_you_mean(key, _keys_at(table, raw))
        if table == "algorithm":
            name = raw["algorithm"]["name"]
            settings = ", ".join(ALGORITHMS[name].__struct_fields__)
            return f"{where}: not a setting of algorithm {name!r}{hint} (its settings: {settings})"
        if table == "model" and raw["model"].get("kind") in MODEL_KINDS:
            kind = raw["model"]["kind"]
            settings = ", ".join(MODEL_KINDS[kind].__struct_fields__)
            return f"{where}: not a setting of model kind {kind!r}{hint} (its settings: {settings})"
        return f"{where}: unknown key{hint}"
    typed = re.match(r"(.*) - at `\$\.?([^`]*)`", message)
    if typed:
        return f"{typed.group(2)}: {_suggest(typed.group(1))}"
    return message


def _keys_at(table: str, raw: dict[str, Any]) -> tuple[str, ...]:
    """The keys the table at msgspec's path `table` (`""`: the top, `model.vllm`, ...) takes: its
    struct's fields, the member of a tagged union that the raw table's tag names."""
    kind: Any = TrainConfig
    node: Any = raw
    for part in filter(None, re.sub(r"\[\d+\]", "", table).split(".")):
        struct = _struct_of(kind, node)
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(struct)} if struct else {}
        if part not in fields:
            return ()
        kind, node = fields[part], node.get(part) if isinstance(node, dict) else None
    struct = _struct_of(kind, node)
    return tuple(f.encode_name for f in msgspec.structs.fields(struct)) if struct else ()


def _struct_of(kind: Any, node: Any) -> type[msgspec.Struct] | None:
    """The struct a raw table `node` is read as where the type is `kind` (a union of tagged
    structs: the one its tag names)."""
    structs = [
        member
        for member in typing.get_args(kind) or (kind,)
        if isinstance(member, type) and issubclass(member, msgspec.Struct)
    ]
    if len(structs) == 1:
        return structs[0]
    for struct in structs:
        config = struct.__struct_config__
        if isinstance(node, dict) and node.get(config.tag_field) == config.tag:
            return struct
    return None


def _suggest(message: str) -> str:
    """`check_choice`'s `x must be one of ('a', 'b'), not 'c'` with the choice `c` is closest
    to (any other message as it is)."""
    choice = re.search(r"must be one of (\(.*\)), not (.+)$", message)
    if not choice or "did you mean" in message:
        return message
    try:
        known, given = ast.literal_eval(choice.group(1)), ast.literal_eval(choice.group(2))
    except (ValueError, SyntaxError):
        return message
    if not isinstance(given, str):
        return message
    return message + did_you_mean(given, known)


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
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    raise TypeError(f"cannot write {value!r} as TOML")
