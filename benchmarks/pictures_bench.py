"""Drawing an episode: layout, SVG and HTML time, and how it grows with the number of calls.

    python benchmarks/pictures_bench.py [--calls 1000] [--agents 25] [--prompt 2000] [--repeat 3]

Uses the forest benchmark's synthetic episode (a leader and subagents, forks and compactions,
calls of different agents interleaved in the ledger). Rows are built once per size and not
timed. Prints, per size (1x, 2x, 4x the calls), the best time of layout, SVG and HTML and
the output sizes, and the time ratio to the base size against the calls ratio.
"""

from __future__ import annotations

import argparse
import time

from callgrove.pictures import layout, render_html, render_svg
from callgrove.rows import build_rows
from forest_bench import synthetic_episode


def best_seconds(repeat: int, work) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=25)
    parser.add_argument("--prompt", type=int, default=2000, help="mean prompt length in tokens")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = None
    for scale in (1, 2, 4):
        calls = args.calls * scale
        result = build_rows(synthetic_episode(calls, args.agents * scale, args.prompt))
        seconds_layout, picture = best_seconds(args.repeat, lambda r=result: layout(r))
        seconds_svg, svg = best_seconds(args.repeat, lambda p=picture: render_svg(p))
        seconds_html, html = best_seconds(args.repeat, lambda p=picture: render_html([p], "b"))
        total = seconds_layout + seconds_svg + seconds_html
        base = base or total
        print(
            f"{len(picture.boxes):6d} calls {len(picture.lanes):4d} lanes: "
            f"layout {seconds_layout * 1e3:7.1f} ms  svg {seconds_svg * 1e3:7.1f} ms "
            f"({len(svg) / 1e6:5.2f} MB)  html {seconds_html * 1e3:7.1f} ms "
            f"({len(html) / 1e6:5.2f} MB)  time x{total / base:4.2f} for calls x{scale}"
        )


if __name__ == "__main__":
    main()
