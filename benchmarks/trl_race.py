"""callgrove's RL step against TRL's `GRPOTrainer` on the same model, task and settings
(the race of `callgrove.bench.race`, whose docstring says how each trainer is set; `callgrove
race` runs the same).

    python benchmarks/trl_race.py [--seeds 0 1] [--steps 3] [--group-size 4]
        [--groups-per-step 2] [--max-tokens 12] [--temperature 0.7] [--lr 2e-4] [--threads 1]
        [--off-policy-steps 0] [--sampler hf|vllm] [--vllm-python PATH] [--out DIR]
        [--results FILE]

`--results FILE` also keeps the figures (settings, versions, load average, the runs) as JSON,
as `benchmarks/results/trl_race.json` is kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from callgrove.bench.race import (
    SETTING_HELP,
    TARGETS,
    RaceSettings,
    race_folder,
    race_lines,
    run_race,
)


def main() -> None:
    defaults = RaceSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=list(defaults.seeds), help=SETTING_HELP["seeds"]
    )
    for field in dataclasses.fields(RaceSettings):
        if field.name != "seeds":
            parser.add_argument(
                "--" + field.name.replace("_", "-"),
                type=type(field.default),
                default=field.default,
                choices=list(TARGETS) if field.name == "sampler" else None,
                help=SETTING_HELP[field.name],
            )
    parser.add_argument("--out", type=Path, help="keep the runs and figures.json here")
    parser.add_argument("--results", type=Path, help="also write the figures' JSON to FILE")
    args = parser.parse_args()
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(RaceSettings)}
    settings = RaceSettings(**{**options, "seeds": tuple(args.seeds)})
    race = run_race(settings, race_folder(args.out), say=lambda line: print(line, flush=True))
    if args.results:
        args.results.write_text(json.dumps(race, indent=1) + "\n")
    for line in race_lines(race):
        print(line)


if __name__ == "__main__":
    main()
