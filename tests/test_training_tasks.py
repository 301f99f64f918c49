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


class _Renderer:
    stop_token_ids = [0]


class _RecordingRun:
    """What a collection asks the orchestrator for: (tag, task ids) per rollouts call."""

    renderer = _Renderer()

    def __init__(self, cfg):
        self.cfg = cfg
        self.calls: list[tuple[str, list[str]]] = []

    scorer = None

    def untimed_scorer(self):
        return self.scorer

    async def rollouts(self, items, *, tag, **_):
        self.calls.append((tag, sorted(i.task.task_id for i in items)))
        return []


@pytest.mark.parametrize("policy", [True, False])
async def test_rft_collection_rolls_out_the_policy_unless_demonstrations_suffice(tmp_path, policy):
    from rl.stages import collect_trajectories

    (tmp_path / "softmax.py").write_text((DEMOS / "l1_23_softmax" / "model.py").read_text())
    cfg = apply_overrides(smoke_cpu(), [f"data.tasks={tmp_path}", 'data.demo_names=["l1_1_matmul_cublas"]',
                                        "data.demos=1", "data.with_demo_tasks=true",
                                        f"data.rft_policy_rollouts={str(policy).lower()}"])
    run = _RecordingRun(cfg)
    tasks = training_tasks(cfg)
    await collect_trajectories(run, tasks, "rft")
    await collect_trajectories(run, tasks, "value")  # the value collection always rolls out the policy
    policy_call = ("rft_collect", sorted(t.task_id for t in tasks))
    assert run.calls == [("rft_demos", ["l1_1_matmul_cublas"])] + [policy_call] * policy + [
        ("value_collect", policy_call[1])]


def test_a_collection_serves_each_epoch_in_its_own_seeded_order():
    """Collected in task order, consecutive samples are one family's: batches mix them, every
    sample once per epoch, the same batches for the same k (a resumed stage), other seeds differ."""
    from rl.samples import Sample
    from rl.stages import Collection

    samples = [Sample(sample_id=f"s{i}", group_id=f"g{i // 4}", token_ids=[1, 2], action_mask=[0, 1],
                      behaviour_logprobs=[0.0, -1.0], reward=1.0, weight_version=0) for i in range(12)]
    c = Collection(samples, {}, batch_size=4, seed=0)
    epoch = [s.sample_id for k in range(3) for s in c.batch(k)]
    assert sorted(epoch) == sorted(s.sample_id for s in samples)  # each once per epoch
    assert epoch != [s.sample_id for s in samples]  # not in collection order
    assert len({s.group_id for s in c.batch(0)}) > 1  # one batch spans several tasks
    assert [s.sample_id for s in c.batch(5)] == [s.sample_id for s in Collection(samples, {}, 4, seed=0).batch(5)]
    assert [s.sample_id for s in c.batch(3)] != [s.sample_id for s in c.batch(0)]  # the next epoch reorders
    other = [s.sample_id for k in range(3) for s in Collection(samples, {}, 4, seed=1).batch(k)]
    assert other != epoch
