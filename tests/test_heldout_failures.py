"""bench.system.heldout_failures: why held-out trajectories failed, read from a run's rollouts."""

from __future__ import annotations

import msgspec

from agentcore.types import Status, Timings, Trajectory
from bench.system.heldout_failures import Failure, failures, markdown_lines, reason_line

TRACEBACK = """trial 0: Traceback (most recent call last):
  File "model_new.py", line 12, in forward
    return cuda_extension.binary_forward(x, b)
RuntimeError: binary_forward: b must be a contiguous float32 CUDA vector of x.size(0) elements
"""
CUT_CUDA = """trial 0: Traceback (most recent call last):
  File "rewards/verify/candidate.py", line 377, in serve
    re [...] for `cudaErrorInvalidValue' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html
CUDA kernel errors might be asynchronously reported at some other API call.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
"""


def test_the_reason_is_the_error_line_the_named_cuda_error_or_the_first_line():
    assert reason_line(TRACEBACK).startswith("RuntimeError: binary_forward: b must be")
    assert reason_line('kernels/unary.cu(7): error: identifier "softsign" is undefined\n  v = softsign;') == (
        'kernels/unary.cu(7): error: identifier "softsign" is undefined')
    assert reason_line(CUT_CUDA) == "CUDA error cudaErrorInvalidValue"
    assert reason_line("trial 0, output 0: 5120 of 5120 values outside atol=0.01\nmore") == (
        "trial 0, output 0: 5120 of 5120 values outside atol=0.01")
    assert reason_line("") == "" and len(reason_line("x" * 1000)) == 160


def trajectory(task_id, reward, info=None, status=Status.TRUNCATED_TURNS, error=None):
    return Trajectory(trajectory_id=f"{task_id}/0/x", task_id=task_id, group_id=f"{task_id}@heldout", sample_index=0,
                      prompt_ids=[1], response_ids=[2], logprobs=[0.0], loss_mask=[1], turns=[], status=status,
                      weight_version_min=0, weight_version_max=0, timings=Timings(), error=error, reward=reward,
                      reward_info=info or {})


def write_rollouts(run_dir, label, trajs):
    """As the run's store writes them, the last one cut by a killed writer."""
    path = run_dir / "rollouts" / f"heldout_{label}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in trajs) + b'{"trajectory_id": "cut')


def test_failures_are_the_trajectories_below_a_pass_with_their_verdicts(tmp_path):
    write_rollouts(tmp_path, "after_rft", [
        trajectory("fam_binary_add_row_s3", -1.0, {"status": "runtime_error", "message": TRACEBACK}),
        trajectory("fam_unary_relu_s3", 2.0, {"status": "ok", "message": "12 trials passed"}),
        trajectory("fam_unary_mish_s1", None, status=Status.TRUNCATED_LENGTH, error="context full"),
    ])
    found = failures(tmp_path, "after_rft")
    assert [(f.task_id, f.status) for f in found] == [("fam_binary_add_row_s3", "runtime_error"),
                                                       ("fam_unary_mish_s1", "truncated_length")]
    assert found[0].reason.startswith("RuntimeError: binary_forward") and found[1].reason == "context full"
    assert failures(tmp_path, "after_ppo") == []


def test_the_report_counts_statuses_per_row_and_lists_the_trained_op_tasks_failed_after_rft():
    rft = [Failure(task_id="fam_binary_add_row_s3", status="runtime_error", reason="CUDA error cudaErrorInvalidValue"),
           Failure(task_id="fam_unary_mish_s1", status="wrong_output", reason="trial 0 | output 0")]
    ppo = [Failure(task_id="fam_unary_mish_s1", status="wrong_output", reason="x")]
    lines = markdown_lines([(0, {"after_rft": rft, "after_ppo": ppo}), (1, {"after_rft": [], "after_ppo": []})],
                           trained={"fam_binary_add_row_s3"})
    text = "\n".join(lines)
    assert "| seed | row | runtime_error | wrong_output |" in text
    assert "| 0 | after rft | 1 | 1 |" in text and "| 0 | after ppo | 0 | 1 |" in text and "| 1 | after" not in text
    assert "- seed 0, `fam_binary_add_row_s3`: runtime_error: CUDA error cudaErrorInvalidValue" in text
    assert "mish" not in text.split("and why:")[1]
    assert markdown_lines([(0, {"after_rft": []})], trained=set()) == []


def ppo_sample(task_id, step, k, reward, info=None):
    return msgspec.structs.replace(trajectory(task_id, reward, info, status=Status.COMPLETED),
                                   trajectory_id=f"{task_id}/{k}/x", group_id=f"{task_id}@{step}", sample_index=k)


def test_ppo_failures_are_the_failing_samples_of_mixed_groups_in_every_round_of_a_step(tmp_path):
    from bench.system.heldout_failures import ppo_failures, ppo_markdown_lines

    axis = {"status": "runtime_error", "message": TRACEBACK}
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    step = [ppo_sample("fam_binary_add_row_s1", 63, 0, 1.0), ppo_sample("fam_binary_add_row_s1", 63, 1, -1.0, axis),
            ppo_sample("fam_unary_relu_s1", 63, 0, -1.0, axis), ppo_sample("fam_unary_relu_s1", 63, 1, -1.0, axis)]
    more = [ppo_sample("fam_binary_sub_col_s1", 63, 0, 2.0), ppo_sample("fam_binary_sub_col_s1", 63, 1, 1.0),
            ppo_sample("fam_reduce_sum_s1", 63, 0, -1.0, {"status": "compile_error", "message": "a.cu(3): error: x"}),
            ppo_sample("fam_reduce_sum_s1", 63, 1, 3.0)]
    (rollouts / "ppo_000063.jsonl").write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in step))
    (rollouts / "ppo_000063_more1.jsonl").write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in more))
    (rollouts / "heldout_after_ppo.jsonl").write_bytes(msgspec.json.encode(step[1]) + b"\n")  # not PPO's
    found = ppo_failures(tmp_path)
    # the uniform relu group taught nothing; the sub group is mixed but both samples passed
    assert sorted((f.task_id, f.status) for f in found) == [("fam_binary_add_row_s1", "runtime_error"),
                                                            ("fam_reduce_sum_s1", "compile_error")]
    text = "\n".join(ppo_markdown_lines([(0, found), (1, [])]))
    assert "| seed | compile_error | runtime_error |" in text and "| 0 | 1 | 1 |" in text and "\n| 1 | " not in text
    assert "- 1 x runtime_error: RuntimeError: binary_forward: b must be a contiguous float32 CUDA vector" in text
    assert ppo_markdown_lines([(0, [])]) == [] and ppo_failures(tmp_path / "none") == []
