"""Every stage from file to trainer batch at three sizes, side by side with verifiers, NeMo Gym
and the numpy floor, on the same synthetic episodes in the same run.

Sizes are a quarter, a half and all of each context's episode count, so each stage's scaling
is read off one run: time growth over work growth between the smallest and the largest size
(1.00 is linear). Every action of every size of a context runs once per round, rounds
interleaved, so load from elsewhere on a shared machine falls on all of them alike; best and
median are kept. Each run is timed twice: wall time, and the process's CPU time (what this
process itself computed, whatever else the machine ran meanwhile). Ratios between contenders
are of wall-time medians; the scaling target is judged on the best CPU time of the rounds,
the figure least moved by other processes on a shared machine (wall-time scaling is shown
beside it). Of the CPU time, the kernel's share and the page faults are kept too: an action
that allocates row-sized arrays pays for first touches of fresh memory. The command first has
glibc's malloc keep freed memory and grow its heap, touched, past what the run needs
(`keep_warm_heap`), so every size of a stage runs on memory already backed
(docs/performance-bench.md). Peak memory is the largest traced allocation (tracemalloc, numpy
included) of one separate, untimed run.

Throughput is counted in call tokens (every kept call's prompt plus completion: the tokens the
policy processed) and in episodes, for every contender alike, so ratios are ratios of time.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from callgrove.batch import PackSettings, build_samples, pack
from callgrove.batch.tree import TreeSettings, pack_samples
from callgrove.bench import contenders
from callgrove.credit import GRPO, finalize_group
from callgrove.episode import Episode, encode_episode, load, save
from callgrove.forest import build_forest
from callgrove.orchestrator.memory import keep_freed_memory
from callgrove.rows import EpisodeRows, build_rows, check_rows
from callgrove.synth import PRESETS, call_tokens, synth_episodes

FORMS = {"JSON Lines": ".jsonl", "Parquet": ".parquet", "Arrow IPC": ".arrow"}
STAGES = "stage"
PATHS = "file to samples"
VERIFIERS = "verifiers 0.4.0 → samples"
GYM = "NeMo Gym 0.7.0 → linearised"
FLOOR = "numpy floor (forest given)"
TARGETS = {"binary": 10.0, "jsonl": 3.0, "floor": 5.0, "scaling": 1.1}
CPU, WALL = "cpu", "wall"  # the two clocks every run is timed by


@dataclass(frozen=True)
class BenchSettings:
    """`episodes`: each context's largest size (the smaller two are a half and a quarter)."""

    episodes: dict[str, int] = field(default_factory=lambda: {"4k": 200, "16k": 50})
    rounds: int = 3
    seed: int = 0
    verifiers: bool = True
    gym: bool = True
    memory: bool = True
    ranks: int = 8

    def sizes(self, context: str) -> list[int]:
        largest = self.episodes[context]
        return [max(1, largest // 4), max(1, largest // 2), largest]


@dataclass
class Measurement:
    """One action at one size: its wall and CPU times over the rounds and its peak memory."""

    context: str
    episodes: int
    call_tokens: int
    kind: str
    name: str
    seconds: list[float]
    cpu_seconds: list[float] = field(default_factory=list)
    peak_mb: float | None = None
    kernel_seconds: list[float] = field(default_factory=list)
    """Of each run's CPU time, the kernel's (mostly page faults)."""
    page_faults: list[int] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def best_cpu(self) -> float:
        return min(self.cpu_seconds)

    @property
    def kernel_share(self) -> float | None:
        """The kernel's part of all the rounds' CPU time."""
        cpu = sum(self.cpu_seconds)
        return sum(self.kernel_seconds) / cpu if self.kernel_seconds and cpu > 0 else None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def tokens_per_s(self, seconds: float) -> float:
        return self.call_tokens / seconds

    def record(self) -> dict[str, Any]:
        record = asdict(self)
        record.update(
            best_s=self.best,
            median_s=self.median,
            best_m_tokens_per_s=self.tokens_per_s(self.best) / 1e6,
            median_m_tokens_per_s=self.tokens_per_s(self.median) / 1e6,
            best_episodes_per_s=self.episodes / self.best,
            best_cpu_s=self.best_cpu,
        )
        return record


@dataclass
class Report:
    settings: BenchSettings
    measurements: list[Measurement] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    """Contenders that did not run, and why."""
    stream: dict[str, Any] | None = None
    allocator: str = "default"
    """How malloc treated freed memory during the run (`keep_warm_heap`)."""

    def find(self, context: str, episodes: int, name: str) -> Measurement | None:
        for m in self.measurements:
            if (m.context, m.episodes, m.name) == (context, episodes, name):
                return m
        return None

    def scaling(self, context: str, name: str, clock: str = CPU) -> float | None:
        """Time growth over work growth from the smallest to the largest size: best times of
        the rounds, CPU time (`CPU`) or wall time (`WALL`)."""
        sizes = self.settings.sizes(context)
        small, large = self.find(context, sizes[0], name), self.find(context, sizes[-1], name)
        if small is None or large is None:
            return None
        best = (lambda m: m.best_cpu) if clock == CPU else (lambda m: m.best)
        if best(small) <= 0:
            return None
        return (best(large) / best(small)) / (large.call_tokens / small.call_tokens)

    def headline(self) -> list[dict[str, Any]]:
        """At each context's largest size: each path's throughput and its ratio to verifiers."""
        lines = []
        for context in self.settings.episodes:
            largest = self.settings.sizes(context)[-1]
            baseline = self.find(context, largest, VERIFIERS)
            for m in self.measurements:
                if (m.context, m.episodes, m.kind) != (context, largest, PATHS):
                    continue
                lines.append(
                    {
                        "context": context,
                        "episodes": largest,
                        "path": m.name,
                        "best_m_tokens_per_s": m.tokens_per_s(m.best) / 1e6,
                        "median_m_tokens_per_s": m.tokens_per_s(m.median) / 1e6,
                        "vs_verifiers_best": baseline.best / m.best if baseline else None,
                        "vs_verifiers_median": baseline.median / m.median if baseline else None,
                    }
                )
        return lines

    def checks(self) -> list[tuple[str, bool]]:
        """The targets, each met or not, from this run's figures."""
        found = []
        for line in self.headline():
            ratio = line["vs_verifiers_median"]
            if ratio is None or not line["path"].startswith("callgrove"):
                continue
            form = "jsonl" if "JSON Lines" in line["path"] else "binary"
            target = TARGETS[form]
            found.append(
                (f"{line['context']}: {line['path']} ≥ {target:.0f}x verifiers", ratio >= target)
            )
        for context in self.settings.episodes:
            largest = self.settings.sizes(context)[-1]
            floor = self.find(context, largest, FLOOR)
            ours = [self.find(context, largest, s) for s in ("forest", "rows", "samples")]
            if floor is not None and all(ours):
                ratio = sum(m.median for m in ours if m) / floor.median
                found.append(
                    (
                        f"{context}: forest + rows + samples within {TARGETS['floor']:.0f}x of "
                        f"the floor (is {ratio:.1f}x)",
                        ratio <= TARGETS["floor"],
                    )
                )
            stages = [m.name for m in self.measurements if (m.context, m.kind) == (context, STAGES)]
            for name in dict.fromkeys(stages):
                factor = self.scaling(context, name)
                if factor is not None:
                    found.append(
                        (
                            f"{context}: {name} scales linearly "
                            f"(x{factor:.2f} by CPU time, at most x{TARGETS['scaling']:.1f})",
                            factor <= TARGETS["scaling"],
                        )
                    )
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings),
            "measurements": [m.record() for m in self.measurements],
            "scaling": {
                clock: {
                    context: {
                        name: self.scaling(context, name, clock)
                        for name in dict.fromkeys(m.name for m in self.measurements)
                    }
                    for context in self.settings.episodes
                }
                for clock in (CPU, WALL)
            },
            "headline": self.headline(),
            "checks": [{"check": name, "met": ok} for name, ok in self.checks()],
            "missing": self.missing,
            "stream": self.stream,
            "allocator": self.allocator,
        }

    def markdown(self) -> str:
        return render_markdown(self)


@dataclass
class Runs:
    """Each run of one action, round after round: wall time, process CPU time, and of that CPU
    time the part spent in the kernel, with the minor page faults taken (first touches of
    fresh memory, the kernel's share of a run that allocates large arrays)."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    kernel: list[float] = field(default_factory=list)
    page_faults: list[int] = field(default_factory=list)


def race(actions: dict[Any, Callable[[], Any]], rounds: int) -> dict[Any, Runs]:
    """Every action once a round, rounds interleaved; each run timed by every clock of `Runs`."""
    runs = {name: Runs() for name in actions}
    for _ in range(rounds):
        for name, action in actions.items():
            gc.collect()
            usage, start, start_cpu = _usage(), time.perf_counter(), time.process_time()
            result = action()  # held until the clocks stop: freeing it is not the action's work
            cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
            after, run = _usage(), runs[name]
            del result
            run.wall.append(wall)
            run.cpu.append(cpu)
            run.kernel.append(after.ru_stime - usage.ru_stime)
            run.page_faults.append(after.ru_minflt - usage.ru_minflt)
    return runs


def _usage() -> resource.struct_rusage:
    return resource.getrusage(resource.RUSAGE_SELF)


# More than the published sizes' heap ever holds (the report says whether it grew past), and
# below the mmap threshold `keep_freed_memory` sets, so it is taken from the heap.
WARM_HEAP = 1 << 30


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2`: ten size_t counters, `arena` (the main heap's size) first."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def keep_warm_heap(warm_bytes: int = WARM_HEAP) -> bool:
    """Have glibc's malloc keep freed memory for reuse, for the rest of the process
    (`orchestrator.memory.keep_freed_memory`, as `callgrove train` does), with its heap first
    grown to `warm_bytes` and every page of it touched; False where there is no glibc.

    With glibc's defaults a freed block over 32 MiB, and a free heap top over 64 MiB, go back
    to the kernel, and the next allocation of that size faults in fresh pages that the kernel
    zeroes: only the sizes whose arrays cross those fixed thresholds pay it, so a stage's
    largest size looked slower per token than its smaller ones for that alone. Keeping freed
    memory is not enough on its own here: other stages run in between and leave small live
    blocks inside freed large ones, so a large array is now and then placed past the heap's old
    end, on fresh pages again, and only at the larger sizes. A heap touched in advance has no
    fresh pages left below `warm_bytes`: every size runs on memory already backed, as a
    trainer's does once its heap has grown to its working set."""
    if not keep_freed_memory():
        return False
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(warm_bytes)
    if block:
        ctypes.memset(block, 0, warm_bytes)
        libc.free(block)  # the heap's top now: kept (never trimmed), its pages backed
    return True


def heap_bytes() -> int | None:
    """How large glibc's main heap has grown (`mallinfo2().arena`); None without glibc 2.33+."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().arena)


def allocator_note(kept: bool, heap_at_start: int | None) -> str:
    """What the report says of malloc: whether freed memory was kept and, if so, whether the
    heap grew past its touched part during the run (where fresh pages were faulted in)."""
    if not kept:
        return "default"
    note = f"freed memory kept, heap touched to {WARM_HEAP / 2**30:.0f} GiB in advance"
    heap = heap_bytes()
    if heap is None or heap_at_start is None:
        return note
    grown = heap - heap_at_start
    return note + (
        f"; grew {grown / 2**20:.0f} MiB past it" if grown > 0 else "; never grew past it"
    )


def peak_mb(action: Callable[[], Any]) -> float:
    """The largest traced allocation of one run of `action`, in MB."""
    gc.collect()
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def _groups(episodes: Iterable[Episode]) -> list[list[Episode]]:
    groups: dict[str | None, list[Episode]] = defaultdict(list)
    for episode in episodes:
        groups[episode.group].append(episode)
    return list(groups.values())


def callgrove_samples(path: Path) -> Callable[[], int]:
    """callgrove's path from a file to trainer samples: read, credit (GRPO), forest and rows,
    samples (token ids, loss mask, logprobs, advantages for every row)."""

    def run() -> int:
        episodes = list(load(path))
        for group in _groups(episodes):
            finalize_group(GRPO(), group)
        return len(build_samples([build_rows(episode) for episode in episodes]))

    return run


def _uncached(episode_rows: list[EpisodeRows]) -> list[EpisodeRows]:
    """The rows with what their first use leaves behind forgotten (a forest's new tokens, an
    episode's row columns), so that every round does the work the first one did."""
    for part in episode_rows:
        part.forest._new_tokens = None
        part.__dict__.pop("columns", None)  # a cached property
    return episode_rows


def _actions(
    episodes: list[Episode], work: Path, settings: BenchSettings, report: Report
) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Every stage and every path at one size, on files written to `work` first."""
    files = {form: work / f"episodes{suffix}" for form, suffix in FORMS.items()}
    for path in files.values():
        save(path, episodes)
    forests = [build_forest(e) for e in episodes]
    rows = [build_rows(e, forest=f) for e, f in zip(episodes, forests, strict=True)]
    groups = _groups(episodes)
    for group in groups:
        finalize_group(GRPO(), group)
    samples = build_samples(rows)
    seq_len = max(s.num_tokens for s in samples)
    actions: dict[str, tuple[str, Callable[[], Any]]] = {}
    for form, path in files.items():
        actions[f"read {form}"] = (STAGES, lambda path=path: list(load(path)))
    actions["forest"] = (STAGES, lambda: [build_forest(e) for e in episodes])
    actions["rows"] = (
        STAGES,
        lambda: [build_rows(e, forest=f) for e, f in zip(episodes, forests, strict=True)],
    )
    actions["check"] = (STAGES, lambda: [check_rows(r) for r in _uncached(rows)])
    actions["credit"] = (STAGES, lambda: [finalize_group(GRPO(), g) for g in groups])
    actions["samples"] = (STAGES, lambda: build_samples(_uncached(rows)))
    actions["pack"] = (STAGES, lambda: pack(samples, PackSettings(seq_len, ranks=settings.ranks)))
    # Episode scope, the one docs/performance-bench.md was measured at (the default is group scope).
    actions["tree pack"] = (STAGES, lambda: pack_samples(samples, TreeSettings(scope="episode")))
    for form, suffix in FORMS.items():
        out = work / f"written{suffix}"
        actions[f"write {form}"] = (STAGES, lambda out=out: save(out, episodes))
    for form, path in files.items():
        actions[f"callgrove {form} → samples"] = (PATHS, callgrove_samples(path))
    if settings.verifiers:
        why = contenders.verifiers_available()
        if why is None:
            folder = contenders.write_verifiers_run(work / "verifiers", episodes)
            actions[VERIFIERS] = (PATHS, contenders.verifiers_samples(folder))
        else:
            report.missing[VERIFIERS] = why
    if settings.gym:
        why = contenders.gym_available()
        if why is None:
            folder = contenders.write_gym_captures(work / "gym", episodes)
            actions[GYM] = (PATHS, contenders.gym_samples(folder))
        else:
            report.missing[GYM] = why
    actions[FLOOR] = (PATHS, contenders.floor_samples(contenders.floor_pieces(rows)))
    return actions


def run_bench(
    settings: BenchSettings, work: Path, tell: Callable[[str], None] = lambda _: None
) -> Report:
    """Measure every stage and path at every size of every context; files go under `work`.

    A context's sizes are raced together (every action of every size once a round), so the
    scaling between sizes compares runs made moments apart, not minutes."""
    report = Report(settings)
    for context in settings.episodes:
        shape = PRESETS[context]
        actions: dict[tuple[int, str], tuple[str, Callable[[], Any]]] = {}
        tokens: dict[int, int] = {}
        for size in settings.sizes(context):
            tell(f"{context}: preparing {size} episodes")
            episodes = list(synth_episodes(shape, size, settings.seed))
            tokens[size] = sum(call_tokens(e) for e in episodes)
            folder = work / f"{context}-{size}"
            folder.mkdir(parents=True, exist_ok=True)
            for name, action in _actions(episodes, folder, settings, report).items():
                actions[size, name] = action
        tell(f"{context}: {settings.rounds} rounds")
        runs = race({key: action for key, (_, action) in actions.items()}, settings.rounds)
        for (size, name), (kind, action) in actions.items():
            memory = peak_mb(action) if settings.memory else None
            run = runs[size, name]
            report.measurements.append(
                Measurement(
                    context,
                    size,
                    tokens[size],
                    kind,
                    name,
                    run.wall,
                    run.cpu,
                    memory,
                    run.kernel,
                    run.page_faults,
                )
            )
        del actions
        gc.collect()
    return report


# --- the 2 GB streaming case ------------------------------------------------------------------


# The measured child: the real CLI on the big file; it prints its own peak RSS (VmHWM, KiB) as
# the last line on stderr (ru_maxrss would keep the forked parent's high-water mark).
_PROBE = """
import atexit, sys
def peak():
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    print(status.split()[0], file=sys.stderr)
atexit.register(peak)
from callgrove.cli import main
sys.argv = ["callgrove", *sys.argv[1:]]
main()
"""


def stream_case(work: Path, gigabytes: float, seed: int = 0) -> dict[str, Any]:
    """Write about `gigabytes` of JSON Lines and stream `callgrove stats` over it in a child
    process: seconds, MB/s and the child's peak resident memory."""
    path = work / "stream.jsonl"
    pool = [encode_episode(e) for e in synth_episodes(PRESETS["4k"], 16, seed)]
    target, written, count = int(gigabytes * 1e9), 0, 0
    with path.open("wb") as out:
        while written < target:
            line = pool[count % len(pool)].replace(b'"id":"synth-', b'"id":"s%d-' % count, 1)
            out.write(line)
            written += len(line)
            count += 1
    start = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-c", _PROBE, "stats", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "120"},
    )
    seconds = time.perf_counter() - start
    path.unlink()
    lines = child.stderr.split()
    return {
        "command": "callgrove stats",
        "gigabytes": written / 1e9,
        "episodes": count,
        "seconds": seconds,
        "mb_per_s": written / 1e6 / seconds,
        "peak_rss_mb": int(lines[-1]) / 1024 if lines and lines[-1].isdigit() else None,
        "exit": child.returncode,
    }


# --- tables: the terminal and Markdown show the same cells -----------------------------------

HEADLINE_COLUMNS = ("context", "episodes", "path", "best", "median", "vs verifiers")


def headline_cells(report: Report) -> list[list[str]]:
    """File to samples at each context's largest size: M call tokens/s and the median ratio."""
    cells = []
    for line in report.headline():
        ratio = line["vs_verifiers_median"]
        cells.append(
            [
                line["context"],
                str(line["episodes"]),
                line["path"],
                f"{line['best_m_tokens_per_s']:.1f}",
                f"{line['median_m_tokens_per_s']:.1f}",
                "" if ratio is None else f"{ratio:.1f}x",
            ]
        )
    return cells


def stage_columns(report: Report, context: str) -> list[str]:
    sizes = report.settings.sizes(context)
    return [
        "stage",
        *(f"{n} ep" for n in sizes),
        "scaling CPU",
        "scaling wall",
        "kernel % CPU",
        "peak MB",
    ]


def stage_cells(report: Report, context: str) -> list[list[str]]:
    """Every action of a context: M call tokens/s (episodes/s) per size, best wall time of the
    rounds; the scaling factor by CPU and by wall time; at the largest size, the kernel's share
    of the CPU time over all rounds (page faults of fresh memory) and the peak memory."""
    cells = []
    sizes = report.settings.sizes(context)
    for name in dict.fromkeys(m.name for m in report.measurements if m.context == context):
        line, m = [name], None
        for size in sizes:
            m = report.find(context, size, name)
            line.append(
                ""
                if m is None
                else f"{m.tokens_per_s(m.best) / 1e6:.1f} ({m.episodes / m.best:.0f})"
            )
        for clock in (CPU, WALL):
            factor = report.scaling(context, name, clock)
            line.append("" if factor is None else f"x{factor:.2f}")
        share = None if m is None else m.kernel_share
        line.append("" if share is None else f"{100 * share:.0f}")
        line.append("" if m is None or m.peak_mb is None else f"{m.peak_mb:.0f}")
        cells.append(line)
    return cells


def stream_line(stream: dict[str, Any]) -> str:
    return (
        f"streaming: `{stream['command']}` over {stream['gigabytes']:.2f} GB of JSON Lines "
        f"({stream['episodes']} episodes): {stream['seconds']:.1f} s, "
        f"{stream['mb_per_s']:.0f} MB/s, peak RSS {stream['peak_rss_mb']:.0f} MB, "
        f"exit {stream['exit']}"
    )


def render_markdown(report: Report) -> str:
    def table(columns: Sequence[str], rows: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
        return lines + ["| " + " | ".join(row) + " |" for row in rows]

    out = [
        "# callgrove bench",
        "",
        "File to trainer samples: M call tokens/s, best and median of "
        f"{report.settings.rounds} interleaved rounds; the ratio to verifiers is of medians.",
        "",
        *table(HEADLINE_COLUMNS, headline_cells(report)),
    ]
    for context in report.settings.episodes:
        out += ["", f"## {context}: M call tokens/s (episodes/s), best of the rounds", ""]
        out += table(stage_columns(report, context), stage_cells(report, context))
    out += ["", "## Targets", ""]
    out += [f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in report.checks()]
    out += [f"- not run: {name}: {why}" for name, why in report.missing.items()]
    if report.stream:
        out += ["", stream_line(report.stream)]
    return "\n".join(out) + "\n"
