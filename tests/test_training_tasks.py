"""Which tasks a run trains on: the demonstrations, a task file, or both (`data.with_demo_tasks`)."""

import pytest

from rl.config import apply_overrides
from rl.demonstrations import DEMOS
from rl.recipes import smoke_cpu
from rl.stages import training_tasks


def test_demos_alone_are_the_demonstration_tasks():
    cfg = apply_overrides(smoke_cpu(), ['data.demo_names=["l1_47_sum_dim", "l1_19_relu"]', "data.demos=2"])
    assert sorted(t.task_id for t in training_tasks(cfg)) == ["l1_19_relu", "l1_47_sum_dim"]


def test_a_task_file_with_demo_tasks_puts_the_demonstrations_first(tmp_path):
    (tmp_path / "softmax.py").write_text((DEMOS / "l1_23_softmax" / "model.py").read_text())
    base = [f"data.tasks={tmp_path}", 'data.demo_names=["l1_1_matmul_cublas"]', "data.demos=1"]
    alone = training_tasks(apply_overrides(smoke_cpu(), base))
    both = training_tasks(apply_overrides(smoke_cpu(), [*base, "data.with_demo_tasks=true"]))
    assert len(alone) == 1 and alone[0].task_id != "l1_1_matmul_cublas"
    assert [t.task_id for t in both] == ["l1_1_matmul_cublas", alone[0].task_id]


def test_a_task_file_without_usable_tasks_stops_the_run(tmp_path):
    (tmp_path / "broken.py").write_text("class Model:\n    pass\n")  # no get_inputs
    with pytest.raises(SystemExit, match="no usable tasks"):
        training_tasks(apply_overrides(smoke_cpu(), [f"data.tasks={tmp_path}"]))
