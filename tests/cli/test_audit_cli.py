"""`callgrove audit CAPTURE BATCH` on every batch form the adapters write: callgrove's own
samples pass (exit 0); a batch that trains forks' histories again, or summaries after their
compaction, fails (exit 1) naming the calls and rows; a batch it cannot read is an error
naming the file."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import torch
from typer.testing import CliRunner

from callgrove.batch import build_samples, fill_unknown_sampling, write_samples
from callgrove.cli import app
from callgrove.episode import write_episodes
from callgrove.interop.nemo_rl import write_nemo_rl
from callgrove.interop.openrlhf import openrlhf_arrays
from callgrove.interop.prime_rl import write_prime_rl
from callgrove.interop.verl import verl_arrays
from callgrove.rows import build_rows
from callgrove.synth.cases import HARD_CASES

runner = CliRunner()


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """Every hard case credited, as one episode file, and callgrove's samples of them."""
    folder = tmp_path_factory.mktemp("audit")
    episodes = [HARD_CASES[name](number) for number, name in enumerate(HARD_CASES)]
    for episode in episodes:
        for call in episode.calls():
            call.advantages = 1.0
    write_episodes(folder / "capture.jsonl", episodes)
    samples = [s for s in build_samples([build_rows(e) for e in episodes]) if s.num_loss_tokens]
    fill_unknown_sampling(samples, 1.0, 1.0)
    return folder, episodes, samples


def write_batch(folder, samples, form):
    if form == "samples":
        path = folder / "samples.parquet"
        write_samples(path, samples)
    elif form == "prime-rl":
        path = folder / "samples.msgpack"
        write_prime_rl(path, samples, "cases")
    elif form == "nemo-rl":
        path = folder / "nemo.pt"
        write_nemo_rl(path, samples)
    elif form == "verl":
        path = folder / "verl.pt"
        tensors, _, _ = verl_arrays(samples, 0)
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)
    elif form == "openrlhf":
        path = folder / "openrlhf.npz"
        np.savez(path, **openrlhf_arrays(samples, 0)[0])
    else:
        from callgrove.interop.trl import trl_batch

        path = folder / "trl.pt"
        torch.save(trl_batch(samples, 0), path)
    return path


@pytest.mark.parametrize("form", ["samples", "prime-rl", "nemo-rl", "verl", "openrlhf", "trl"])
def test_callgrove_batches_pass_in_every_form(capture, form):
    folder, _, samples = capture
    batch = write_batch(folder, samples, form)
    result = runner.invoke(app, ["audit", str(folder / "capture.jsonl"), str(batch), "--json"])
    assert result.exit_code == 0, result.output
    record = orjson.loads(result.stdout)
    total = record["total"]
    assert record["batch_form"] == form
    assert total["exact"] and total["trained_2_or_more"] == 0 and total["wrong_context"] == 0
    assert total["trained_0"] == total["twin_untrained"] > 0  # the twins' copies
    assert total["trained_1"] + total["trained_0"] == total["sampled_tokens"]


def test_a_batch_training_every_token_fails_naming_calls_and_rows(capture):
    folder, episodes, _ = capture
    path = folder / "everything.npz"
    rows = [e.full_ids(c) for e in episodes for c in e.kept_calls()]
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    np.savez(path, input_ids=ids, input_lengths=mask.sum(1).astype(np.int32), token_mask=mask)
    result = runner.invoke(app, ["audit", str(folder / "capture.jsonl"), str(path)])
    assert result.exit_code == 1
    assert "trained twice: episode fork, call L.0 (leader)" in result.output
    assert "wrong context: episode two-compactions, call L.2 (leader)" in result.output
    assert "not sampled:" in result.output and "NOT exact" in result.output


def test_output_file_holds_the_json_report(capture, tmp_path):
    folder, _, samples = capture
    batch = write_batch(folder, samples, "samples")
    report = tmp_path / "audit.json"
    result = runner.invoke(
        app, ["audit", str(folder / "capture.jsonl"), str(batch), "-o", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert "exact: no sampled token trains twice" in result.output
    calls = orjson.loads(report.read_bytes())["calls"]
    assert {c["state"] for c in calls} == {"train", "not kept"}


def test_unreadable_batches_are_errors_naming_the_file(capture, tmp_path):
    folder, _, _ = capture
    capture_file = str(folder / "capture.jsonl")
    unknown = tmp_path / "other.npz"
    np.savez(unknown, logits=np.zeros(3))
    result = runner.invoke(app, ["audit", capture_file, str(unknown)])
    assert result.exit_code == 2
    assert f"{unknown}: its tensors (logits) are none of the batch layouts" in result.output
    broken = tmp_path / "broken.msgpack"
    broken.write_bytes(b"\x01\x02")
    result = runner.invoke(app, ["audit", capture_file, str(broken)])
    assert (
        result.exit_code == 2
        and f"{broken}: not a list of prime-rl TrainingSamples" in result.output
    )
    result = runner.invoke(app, ["audit", capture_file, str(tmp_path / "batch.bin")])
    assert result.exit_code == 2 and "a batch ends in" in result.output
    result = runner.invoke(app, ["audit", capture_file])
    assert (
        result.exit_code == 2 and "the capture (one or more paths), then the batch" in result.output
    )


def test_a_stacks_rows_of_the_capture_are_refereed(capture):
    folder, _, _ = capture
    capture_file = str(folder / "capture.jsonl")
    result = runner.invoke(app, ["audit", capture_file, "--stack", "prime-rl-before-2975"])
    assert result.exit_code == 1
    assert "trained twice: episode fork, call L.0 (leader)" in result.output
    result = runner.invoke(app, ["audit", capture_file, "--stack", "prime-rl-3478", "--json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["batch"] == "prime-rl + #3478's rows"
    result = runner.invoke(app, ["audit", capture_file, "--stack", "nobody"])
    assert result.exit_code == 2 and "--stack 'nobody': one of callgrove, prime-rl" in result.output
