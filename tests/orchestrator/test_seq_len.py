"""`train.seq_len` bounds a micro-batch where the batching has one (packed rows, tree scope
`step`): a longer row stops the run with one line naming the row, its length and the setting,
exit 1, with nothing lost: the step's episodes are kept as unused, the checkpoint is the step
before, and the run continues once `train.seq_len` is raised."""

from __future__ import annotations

import pytest

from callgrove.episode import load
from callgrove.orchestrator import sinks

from .test_trust import cli, tiny, write


@pytest.mark.parametrize("batching", [{"train__batching": "packed"}, {"train__tree_scope": "step"}])
def test_a_row_longer_than_seq_len_is_one_line_and_loses_nothing(tmp_path, batching):
    out = tmp_path / "run"
    config = write(tmp_path, tiny(out, train__seq_len=8, **batching))
    code, output = cli([config])
    line = " ".join(output.split())
    assert code == 1 and "Traceback" not in output, output
    assert "error: step 1: episode " in line and "longer than train.seq_len 8" in line, line
    assert "set train.seq_len to at least" in line and "checkpoint is of step 0" in line, line
    assert sinks.load_checkpoint(out)["progress"]["step"] == 0
    assert not (out / "step_1").exists()
    unused = list(load(out / "unused" / "train" / "traces.jsonl"))
    assert sum(e.run is not None and e.run.step == 1 for e in unused) >= 4  # the step's groups
    code, output = cli([config, "--set", "train.seq_len=4096"])
    assert code == 0, output
    assert sinks.load_checkpoint(out)["progress"]["step"] == 2


def test_tree_scopes_without_a_micro_batch_bound_train_rows_of_any_length(tmp_path):
    code, output = cli([write(tmp_path, tiny(tmp_path / "run", train__seq_len=8))])
    assert code == 0, output
