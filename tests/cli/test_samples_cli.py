"""`callgrove samples` as a user runs it: the files it writes read back as `build_samples`
made them, and input it cannot credit is an error or skipped and counted, never `null`
advantages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.batch import TOKEN_FIELDS, fill_unknown_sampling, read_samples
from callgrove.batch.samples import METADATA_FIELDS
from callgrove.cli import app
from callgrove.formats.problems import InputError
from callgrove.synth import Shape, synth_episode

EXAMPLES = Path(__file__).parents[2] / "examples"
GROUP = EXAMPLES / "login_group.jsonl"
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def summary(result) -> dict:
    return json.loads(result.stdout.splitlines()[-1])


def expected_samples(algorithm: cg.Algorithm, path: Path = GROUP) -> list[cg.Sample]:
    episodes = list(cg.load(path))
    cg.finalize_group(algorithm, episodes)
    made = cg.build_samples([cg.build_rows(e) for e in episodes if e.ok])
    return [sample for sample in made if sample.num_loss_tokens]  # the rest is not written


def assert_same(actual: list[cg.Sample], expected: list[cg.Sample]) -> None:
    assert len(actual) == len(expected) > 0
    for a, e in zip(actual, expected, strict=True):
        for name in METADATA_FIELDS:
            assert getattr(a, name) == getattr(e, name), name
        for name in TOKEN_FIELDS:
            left, right = getattr(a, name), getattr(e, name)
            assert left.dtype == right.dtype, name
            np.testing.assert_array_equal(left, right, err_msg=name)  # NaN equals NaN here


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_samples_read_back_as_build_samples_made_them(tmp_path, suffix):
    out = tmp_path / f"s{suffix}"
    result = run("samples", GROUP, "-o", out, "--algorithm", "grpo")
    assert result.exit_code == 0, result.output
    back = read_samples(out)
    assert_same(back, expected_samples(cg.GRPO()))
    # the login group records no sampling: its completions' temperatures are unknown (NaN)
    trained = np.concatenate([s.temperatures[s.loss_mask == 1] for s in back])
    assert trained.size and np.isnan(trained).all()
    assert all(s.advantages is not None for s in back)


def test_parquet_has_every_per_token_column_and_the_ids(tmp_path):
    out = tmp_path / "s.parquet"
    assert run("samples", GROUP, "-o", out, "--algorithm", "grpo").exit_code == 0
    columns = set(pq.read_schema(out).names)
    assert set(TOKEN_FIELDS) | {"episode", "group", "agent", "seat", "row"} <= columns
    assert {"temperatures", "top_p", "top_k", "policy_versions", "position_ids"} <= columns


def test_algorithm_settings_reach_the_algorithm(tmp_path):
    out = tmp_path / "s.jsonl"
    args = ("--algorithm", "hierarchical_grpo", "--local-seat", "helper", "--scale-by-std")
    result = run("samples", GROUP, "-o", out, *args, "--json")
    assert result.exit_code == 0, result.output
    expected = expected_samples(cg.HierarchicalGRPO(frozenset({"helper"}), scale_by_std=True))
    assert_same(read_samples(out), expected)
    assert not np.array_equal(  # the settings change the advantages: the test can tell
        np.concatenate([s.advantages for s in expected]),
        np.concatenate([s.advantages for s in expected_samples(cg.GRPO())]),
    )
    record = summary(result)
    assert (record["algorithm"], record["groups_scored"], record["samples"]) == (
        "hierarchical_grpo",
        1,
        len(expected),
    )


def test_unscored_episodes_are_an_error_naming_file_line_and_episode(tmp_path):
    out = tmp_path / "s.parquet"
    result = run("samples", GROUP, "-o", out, "--json")
    assert result.exit_code == 1
    for line, episode in enumerate(["login-bug-g0", "login-bug-g1", "login-bug-g2"], start=1):
        assert f"{GROUP}:{line}: episode {episode}: " in result.stderr
    assert "--algorithm" in result.stderr
    assert summary(result)["samples"] == 0
    assert not out.exists()  # nothing with null advantages was written, not even an empty file
    out.write_bytes(b"a good file of an earlier run")
    assert run("samples", GROUP, "-o", out).exit_code == 1
    assert out.read_bytes() == b"a good file of an earlier run"  # a failed rerun keeps it


def test_recorded_advantages_are_used_without_an_algorithm(tmp_path):
    episodes = list(cg.load(GROUP))
    cg.finalize_group(cg.EMABaseline(decay=0.5), episodes)
    credited = tmp_path / "credited.parquet"
    cg.save(credited, episodes)
    out = tmp_path / "s.arrow"
    result = run("samples", credited, "-o", out)
    assert result.exit_code == 0, result.output
    assert_same(read_samples(out), expected_samples(cg.EMABaseline(decay=0.5)))


def _with_changes(tmp_path: Path, change) -> Path:
    lines = [json.loads(line) for line in GROUP.read_text().splitlines()]
    change(lines)
    path = tmp_path / "changed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_failed_episodes_are_skipped_and_counted(tmp_path):
    def fail_second(lines):
        lines[1]["ok"] = False
        lines[1]["errors"] = [{"type": "timeout", "message": "ran out of time"}]

    path = _with_changes(tmp_path, fail_second)
    out = tmp_path / "s.jsonl"
    result = run("samples", path, "-o", out, "--algorithm", "grpo", "--json")
    assert result.exit_code == 0, result.output
    record = summary(result)
    assert record["skipped"] == {"failed (ok false): no credit": 1}
    assert (record["episodes_read"], record["episodes_sampled"]) == (4, 3)
    back = read_samples(out)
    assert_same(back, expected_samples(cg.GRPO(), path))
    assert "login-bug-g1" not in {s.episode for s in back}
    table = run("samples", path, "-o", out, "--algorithm", "grpo")
    assert "skipped: failed (ok false): no credit" in table.stderr
    assert table.stdout == ""  # the summary goes to stderr, as every command's


def test_a_group_with_an_unrewarded_episode_is_not_scored_and_named(tmp_path):
    def unreward_third(lines):
        lines[2]["rewards"] = {}

    path = _with_changes(tmp_path, unreward_third)
    out = tmp_path / "s.parquet"
    result = run("samples", path, "-o", out, "--algorithm", "grpo", "--json")
    assert result.exit_code == 1
    assert f"{path}:3: episode login-bug-g2: no reward to score it by" in result.stderr
    assert summary(result)["skipped"] == {"in a group that was not scored": 4}
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decay", "0.5"], "--decay goes with --algorithm"),
        (["--algorithm", "ema", "--scope", "seat"], "--scope is not a setting of"),
        (["--algorithm", "grpo", "--local-seat", "helper"], "--local-seat is not a setting"),
        (["--algorithm", "ema", "--decay", "1.5"], "decay must be"),
        (["--algorithm", "nope"], "nope"),
    ],
)
def test_algorithm_settings_that_would_do_nothing_or_are_wrong_are_usage_errors(
    tmp_path, args, message
):
    out = tmp_path / "s.parquet"
    result = run("samples", GROUP, "-o", out, *args)
    assert result.exit_code == 2 and message in result.output
    assert not out.exists()


def test_an_output_of_no_known_form_is_a_usage_error(tmp_path):
    result = run("samples", GROUP, "-o", tmp_path / "s.csv", "--algorithm", "grpo")
    assert result.exit_code == 2 and ".parquet, .arrow, .jsonl" in result.output


def test_a_bad_jsonl_sample_is_named_by_file_and_line(tmp_path):
    out = tmp_path / "s.jsonl"
    assert run("samples", GROUP, "-o", out, "--algorithm", "grpo").exit_code == 0
    lines = out.read_text().splitlines()
    record = json.loads(lines[1])
    record["token_ids"][0] = 1.5  # not an integer: never truncated
    out.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(InputError, match=rf"{out}:2: not a sample: .*token_ids"):
        read_samples(out)
    record["token_ids"][0] = 7  # integers again
    record["loss_mask"] = record["loss_mask"][1:]  # one short
    out.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    with pytest.raises(InputError, match=rf"{out}:2: episode {record['episode']}: .*lengths"):
        read_samples(out)


def test_rows_jsonl_has_the_group_column_of_the_parquet_rows(tmp_path):
    result = run("rows", GROUP, "--json")
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    out = tmp_path / "rows.parquet"
    assert run("rows", GROUP, "-o", out).exit_code == 0
    assert [r["group"] for r in records] == pq.read_table(out).column("group").to_pylist()


def _synthetic_group(tmp_path: Path) -> Path:
    """Episodes with twins (whose duplicate rows train nothing), forks, background agents and
    compaction, as a file."""
    shape = Shape(leader_calls=6, forks=1, fork_depth=2, subagent_calls=3, context=96)
    path = tmp_path / "synthetic.jsonl"
    cg.save(path, [synth_episode(shape, seed) for seed in range(4)])
    return path


def test_rows_that_train_nothing_are_counted_not_written_and_every_sample_reaches_a_trainer(
    tmp_path,
):
    from callgrove.interop.prime_rl import prime_rl_samples

    path = _synthetic_group(tmp_path)
    episodes = list(cg.load(path))
    cg.finalize_group(cg.GRPO(), episodes)
    every_row = cg.build_samples([cg.build_rows(e) for e in episodes])
    built = [s for s in every_row if s.num_loss_tokens]
    untrained = len(every_row) - len(built)
    assert untrained > 0  # the twins' duplicate rows: the test can tell
    for suffix in (".parquet", ".arrow", ".jsonl"):
        out = tmp_path / f"s{suffix}"
        result = run("samples", path, "-o", out, "--algorithm", "grpo", "--json")
        assert result.exit_code == 0, result.output
        record = summary(result)
        assert (record["samples"], record["untrained_rows"]) == (len(built), untrained)
        back = read_samples(out)
        assert_same(back, built)
        # Read-only columns (Parquet, Arrow) take the run's sampling all the same.
        assert fill_unknown_sampling(back, 0.7, 1.0) > 0
        assert not np.isnan(np.concatenate([s.temperatures for s in back])).any()
        assert len(prime_rl_samples(back, "synthetic")) == len(back)  # none refused


@pytest.mark.parametrize("kind", ["rows", "episodes", "folder"])
def test_a_parquet_file_that_holds_no_samples_is_refused_by_name(tmp_path, kind):
    path = tmp_path / "x.parquet"
    if kind == "rows":
        assert run("rows", GROUP, "-o", path).exit_code == 0
    elif kind == "episodes":
        cg.save(path, list(cg.load(GROUP)))
    else:
        path.mkdir()
    with pytest.raises(InputError, match="not a samples file") as refused:
        read_samples(path)
    assert str(path) in str(refused.value)


@pytest.mark.parametrize("algorithm", [["--algorithm", "grpo"], []])
def test_episodes_the_loop_dropped_as_stale_are_skipped_and_counted(tmp_path, algorithm):
    episodes = list(cg.load(GROUP))
    cg.finalize_group(cg.GRPO(), episodes)
    for episode in episodes:
        episode.meta = {**(episode.meta or {}), "dropped": "stale"}
    path = tmp_path / "traces.jsonl"
    cg.save(path, episodes)
    out = tmp_path / "s.jsonl"
    result = run("samples", path, "-o", out, "--json", *algorithm)
    assert result.exit_code == 0, result.output
    record = summary(result)
    assert record["samples"] == 0
    assert record["skipped"] == {"dropped by the training loop as stale (never trained there)": 4}


def test_an_episode_id_read_twice_is_an_error_and_trains_once(tmp_path):
    out = tmp_path / "s.jsonl"
    result = run("samples", GROUP, GROUP, "-o", out, "--algorithm", "grpo", "--json")
    assert result.exit_code == 1
    assert f"{GROUP}:1: episode login-bug-g0: episode id already read at {GROUP}:1" in (
        result.stderr.replace("\n", "")
    )
    record = summary(result)
    assert record["errors"] == 4
    assert_same(read_samples(out), expected_samples(cg.GRPO()))  # each episode once
