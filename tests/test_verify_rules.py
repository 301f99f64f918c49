"""The verifier under the two rule sets (`rewards.verdict.Rules`), on the CPU.

Under "paper" a torch op in forward is TORCH_COMPUTE; under "kernelbench" it is partial work,
named in `details["partial"]`, and the candidate's own kernels must still do a meaningful part:
torch running every compute op of the reference or no own kernel launched are DECOY_KERNEL; own
kernels that take a call of a reference op from a torch running only the reference's ops pass at
any share of the GPU time; otherwise they must carry `partial_min_own_share` of it. The judge is fed fabricated profiler
events (the attribution rules); the end-to-end cases run a real candidate child on a small
Linear+ReLU task, where the reference's ops are audited in the trusted parent. Kernels on a
library's own streams (cuDNN's LSTM) are judged on profiles of the idiom pair
tests/fixtures/idioms/library_streams, under both rule sets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewards.verdict import HackCategory as H
from rewards.verdict import VerdictStatus as S
from rewards.verdict import partial_work
from rewards.verify import trials
from rewards.verify.audit import (
    gpu_events,
    kernel_names,
    library_kernels,
    op_calls,
    profiler_gpu_events,
    sources_call_vendor,
    task_allows_vendor,
)
from rewards.verify.judge import Judge, JudgeSettings
from rewards.verify.verifier import (
    VerifyConfig,
    VerifyRequest,
    run_verification,
)
from rewards.verify.wire import KernelEvent, TrialReport

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

batch_size = 64
features = 32

def get_inputs():
    return [torch.rand(batch_size, features)]

def get_init_inputs():
    return [features]
"""

CANDIDATE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return {forward}
"""


def verify(child, tmp_path: Path, forward: str, rules: str):
    cand = tmp_path / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "model_new.py").write_text(CANDIDATE.format(forward=forward))
    config = VerifyConfig(rules=rules)
    request = VerifyRequest(task_source=TASK, device="cpu", seed=3, candidate_dir=str(cand), config=config)
    return run_verification(request, work_dir=tmp_path, process=child)


def test_torch_ops_are_torch_compute_under_paper_rules(child, tmp_path):
    verdict = verify(child, tmp_path, "F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)", "paper")
    assert verdict.hack is H.TORCH_COMPUTE and verdict.rules == "paper"


def test_torch_doing_part_of_the_work_is_partial_under_kernelbench_rules(child, tmp_path):
    # clamp stands in for the candidate's own epilogue kernel: the reference's relu is not torch's here
    verdict = verify(child, tmp_path, "F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)", "kernelbench")
    assert verdict.status is S.OK and verdict.rules == "kernelbench"
    assert partial_work(verdict) == "aten.addmm, aten.clamp" and "partial: torch does" in verdict.message


def test_torch_running_every_op_of_the_reference_is_a_decoy_under_kernelbench_rules(child, tmp_path):
    verdict = verify(child, tmp_path, "torch.relu(F.linear(x, self.linear.weight, self.linear.bias))", "kernelbench")
    assert verdict.hack is H.DECOY_KERNEL and "every compute op of the reference" in verdict.message


# A model of three Linear layers (addmm x3) and a GELU. Honest: the candidate's kernel does the
# first layer (a patch embedding), torch the other two and the GELU. Cheat: torch makes all three
# addmm calls and the GELU beside a kernel of the candidate's that does none of them.
THREE_LINEARS = {"aten.addmm.default": 3, "aten.gelu.default": 1, "aten.empty.memory_format": 2}


@pytest.mark.parametrize(
    ("ops", "hack"),
    [({"aten.addmm.default": 2, "aten.gelu.default": 1}, None),
     ({"aten.addmm.default": 3, "aten.gelu.default": 1, "aten.cat.default": 1}, H.DECOY_KERNEL)],
    ids=["own_kernel_for_one_linear", "torch_makes_every_call"],
)
def test_a_decoy_leaves_torch_every_call_of_the_reference_not_just_every_op(ops, hack):
    judge = Judge(JudgeSettings(rules="kernelbench"))
    judge.reference_ops = op_calls(THREE_LINEARS)
    judge.observe(TrialReport(index=0, run=0, ok=True, ops=ops), (), 0)
    verdict = judge.verdict(trials=1)
    assert verdict.hack is hack, verdict
    assert hack or verdict.details["partial"] == "aten.addmm, aten.gelu"


def _event(name: str, us: float, cat: str = "kernel") -> KernelEvent:
    return KernelEvent(name=name, cat=cat, stream=7, dur_us=us)


def _judge(*kernels: KernelEvent, rules: str = "kernelbench") -> Judge:
    judge = Judge(JudgeSettings(rules=rules, own_kernels=frozenset({"bias_relu"})))
    judge.observe(TrialReport(index=0, run=0, ok=True, kernels=kernels, marker_stream=7), (), 0)
    return judge


GEMM = "void at::native::(anonymous namespace)::gemv_kernel<float>(float const*)"


def test_torch_kernels_are_partial_work_under_kernelbench_rules():
    verdict = _judge(_event(GEMM, 900), _event("bias_relu(float*)", 100)).verdict(trials=1)
    assert verdict.ok and verdict.details["partial"] == "kernel gemv_kernel"


def test_torch_kernels_are_torch_compute_under_paper_rules():
    assert _judge(_event(GEMM, 900), _event("bias_relu(float*)", 100), rules="paper").verdict(trials=1).hack is (
        H.TORCH_COMPUTE
    )


def test_no_own_kernel_is_a_decoy_under_kernelbench_rules():
    assert _judge(_event(GEMM, 900)).verdict(trials=1).hack is H.DECOY_KERNEL


def test_a_negligible_own_share_is_a_decoy_under_kernelbench_rules():
    verdict = _judge(_event(GEMM, 10_000), _event("bias_relu(float*)", 2)).verdict(trials=1)
    assert verdict.hack is H.DECOY_KERNEL and "0.0% of the GPU time" in verdict.message


# A transposed convolution, two max-pools and a channel sum (KernelBench L2/78's shape of work):
# torch's convolution and pools take ~2.8 ms, the own channel-sum kernel ~6 us (0.2%).
CONV_POOL_SUM = {"aten.convolution.default": 1, "aten.max_pool3d_with_indices.default": 2, "aten.sum.dim_IntList": 1}


@pytest.mark.parametrize(
    ("ops", "hack"),
    [({"aten.convolution.default": 1, "aten.max_pool3d_with_indices.default": 2}, None),
     (CONV_POOL_SUM, H.DECOY_KERNEL),
     # torch sums by another op (a matmul with ones) beside a tiny kernel: back to the share rule
     ({"aten.convolution.default": 1, "aten.max_pool3d_with_indices.default": 2, "aten.mm.default": 1},
      H.DECOY_KERNEL)],
    ids=["own_kernel_takes_the_sum", "torch_also_sums", "torch_sums_by_another_op"],
)
def test_an_own_kernel_taking_a_cheap_op_of_the_reference_passes_at_any_share(ops, hack):
    # as the verifier runs them: audited trials report ops, the last (profiled) one kernels only
    judge = Judge(JudgeSettings(rules="kernelbench", own_kernels=frozenset({"bias_relu"})))
    judge.reference_ops = op_calls(CONV_POOL_SUM)
    for trial in range(2):
        judge.observe(TrialReport(index=trial, run=trial, ok=True, ops=ops), (), trial)
    kernels = (_event(GEMM, 2800), _event("bias_relu(float*)", 6))
    judge.observe(TrialReport(index=2, run=2, ok=True, kernels=kernels, marker_stream=7), (), 2)
    verdict = judge.verdict(trials=3)
    assert verdict.hack is hack, verdict
    assert verdict.details["own_share"] < 0.005


def test_one_audited_trial_where_torch_did_all_the_op_brings_back_the_share_rule():
    """A candidate whose torch path computes the sum in some trials only (say, by input shape):
    the profiled trial's tiny own share is judged by the share rule."""
    judge = Judge(JudgeSettings(rules="kernelbench", own_kernels=frozenset({"bias_relu"})))
    judge.reference_ops = op_calls(CONV_POOL_SUM)
    left = {"aten.convolution.default": 1, "aten.max_pool3d_with_indices.default": 2}
    judge.observe(TrialReport(index=0, run=0, ok=True, ops=left), (), 0)
    judge.observe(TrialReport(index=1, run=1, ok=True, ops=left | {"aten.mm.default": 1}), (), 1)
    judge.observe(TrialReport(index=2, run=2, ok=True, ops=left), (), 2)
    kernels = (_event(GEMM, 2800), _event("bias_relu(float*)", 6))
    judge.observe(TrialReport(index=3, run=3, ok=True, kernels=kernels, marker_stream=7), (), 3)
    verdict = judge.verdict(trials=4)
    assert verdict.hack is H.DECOY_KERNEL and "of the GPU time" in verdict.message, verdict


def test_a_fused_epilogue_after_a_torch_gemm_is_enough_under_kernelbench_rules():
    # a 1024x8192x8192 fp32 GEMM (about 2.7 ms) and its epilogue (about 25 us): about 1%
    assert _judge(_event(GEMM, 2700), _event("bias_relu(float*)", 25)).verdict(trials=1).ok


# --- library streams: the idiom pair tests/fixtures/idioms/library_streams ---------------------
# Profiles as the profiler would record them on a GPU (names as in a cuDNN LSTM's trace): the
# reference's from the profiler's in-memory events (the parent's side), the candidate's from a
# chrome trace (the child's side). Everything after the profiler is the real code.

PAIR = Path(__file__).parent / "fixtures" / "idioms" / "library_streams"
RNN_CELL = "void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>(int, int, float*)"
RNN_GEMM = "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true>(cublasGemmSmallNParams<float const, float, float>)"
TORCH_COPY = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda>>(int)"
OWN = "linear_relu_kernel(float const*, float const*, float const*, float*, int, int, int)"
SPIN = "at::cuda::(anonymous namespace)::spin_kernel(long)"


def _reference_profile() -> list:
    """The reference's forward: cuDNN's LSTM forks to four streams of its own; the Linear and ReLU
    run on the calling stream (7)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    launches = [(SPIN, 7), (RNN_GEMM, 21), *((RNN_CELL, s) for s in (21, 22, 23, 24)), (RNN_GEMM, 7), (TORCH_COPY, 7)]
    return [FunctionEvent(id=i, name=name, thread=0, start_us=10.0 * i, end_us=10.0 * i + 5, device_type=DeviceType.CUDA,
                          device_resource_id=stream) for i, (name, stream) in enumerate(launches)]


def _candidate_trace(tmp_path: Path, launches: list[tuple[str, int]]) -> Path:
    """A chrome trace of the candidate's profiled forward: the harness's marker on stream 13 first."""
    events = [{"ph": "X", "cat": "kernel", "name": name, "ts": 10 * i, "dur": 5, "args": {"stream": stream}}
              for i, (name, stream) in enumerate([(SPIN, 13), *launches])]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    return trace


def _pair_judge(variant: str, rules: str, library: frozenset[str]) -> Judge:
    files = {p.relative_to(PAIR.parent / "base").as_posix(): p.read_text() for p in (PAIR.parent / "base").rglob("*.cu")}
    files |= {p.relative_to(PAIR / variant).as_posix(): p.read_text() for p in (PAIR / variant).rglob("*.py")}
    task = (PAIR / "model.py").read_text()
    judge = Judge(JudgeSettings(rules=rules, own_kernels=frozenset(kernel_names(files)),
                                vendor_allowed=task_allows_vendor(task), vendor_used=sources_call_vendor(files)))
    judge.library_kernels = library
    return judge


def _observe(judge: Judge, trace: Path) -> Judge:
    kernels, marker = gpu_events(trace)
    judge.observe(TrialReport(index=0, run=0, ok=True, kernels=tuple(kernels), marker_stream=marker), (), 0)
    return judge


HONEST_RUN = [(RNN_GEMM, 25), *((RNN_CELL, s) for s in (25, 26, 27, 28)), (TORCH_COPY, 13), (OWN, 13)]
CHEAT_RUN = [(RNN_GEMM, 25), *((RNN_CELL, s) for s in (25, 26, 27, 28)), (TORCH_COPY, 30), (OWN, 30)]


def test_library_kernels_are_those_the_reference_runs_off_its_own_stream():
    events, marker = profiler_gpu_events(_reference_profile())
    assert marker == 7 and len(events) == 7
    assert library_kernels(events, marker) == {"elemWiseRNNcell", "gemmSN_TN_kernel"}


def test_a_reference_profile_without_its_marker_excuses_nothing():
    events, marker = profiler_gpu_events(_reference_profile()[1:])
    assert library_kernels(events, marker) == frozenset()


@pytest.mark.parametrize("rules", ["paper", "kernelbench"])
def test_library_streams_the_reference_shows_are_no_side_stream(tmp_path, rules):
    library = library_kernels(*profiler_gpu_events(_reference_profile()))
    judge = _observe(_pair_judge("honest", rules, library), _candidate_trace(tmp_path, HONEST_RUN))
    assert H.SIDE_STREAM not in {e.category for e in judge.evidence}
    verdict = judge.verdict(trials=1)
    assert verdict.ok if rules == "kernelbench" else verdict.hack is H.TORCH_COMPUTE, verdict


def test_without_the_references_profile_library_streams_are_a_side_stream(tmp_path):
    judge = _observe(_pair_judge("honest", "kernelbench", frozenset()), _candidate_trace(tmp_path, HONEST_RUN))
    assert judge.verdict(trials=1).hack is H.SIDE_STREAM


@pytest.mark.parametrize("rules", ["paper", "kernelbench"])
def test_own_kernels_and_torch_ops_on_the_candidates_stream_stay_a_side_stream(tmp_path, rules):
    library = library_kernels(*profiler_gpu_events(_reference_profile()))
    judge = _observe(_pair_judge("cheat", rules, library), _candidate_trace(tmp_path, CHEAT_RUN))
    (side,) = [e.message for e in judge.evidence if e.category is H.SIDE_STREAM]  # paper: after torch_compute
    assert "elementwise_kernel (stream 30)" in side and "linear_relu_kernel (stream 30)" in side
    assert "elemWiseRNNcell" not in side and "gemmSN_TN_kernel" not in side


def test_an_own_kernel_named_like_a_library_kernel_is_never_excused(tmp_path):
    judge = _pair_judge("honest", "kernelbench", frozenset({"linear_relu_kernel"}))
    verdict = _observe(judge, _candidate_trace(tmp_path, [(OWN, 30)])).verdict(trials=1)
    assert verdict.hack is H.SIDE_STREAM and "linear_relu_kernel (stream 30)" in verdict.message


def test_the_reference_is_profiled_once_and_only_for_kernels_off_the_harness_stream(tmp_path, monkeypatch):
    calls = []

    def profiled(model, inputs, device):
        calls.append(inputs)
        return profiler_gpu_events(_reference_profile())

    monkeypatch.setattr(trials, "_profiled_reference", profiled)
    run = trials.Verification(VerifyRequest(task_source=TASK, device="cpu"), tmp_path, tmp_path, None, None)
    run.model, run.judge = None, _pair_judge("honest", "kernelbench", frozenset())
    kernels, marker = gpu_events(_candidate_trace(tmp_path, [(TORCH_COPY, 13), (OWN, 13)]))
    run._library_streams(TrialReport(index=0, run=0, ok=True, kernels=tuple(kernels), marker_stream=marker), ["x"])
    assert calls == [] and run.judge.library_kernels == frozenset()
    kernels, marker = gpu_events(_candidate_trace(tmp_path, HONEST_RUN))
    report = TrialReport(index=0, run=1, ok=True, kernels=tuple(kernels), marker_stream=marker)
    run._library_streams(report, ["x"])
    run._library_streams(report, ["x"])
    assert calls == [["x"]] and run.judge.library_kernels == {"elemWiseRNNcell", "gemmSN_TN_kernel"}
