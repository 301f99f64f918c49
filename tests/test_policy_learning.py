"""The policy-learning benchmark (bench.system.policy_learning): its arithmetic and verdicts, the
control's configuration, and one whole seed of its plumbing on the CPU (tiny model, fake kernel
environment: the numbers mean nothing there, the files and rows must all be there)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import msgspec
import orjson
import pytest

from bench.system.policy_learning import (
    CPU_FAMILIES,
    SeedResult,
    changed_tasks,
    control_rows,
    heldout_new,
    learner_memory,
    main_policy,
    main_report,
    markdown,
    mean_se,
    passes_by_new,
    ppo_steps,
    seed_configs,
    share_demonstrations,
    verdicts,
)
from rl.config import apply_overrides, load_config
from rl.data import families
from rl.heldout import Row, append_row, read_rows
from rl.recipes import learning, smoke, smoke_cpu
from rl.stages import demonstrations


def _row(label: str, reward: float | None, pass_rate: float) -> Row:
    return Row(label=label, weight_version=0, tasks=17, trajectories=17, pass_rate=pass_rate, reward_mean=reward,
               faster_than_eager_rate=0.0, scored=17.0, parse_error_rate=0.0, turns_mean=4.0, by_task={})


def _seed(seed: int, rft_pass: float, ppo: float, control: float) -> SeedResult:
    return SeedResult(seed=seed, wall_s=1.0,
                      ppo={"before_rft": _row("before_rft", -1.0, 0.0), "after_rft": _row("after_rft", 0.0, rft_pass),
                           "after_ppo": _row("after_ppo", ppo, 0.5)},
                      control={"after_ppo": _row("after_ppo", control, 0.4)})


def test_mean_and_standard_error():
    assert all(math.isnan(x) for x in mean_se([]))
    assert mean_se([2.0]) == (2.0, 0.0)
    mean, se = mean_se([1.0, 2.0, 3.0])
    assert mean == 2.0 and math.isclose(se, 1.0 / math.sqrt(3))


def test_ppo_must_beat_the_control_by_more_than_two_standard_errors():
    clear = verdicts([_seed(0, 0.4, 0.5, 0.1), _seed(1, 0.35, 0.6, 0.1), _seed(2, 0.3, 0.55, 0.1)])
    assert clear["ppo_beats_control"] and clear["pass_target_met"]
    noisy = verdicts([_seed(0, 0.4, 0.5, 0.1), _seed(1, 0.4, -0.2, 0.1), _seed(2, 0.4, 0.3, 0.1)])
    assert not noisy["ppo_beats_control"]
    one = verdicts([_seed(0, 0.1, 0.9, 0.1)])  # one seed has no standard error: never a verdict of "beats"
    assert not one["ppo_beats_control"] and not one["pass_target_met"]


def test_an_evaluation_with_nothing_scored_counts_as_failed():
    v = verdicts([_seed(0, 0.3, None, -1.0), _seed(1, 0.3, None, -1.0)])  # type: ignore[arg-type]
    assert v["ppo_minus_control_mean"] == 0.0 and not v["ppo_beats_control"]


def test_the_report_names_both_targets_met_or_not():
    results = [_seed(0, 0.1, 0.2, 0.1), _seed(1, 0.1, 0.1, 0.2)]
    text = markdown(results, "smollm2-135m", verdicts(results))
    assert "| 0 |" in text and "| 1 |" in text
    assert text.count("NOT met") == 2


def test_the_report_counts_the_tasks_ppo_moved_either_way():
    def row(by_task: dict[str, list[float | None]]) -> Row:
        return Row(label="after_ppo", weight_version=0, tasks=3, trajectories=3, pass_rate=0.0, reward_mean=0.0,
                   faster_than_eager_rate=0.0, scored=3.0, parse_error_rate=0.0, turns_mean=4.0, by_task=by_task)

    ppo = row({"a": [1.0], "b": [-1.0], "c": [2.0], "d": [None]})
    control = row({"a": [-1.0], "b": [1.0], "c": [2.0], "d": [-1.0]})
    assert changed_tasks(ppo, control) == (1, 1, 4)  # a up, b down; c the same; unscored d is a failure
    result = SeedResult(seed=0, wall_s=1.0, ppo={"after_ppo": ppo}, control={"after_ppo": control})
    assert "| 1 / 1 of 4 |" in markdown([result], "smollm2-135m", verdicts([result]))


def test_the_report_splits_held_out_passes_by_what_is_new_and_counts_ppos_room(tmp_path):
    def row(label: str, by_task: dict[str, list[float | None]]) -> Row:
        return Row(label=label, weight_version=0, tasks=4, trajectories=4, pass_rate=0.0, reward_mean=0.0,
                   faster_than_eager_rate=0.0, scored=4.0, parse_error_rate=0.0, turns_mean=4.0, by_task=by_task)

    new = {"relu_s3": "shape", "chain": "chain", "mish": "op", "selu": "op"}
    rft = row("after_rft", {"relu_s3": [2.0], "chain": [-1.0], "mish": [-1.0], "selu": [None]})
    ppo = row("after_ppo", {"relu_s3": [1.0], "chain": [1.0], "mish": [-1.0], "selu": [1.0]})
    assert passes_by_new(rft, new) == {"trained ops": (1, 2), "new op": (0, 2)}
    assert passes_by_new(ppo, new) == {"trained ops": (2, 2), "new op": (1, 2)}
    result = SeedResult(seed=0, wall_s=1.0, ppo={"after_rft": rft, "after_ppo": ppo},
                        control={"after_ppo": msgspec.structs.replace(rft, label="after_ppo")}, heldout_new=new)
    text = markdown([result], "smollm2-135m", verdicts([result]))
    assert "| 0 | 1 / 2 | 0 / 2 | 2 / 2 | 1 / 2 | 1 / 2 | 0 / 2 | 1 of 2 |" in text
    assert "room" not in markdown([msgspec.structs.replace(result, heldout_new={})], "m", verdicts([result]))


def test_a_seed_reads_what_is_new_in_each_held_out_task_from_its_split(tmp_path):
    split = families.split(scale=0.01)
    families.write_manifest(tmp_path, split)
    new = heldout_new(tmp_path)
    assert set(new) == {t.task_id for t in split.heldout}
    assert set(new.values()) <= {"shape", "chain", "op"} and "op" in new.values()
    (tmp_path / "families_split.json").write_text("{torn")
    assert heldout_new(tmp_path) == {} and heldout_new(tmp_path / "missing") == {}


def test_the_control_evaluates_the_runs_post_value_actor_again_without_steps_that_cannot_move_it(tmp_path):
    ppo, control = seed_configs(smoke(), tmp_path, 2, ["steps.ppo=4"])
    assert ppo.stage == "smoke" and control.stage == "ppo"
    assert control.optim.actor_lr == 0.0 and ppo.optim.actor_lr > 0
    assert control.optim.critic_lr == ppo.optim.critic_lr
    assert control.init_from == str(tmp_path / "seed2" / "ppo" / "ckpt" / f"step_{ppo.steps.rft + ppo.steps.value:06d}")
    assert ppo.steps.ppo == 4 and control.steps.ppo == 0
    assert ppo.rollout.seed == control.rollout.seed == 2000 and ppo.data.seed == 2
    assert ppo.checkpoint.keep >= 3  # the post-value checkpoint outlives the PPO run's own


def test_the_control_takes_the_post_rft_row_only_when_that_evaluation_was_greedy(tmp_path):
    ppo, _ = seed_configs(smoke(), tmp_path, 1, [])
    assert control_rows(ppo) == []  # no after_rft row yet
    Path(ppo.run_dir).mkdir(parents=True)
    append_row(ppo.run_dir, _row("before_rft", -1.0, 0.0))
    after_rft = _row("after_rft", 0.25, 0.5)
    append_row(ppo.run_dir, after_rft)
    rows = control_rows(ppo)
    assert [r.label for r in rows] == ["before_ppo", "after_ppo"]
    assert all(r.reward_mean == 0.25 and r.pass_rate == 0.5 and r.shared_from == ppo.run_dir for r in rows)
    sampled, _ = seed_configs(smoke(), tmp_path, 1, ["data.heldout_temperature=0.7"])
    assert control_rows(sampled) == []  # a sampled evaluation draws anew: the control run evaluates again


def test_the_learning_recipe_fine_tunes_on_every_teacher_but_ppos_shape():
    cfg = learning()
    train = families.split_for(cfg.data).train
    taught = {d.task.task_id for d in demonstrations(cfg)}
    assert cfg.data.ppo_shapes == (1,)
    assert taught == {t.task_id for t in train if t.metadata["shape"] != 1}
    assert cfg.steps.rft * cfg.data.tasks_per_step * cfg.data.samples_per_task >= 10 * len(taught)


def test_a_seed_copies_the_finished_demonstrations_of_another_seed_with_the_same_teachers(tmp_path):
    ppo0, ppo1 = (seed_configs(learning(), tmp_path, k, [])[0] for k in (0, 1))
    ids = [d.task.task_id for d in demonstrations(ppo0)]
    src = Path(ppo0.run_dir) / "rollouts" / "rft_demos.jsonl"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"".join(orjson.dumps({"group_id": i}) + b"\n" for i in ids[:-1]))
    assert share_demonstrations(ppo1, tmp_path) is None  # seed 0's collection has not finished
    src.write_bytes(b"".join(orjson.dumps({"group_id": i}) + b"\n" for i in ids))
    assert share_demonstrations(ppo1, tmp_path) == src
    assert (Path(ppo1.run_dir) / "rollouts" / "rft_demos.jsonl").read_bytes() == src.read_bytes()
    assert share_demonstrations(ppo1, tmp_path) is None  # it has its own now
    few = seed_configs(apply_overrides(smoke(), ["data.demos=16"]), tmp_path, 2, [])[0]  # drawn by the seed
    assert share_demonstrations(few, tmp_path) is None


def test_later_lanes_wait_for_seed_0s_whole_teacher_collection_and_first_row(tmp_path):
    from bench.system.policy_learning import DEMOS_FILE, shared_parts_ready
    from rl.heldout import Row, append_row

    base = learning()
    ppo0 = seed_configs(base, tmp_path, 0, [])[0]
    assert not shared_parts_ready(base, tmp_path, [], 1)
    demos = Path(ppo0.run_dir) / DEMOS_FILE
    demos.parent.mkdir(parents=True)
    ids = [d.task.task_id for d in demonstrations(ppo0)]
    demos.write_bytes(b"".join(orjson.dumps({"group_id": i}) + b"\n" for i in ids[:-1]))
    row = Row(label="before_rft", weight_version=0, tasks=17, trajectories=17, pass_rate=0.0, reward_mean=-1.0,
              faster_than_eager_rate=0.0, scored=17.0, parse_error_rate=1.0, turns_mean=4.0, by_task={},
              max_turns=4, max_new_tokens=2048, max_context_tokens=8192, temperature=0.0, seconds=171.0)
    append_row(Path(ppo0.run_dir), row)
    assert not shared_parts_ready(base, tmp_path, [], 1)  # one teacher short
    demos.write_bytes(b"".join(orjson.dumps({"group_id": i}) + b"\n" for i in ids))
    assert shared_parts_ready(base, tmp_path, [], 1)
    (Path(ppo0.run_dir) / "heldout.jsonl").unlink()
    assert not shared_parts_ready(base, tmp_path, [], 1)  # no first row yet
    # a seed that draws other teachers and evaluates its own first row waits for nothing
    few_random = apply_overrides(base, ["data.demos=16", 'model.path=""', "model.hf_config={}"])
    assert shared_parts_ready(few_random, tmp_path / "other", [], 1)


def test_seeds_after_the_first_share_its_greedy_evaluation_of_the_pretrained_policy(tmp_path):
    from bench.system.policy_learning import shared_base_row
    from rl.heldout import Row, append_row

    ppo0, ppo1 = (seed_configs(learning(), tmp_path, k, [])[0] for k in (0, 1))
    assert shared_base_row(ppo1, tmp_path) is None  # nothing evaluated yet
    r = ppo0.rollout
    row = Row(label="before_rft", weight_version=0, tasks=17, trajectories=17, pass_rate=0.0, reward_mean=-1.0,
              faster_than_eager_rate=0.0, scored=17.0, parse_error_rate=1.0, turns_mean=4.0, by_task={},
              max_turns=r.max_turns, max_new_tokens=r.max_new_tokens, max_context_tokens=r.max_context_tokens,
              temperature=0.0, seconds=171.0)
    Path(ppo0.run_dir).mkdir(parents=True)
    append_row(Path(ppo0.run_dir), row)
    shared = shared_base_row(ppo1, tmp_path)
    assert shared == msgspec.structs.replace(row, shared_from=str(Path(ppo0.run_dir)))
    assert shared_base_row(ppo0, tmp_path) is None  # not its own
    sampled = seed_configs(learning(), tmp_path, 1, ["data.heldout_temperature=1.0"])[0]
    longer = seed_configs(learning(), tmp_path, 1, ["rollout.max_new_tokens=4096"])[0]
    random_init = seed_configs(apply_overrides(learning(), ['model.path=""', "model.hf_config={}"]), tmp_path, 1, [])[0]
    assert shared_base_row(sampled, tmp_path) is None and shared_base_row(longer, tmp_path) is None
    assert shared_base_row(random_init, tmp_path) is None  # its weights follow the seed


@pytest.mark.slow
def test_a_run_stopped_in_a_held_out_evaluation_does_it_when_resumed(tmp_path: Path):
    """The checkpoint at a stage's end is written before the stage's held-out evaluation: a run
    stopped during it resumes at the stage's end, and must still evaluate."""
    import shutil

    from bench.system.policy_learning import _train, base_config

    ppo, _ = seed_configs(base_config("tiny", cpu=True), tmp_path, 0, [])
    run = Path(ppo.run_dir)
    _train(ppo)
    assert [r.label for r in read_rows(run)] == ["before_rft", "after_rft", "after_ppo"]

    def keep_rows(labels: set[str]) -> None:
        lines = (run / "heldout.jsonl").read_bytes().splitlines()
        (run / "heldout.jsonl").write_bytes(b"".join(x + b"\n" for x in lines if orjson.loads(x)["label"] in labels))

    keep_rows({"before_rft", "after_rft"})  # stopped during after_ppo, its checkpoint written
    _train(ppo)
    assert [r.label for r in read_rows(run)] == ["before_rft", "after_rft", "after_ppo"]

    rft_end = f"step_{ppo.steps.rft:06d}"  # stopped during after_rft: latest is the rft stage's end
    for ckpt in (run / "ckpt").glob("step_*"):
        if ckpt.name > rft_end:
            shutil.rmtree(ckpt)
    (run / "ckpt" / "latest").write_text(rft_end)
    keep_rows({"before_rft"})
    _train(ppo)
    assert [r.label for r in read_rows(run)] == ["before_rft", "after_rft", "after_ppo"]


@pytest.mark.slow
def test_one_seed_of_plumbing_on_the_cpu(tmp_path: Path):
    cpu = apply_overrides(smoke_cpu(), CPU_FAMILIES)
    assert cpu.data.heldout and cpu.data.tasks == "families"
    code = main_policy("tiny", 1, tmp_path, [], cpu=True)
    assert code == 1  # a tiny model on the fake environment meets no target; the report says so
    doc = orjson.loads((tmp_path / "learning.json").read_bytes())
    seed = doc["seeds"][0]
    assert set(seed["ppo"]) == {"before_rft", "after_rft", "after_ppo"}
    assert set(seed["control"]) == {"before_ppo", "after_ppo"}
    assert doc["verdicts"]["seeds_complete"] == 1
    assert "NOT met" in (tmp_path / "learning.md").read_text()
    # every failed held-out trajectory of the run's rollouts, with its verdict
    failed, rft = seed["failures"]["after_rft"], seed["ppo"]["after_rft"]
    passed = sum(r is not None and r >= 1 for rs in rft["by_task"].values() for r in rs)
    assert len(failed) == rft["trajectories"] - passed > 0 and all(f["status"] for f in failed)
    assert "Why held-out trajectories failed" in (tmp_path / "learning.md").read_text()
    assert (seed["taught"], seed["ppo_pool"], seed["ppo_shapes"]) == (3, 27, [1])  # CPU_FAMILIES' split
    assert "rft learnt from 3 teachers; PPO drew its steps from 27 training tasks (`data.ppo_shapes=[1]`" in (
        tmp_path / "learning.md").read_text()
    assert (seed["ppo_temperature"], seed["dynamic_tasks"], seed["ppo_sft_coef"], seed["ppo_policy_coef"]) == (
        1.0, 0, 0.0, 1.0)
    assert (tmp_path / "learning.png").stat().st_size > 0
    control = read_rows(tmp_path / "seed0" / "control")
    assert [r.label for r in control] == ["before_ppo", "after_ppo"]
    after_rft = next(r for r in read_rows(tmp_path / "seed0" / "ppo") if r.label == "after_rft")
    for row in control:  # the same actor under greedy decoding: its row, not evaluated again, and no run
        assert row == msgspec.structs.replace(after_rft, label=row.label, shared_from=str(tmp_path / "seed0" / "ppo"))
    assert not (tmp_path / "seed0" / "control" / "rollouts").exists()
    assert list((tmp_path / "seed0" / "ppo" / "rollouts").glob("ppo_*.jsonl"))  # the PPO run's steps
    for row in read_rows(tmp_path / "seed0" / "ppo"):  # the recipe's limits, recorded with each row
        assert (row.max_turns, row.max_new_tokens, row.temperature) == (
            cpu.rollout.max_turns, cpu.rollout.max_new_tokens, cpu.data.heldout_temperature)
        assert row.seconds > 0
    # A run cut short: its report again from the run directories alone, nothing trained (no new rows).
    before = (tmp_path / "learning.md").read_text()
    rows = (tmp_path / "seed0" / "ppo" / "heldout.jsonl").read_bytes()
    for name in ("learning.md", "learning.json", "learning.png"):
        (tmp_path / name).unlink()
    assert main_report("tiny", 1, tmp_path, [], cpu=True) == code
    again = (tmp_path / "learning.md").read_text()
    assert (tmp_path / "seed0" / "ppo" / "heldout.jsonl").read_bytes() == rows
    assert again == _without_wall(before)
    assert (tmp_path / "learning.png").stat().st_size > 0


def _without_wall(report: str) -> str:
    """`report` as written without what only the live run knows: the whole run's wall time, and the
    seed's (the last cell of the first table's row)."""
    lines = [line for line in report.splitlines(keepends=True) if not line.startswith("- the whole run:")]
    row = next(i for i, line in enumerate(lines) if line.startswith("| 0 |"))
    lines[row] = lines[row].rstrip("\n").rsplit("|", 2)[0] + "| - |\n"
    return "".join(lines)


def test_a_report_without_run_directories_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no seed's run directory under"):
        main_report("tiny", 3, tmp_path, [], cpu=True)


def test_gpus_are_indices_among_the_gpus_this_process_sees(monkeypatch):
    from bench.system.policy_learning import child_device

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert child_device("1") == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [child_device(g) for g in ("0", "1")] == ["2", "3"]
    with pytest.raises(SystemExit, match="sees 2 GPU"):
        child_device("2")


def test_seeds_sharing_a_gpu_split_ninety_percent_of_its_memory():
    from bench.system.policy_learning import memory_share

    assert memory_share(["0", "0", "0"], "0") == 0.3
    assert memory_share(["0", "1", "1"], "0") == 0.9 and memory_share(["0", "1", "1"], "1") == 0.45


@pytest.mark.slow
def test_seeds_run_at_once_one_child_per_gpu(tmp_path: Path):
    # Two "GPUs" that are only CUDA_VISIBLE_DEVICES values: the children run on the CPU.
    code = main_policy("tiny", 2, tmp_path, [], cpu=True, gpus=["0", "1"])
    assert code == 1
    doc = orjson.loads((tmp_path / "learning.json").read_bytes())
    assert [seed["seed"] for seed in doc["seeds"]] == [0, 1]
    assert doc["verdicts"]["seeds_complete"] == 2
    assert all(set(seed["ppo"]) == {"before_rft", "after_rft", "after_ppo"} for seed in doc["seeds"])
    spans, ports = [], []
    for seed in (0, 1):
        log = (tmp_path / f"seed{seed}" / "seed.log").read_text()
        assert f"seed {seed}: CUDA_VISIBLE_DEVICES={seed}" in log  # each child sees its own GPU
        layout = load_config(tmp_path / f"seed{seed}" / "ppo").layout
        assert layout.learner_memory_share == 0.9  # a GPU of its own
        ports.append(layout.port_base)
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", log, re.MULTILINE)
        spans.append((stamps[0], stamps[-1]))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # the two seeds ran at the same time
    assert ports[1] == ports[0] + 16 and ports[0] >= 20000  # a free range drawn for the run, 16 ports a lane
    assert "| 0 |" in (tmp_path / "learning.md").read_text() and "| 1 |" in (tmp_path / "learning.md").read_text()


def test_the_report_gives_the_whole_runs_wall_time_against_its_target():
    results = [_seed(0, 0.4, 0.5, 0.1), _seed(1, 0.4, 0.5, 0.1)]
    assert verdicts(results)["wall_target_met"] is None  # not known: not judged
    fast, slow = verdicts(results, 24.5 * 60), verdicts(results, 26.5 * 60)
    assert fast["wall_target_met"] and not slow["wall_target_met"]
    assert "the whole run: 26.5 min (target <= 25 min): NOT met" in markdown(results, "smollm2-135m", slow)


def test_the_report_gives_each_learners_most_gpu_memory_from_its_updates(tmp_path):
    lines = [{"step": 0, "stage": "rft", "train/gpu_peak_gib": 17.5, "train/gpu_reserved_gib": 30.0},
             {"step": 1, "stage": "rft", "train/gpu_peak_gib": 19.25, "train/gpu_reserved_gib": 24.0},
             {"step": 2, "stage": "ppo", "rollout/reward_mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(m) for m in lines) + b"\n")
    assert learner_memory(tmp_path) == [19.25, 30.0]
    result = msgspec.structs.replace(_seed(0, 0.4, 0.5, 0.1), memory_gib=learner_memory(tmp_path))
    text = markdown([result, _seed(1, 0.4, 0.5, 0.1)], "smollm2-135m", verdicts([result]))
    assert "- each learner on its GPU at most, GiB allocated / cached: seed 0 19.2 / 30.0\n" in text


def test_the_report_says_how_ppo_sampled():
    result = msgspec.structs.replace(_seed(0, 0.4, 0.5, 0.1), taught=39, ppo_pool=27, ppo_shapes=[1],
                                     ppo_temperature=0.7, dynamic_tasks=4)
    text = markdown([result], "smollm2-135m", verdicts([result]))
    assert ("PPO drew its steps from 27 training tasks (`data.ppo_shapes=[1]`: untaught), up to 4 more a step "
            "(dynamic sampling), its rollouts sampled at temperature 0.7.") in text
    assert "rft's demonstrations" not in text
    plain = msgspec.structs.replace(result, ppo_temperature=1.0, dynamic_tasks=0)
    assert "untaught), its rollouts sampled at temperature 1." in markdown([plain], "smollm2-135m", verdicts([plain]))
    anchored = msgspec.structs.replace(result, ppo_sft_coef=0.5)
    assert ("temperature 0.7. Each PPO update also imitated a batch of rft's demonstrations, their NLL weighted 0.5 "
            "(`ppo.sft_coef`).") in markdown([anchored], "smollm2-135m", verdicts([anchored]))
    assert "policy_coef" not in markdown([anchored], "smollm2-135m", verdicts([anchored]))
    ablation = msgspec.structs.replace(anchored, ppo_policy_coef=0.0)
    assert ("(`ppo.sft_coef`). PPO's surrogate was weighted 0 (`ppo.policy_coef`): the actor learnt from the "
            "demonstrations alone") in markdown([ablation], "smollm2-135m", verdicts([ablation]))


def test_the_report_lists_each_seeds_ppo_steps_from_its_metrics(tmp_path):
    lines = [{"step": 3, "stage": "rft", "train/sft_loss": 1.0},
             {"step": 4, "stage": "ppo", "rollout/reward_mean": -0.25, "rollout/pass_rate": 0.375,
              "train/reward_reach": 1.0, "train/mixed_groups": 0.5, "train/entropy": 0.02, "train/logprob_gap": 0.002},
             {"step": 5, "stage": "ppo", "rollout/reward_mean": 0.5, "rollout/pass_rate": 0.75, "train/reward_reach": 0.5,
              "train/mixed_groups": 1.0, "rollout/mixed_groups": 0.25, "rollout/groups": 8, "train/entropy": 0.04,
              "train/logprob_gap": 0.004}]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(m) for m in lines) + b"\n{\"step\": 6, \"sta")
    steps = ppo_steps(tmp_path)  # the cut last line of a killed run is skipped
    assert [(s.step, s.reward_mean, s.reward_reach) for s in steps] == [(4, -0.25, 1.0), (5, 0.5, 0.5)]
    assert ppo_steps(tmp_path / "missing") == []
    assert learner_memory(tmp_path) == []  # no update on a GPU
    result = msgspec.structs.replace(_seed(0, 0.4, 0.5, 0.1), ppo_steps=steps)
    text = markdown([result, _seed(1, 0.4, 0.5, 0.1)], "smollm2-135m", verdicts([result]))
    # the rollout's share of mixed groups where the run logs it (dynamic sampling learns from mixed groups alone)
    assert [(s.mixed_groups, s.groups) for s in steps] == [(0.5, None), (0.25, 8)]
    assert "| 0 | -0.250 / 38% | +0.500 / 75% | 0.75 | 38% | 8 | 0.030 | 0.003 |" in text
    assert "| 1 | - | - | - | - | - | - | - |" in text
    assert "demonstrations' NLL" not in text
    # under ppo.sft_coef each step logs its demonstrations' NLL: the table gives its first and last
    anchored = [msgspec.structs.replace(x, sft_loss=loss) for x, loss in zip(steps, (0.012, 0.0345))]
    result = msgspec.structs.replace(result, ppo_steps=anchored)
    text = markdown([result, _seed(1, 0.4, 0.5, 0.1)], "smollm2-135m", verdicts([result]))
    assert "| 0 | -0.250 / 38% | +0.500 / 75% | 0.75 | 38% | 8 | 0.030 | 0.003 | 0.012 -> 0.0345 |" in text
    assert "| 1 | - | - | - | - | - | - | - | - |" in text
