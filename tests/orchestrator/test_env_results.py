"""What an environment hands the loop outside its episodes is checked where it is handed: a
task that its episodes could not record (not JSON) stops the run with one line naming the
environment and the group, before any step; a name that is not text is refused at the start
(every episode records it, and a reader refused the files written with it)."""

from __future__ import annotations

import numpy as np
import pytest

from callgrove.orchestrator.config import ConfigError
from callgrove.orchestrator.envs import Copy
from callgrove.orchestrator.errors import RunError

from .test_trust import run_within, tiny

HERE = __name__


class ArrayTasks(Copy):
    def task(self, rng):
        return np.arange(3)


class ObjectEvalTasks(Copy):
    def eval_tasks(self):
        return ["12", object()]


class NumberedName(Copy):
    name = 123


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("ArrayTasks", r"task\(\) of group 0 returned a task that is not JSON"),
        ("ObjectEvalTasks", r"eval_tasks\(\) returned a task that is not JSON"),
    ],
)
def test_a_task_that_is_not_json_stops_the_run_before_any_step(tmp_path, env, message):
    with pytest.raises(RunError, match=message):
        run_within(tiny(tmp_path, env__name=f"{HERE}:{env}", run__eval_every=1), seconds=60)
    assert not (tmp_path / "step_1").exists()


def test_an_environment_named_by_no_text_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"its name is 123, not a non-empty string"):
        run_within(tiny(tmp_path, env__name=f"{HERE}:NumberedName"), seconds=60)
