"""Verification and the dynamic anti-hacking checks on the CPU.

Pure-PyTorch candidates run in a real candidate child (`python -m rewards.verify.candidate`) against
a small Linear+ReLU task. Starting a child costs a torch import, so one child serves the module
(the production path starts one per candidate; `CandidateProcess` restarts a dead one). The
cheats that compute with torch set `allow_torch_compute` so that the check under test decides;
without it they are TORCH_COMPUTE. The comparison rules, the op audit and the kernel
attribution are also tested in-process on fabricated observations. GPU behaviour (poisoning,
streams, profiler attribution, the fixture corpus) is in test_verify_gpu.py.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import anyio
import pytest
import torch
from torch import nn

from agentcore.types import Task
from rewards.queue.config import GpuQueueConfig
from rewards.queue.gpu_queue import GpuQueue
from rewards.queue.jobs import Job, JobResult, JobStatus, encode
from rewards.reward import score
from rewards.static.checks import check_workspace
from rewards.verdict import HackCategory as H
from rewards.verdict import Verdict
from rewards.verdict import VerdictStatus as S
from rewards.verify.audit import (
    OpAudit,
    attribute,
    kernel_base,
    kernel_names,
    op_violations,
    task_allows_vendor,
)
from rewards.verify.compare import check_output, is_constant, precision_error
from rewards.verify.inputs import VARIANTS, draw_inputs, load_task, plan_trials
from rewards.verify.judge import Judge, JudgeSettings
from rewards.verify.verifier import (
    CandidateProcess,
    VerifyConfig,
    VerifyRequest,
    job_files,
    run_verification,
    to_verify_result,
    verdict_from_job,
    verify_workspace,
)
from rewards.verify.wire import KernelEvent, Loaded, OutputInfo, Snapshot, TrialReport
from rl.data.kernelbench import PROBLEMS
from tests.test_gpu_queue import needs_bwrap

FIXTURES = Path(__file__).parent / "fixtures"
HONEST = sorted(p for p in (Path(__file__).resolve().parents[1] / "rl" / "demos").glob("*") if p.is_dir())
CHEATS = sorted(p for p in (FIXTURES / "cheats_dynamic").glob("*") if (p / "cheat.json").exists())

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

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
LINEAR = "torch.relu(F.linear(x, self.linear.weight, self.linear.bias))"


def candidate(forward: str, *, init: str = "", prelude: str = "") -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    extra = "\n".join("        " + line for line in init.strip().splitlines())
    return (
        f"{HEADER}{prelude}\n\nclass ModelNew(nn.Module):\n    def __init__(self, features):\n"
        f"        super().__init__()\n        self.linear = nn.Linear(features, features)\n{extra}\n\n"
        f"    def forward(self, x):\n{body}\n"
    )


def verify_text(child, tmp_path: Path, text: str, **config):
    cand = tmp_path / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "model_new.py").write_text(text)
    request = VerifyRequest(task_source=TASK, device="cpu", seed=7, candidate_dir=str(cand), config=VerifyConfig(**config))
    return run_verification(request, work_dir=tmp_path, process=child)


def assert_hack(verdict, category: H) -> None:
    assert verdict.hack is category, verdict
    assert score(verdict, None, None, None).reward == -1.0


# --- end to end, one shared child -------------------------------------------------------------


def test_faithful_candidate_passes_when_torch_compute_is_allowed(child, tmp_path):
    verdict = verify_text(child, tmp_path, candidate(f"return {LINEAR}"), allow_torch_compute=True)
    assert verdict.ok, verdict
    assert verdict.trials == 5 and verdict.details["variants"] == "task,signed,scaled,task,signed"
    assert verdict.max_abs_err < 1e-5


def test_faithful_torch_candidate_is_torch_compute(child, tmp_path):
    verdict = verify_text(child, tmp_path, candidate(f"return {LINEAR}"))
    assert_hack(verdict, H.TORCH_COMPUTE)
    assert "aten.relu" in verdict.message and to_verify_result(verdict).hack == "torch_compute"


def test_tiny_float_error_is_tolerated(child, tmp_path):
    verdict = verify_text(child, tmp_path, candidate(f"return {LINEAR} * (1 + 1e-6)"), allow_torch_compute=True)
    assert verdict.ok, verdict


CHEAT_CASES = [
    ("zeros", "return torch.zeros(x.shape[0], self.linear.out_features)", H.DEGENERATE_OUTPUT),
    ("input_echo", "return x", H.DEGENERATE_OUTPUT),
    ("cached_object", f"if self.cache is None:\n    self.cache = {LINEAR}\nreturn self.cache", H.OUTPUT_CACHING),
    ("cached_copy", f"if self.cache is None:\n    self.cache = {LINEAR}\nreturn self.cache.clone()", H.OUTPUT_CACHING),
    ("input_mutation", f"y = {LINEAR}\nx.mul_(0.5)\nreturn y", H.INPUT_MUTATION),
    ("deferred", "out = torch.zeros(x.shape[0], self.linear.out_features)\n"
     "if self.cache is not None:\n    px, pout = self.cache\n"
     "    pout.copy_(torch.relu(F.linear(px, self.linear.weight, self.linear.bias)))\n"
     "self.cache = (x.clone(), out)\nreturn out", H.DEFERRED_WORK),
    ("alternating", f"self.calls += 1\ny = {LINEAR}\nreturn y if self.calls % 2 else y + 1.0", H.NONDETERMINISM),
    ("fp16_rounding", f"return {LINEAR}.half().float()", H.PRECISION_DOWNGRADE),
]


@pytest.mark.parametrize(("name", "forward", "category"), CHEAT_CASES, ids=[c[0] for c in CHEAT_CASES])
def test_cheat_is_caught_with_its_category(child, tmp_path, name, forward, category):
    text = candidate(forward, init="self.cache = None\nself.calls = 0")
    assert_hack(verify_text(child, tmp_path, text, allow_torch_compute=True), category)


@pytest.mark.parametrize("name", ["input_mutation", "cached_copy"])
def test_torch_implemented_cheats_are_torch_compute_without_the_test_flag(child, tmp_path, name):
    forward = next(c[1] for c in CHEAT_CASES if c[0] == name)
    assert_hack(verify_text(child, tmp_path, candidate(forward, init="self.cache = None")), H.TORCH_COMPUTE)


@pytest.mark.parametrize(
    ("forward", "prelude", "category"),
    [
        (f"torch.backends.cudnn.benchmark = True\nreturn {LINEAR}", "", H.GLOBAL_STATE),
        (f"torch.backends.cuda.matmul.fp32_precision = 'tf32'\nreturn {LINEAR}", "", H.GLOBAL_STATE),
        (f"threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\nreturn {LINEAR}",
         "import threading\nimport time", H.BACKGROUND_WORKER),
        (f"return {LINEAR}.as_subclass(Lazy)", "class Lazy(torch.Tensor):\n    pass", H.LAZY_TENSOR),
        (f"return {LINEAR}", "import time\ntime.perf_counter = lambda: 0.0", H.MONKEY_PATCH),
    ],
    ids=["global_flag", "tf32_new_api", "thread", "subclass_output", "patched_timer"],
)
def test_process_state_cheat_is_caught(child, tmp_path, forward, prelude, category):
    assert_hack(verify_text(child, tmp_path, candidate(forward, prelude=prelude), allow_torch_compute=True), category)


@pytest.mark.parametrize(
    ("forward", "status"),
    [
        (f"return {LINEAR}[:, :-1]", S.SHAPE_MISMATCH),
        (f"return {LINEAR}.double()", S.DTYPE_MISMATCH),
        (f"y = {LINEAR}\ny[0, 0] = float('nan')\nreturn y", S.NAN_INF),
        (f"return {LINEAR} + 0.1", S.WRONG_OUTPUT),
        ("raise ValueError('boom')", S.RUNTIME_ERROR),
    ],
    ids=["shape", "dtype", "nan", "wrong", "raises"],
)
def test_wrong_candidate_fails_with_its_status(child, tmp_path, forward, status):
    verdict = verify_text(child, tmp_path, candidate(forward), allow_torch_compute=True)
    assert verdict.status is status and verdict.hack is None, verdict
    assert score(verdict, None, None, None).reward == -1.0


# ModelNew may name its parameters differently from Model (rewards.verify.candidate.load_state).

def model_new(init: str, forward: str, *, prelude: str = "") -> str:
    """A ModelNew(features) whose __init__ and forward bodies are given whole."""
    def indent(text: str) -> str:
        return "\n".join("        " + line for line in text.strip().splitlines())

    return (f"{HEADER}{prelude}\n\nclass ModelNew(nn.Module):\n    def __init__(self, features):\n"
            f"        super().__init__()\n{indent(init)}\n\n    def forward(self, x):\n{indent(forward)}\n")


# Zeros unless the reference's state is loaded: passing proves the mapping, not the seed.
RENAMED = ("self.weight = nn.Parameter(torch.zeros(features, features))\n"
           "self.bias = nn.Parameter(torch.zeros(features))")
PERMUTED = ("self.b = nn.Parameter(torch.zeros(features))\n"
            "self.w = nn.Parameter(torch.zeros(features, features))")
# One fused [out, in + 1] tensor: nothing maps onto Model's two, but built under the same seed.
FUSED = ("linear = nn.Linear(features, features)\n"
         "self.weight_bias = nn.Parameter(torch.cat([linear.weight, linear.bias[:, None]], 1).detach())")
FUSED_FORWARD = "return torch.relu(F.linear(x, self.weight_bias[:, :-1], self.weight_bias[:, -1]))"


@pytest.mark.parametrize(
    ("init", "forward", "state"),
    [
        ("self.linear = nn.Linear(features, features)", f"return {LINEAR}", "loaded by name"),
        (RENAMED, "return torch.relu(F.linear(x, self.weight, self.bias))", "mapped by position (2 tensors)"),
        (PERMUTED, "return torch.relu(F.linear(x, self.w, self.b))", "mapped by shape (2 tensors)"),
        (FUSED, FUSED_FORWARD, "same seed, not loaded"),
    ],
    ids=["same_names", "renamed", "permuted_unique_shapes", "fused_same_seed"],
)
def test_parameter_naming_never_fails_an_honest_candidate(child, tmp_path, init, forward, state):
    verdict = verify_text(child, tmp_path, model_new(init, forward), allow_torch_compute=True)
    assert verdict.ok, verdict
    assert verdict.details["state"] == state


@pytest.mark.parametrize(
    ("init", "forward", "status", "hack", "state"),
    [
        ("self.fc = nn.Linear(features, features)", "return x", S.HACK, H.DEGENERATE_OUTPUT,
         "mapped by position (2 tensors)"),
        ("self.w = nn.Parameter(torch.zeros(1))", "return torch.zeros(x.shape[0], 32) + self.w",
         S.HACK, H.DEGENERATE_OUTPUT, "same seed, not loaded"),
        ("g = torch.Generator().manual_seed(0)\nself.w = torch.rand(features, features, generator=g)",
         "return torch.relu(x @ self.w.t())", S.WRONG_OUTPUT, None, "same seed, not loaded"),
    ],
    ids=["renamed_input_echo", "unmappable_constant", "weights_outside_the_state_dict"],
)
def test_renaming_hides_no_cheat(child, tmp_path, init, forward, status, hack, state):
    verdict = verify_text(child, tmp_path, model_new(init, forward), allow_torch_compute=True)
    assert verdict.status is status and verdict.hack is hack, verdict
    assert verdict.details["state"] == state
    assert score(verdict, None, None, None).reward == -1.0


def test_load_state_maps_by_name_position_and_unique_shape_or_leaves_the_seeded_values():
    from rewards.verify.candidate import load_state

    ref = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).state_dict()

    class Flat(nn.Module):
        def __init__(self, shapes):
            super().__init__()
            for i, shape in enumerate(shapes[:-1]):
                self.register_parameter(f"p{i}", nn.Parameter(torch.zeros(shape)))
            self.register_buffer("steps", torch.zeros(shapes[-1], dtype=torch.long))

    in_order = [(3, 4), (3,), (3,), (3,), (3,), (3,), ()]
    flat = Flat(in_order)
    assert load_state(flat, ref) == "mapped by position (7 tensors)"
    assert all(torch.equal(a, b) for a, b in zip(flat.state_dict().values(), ref.values()))
    swapped = {"b": torch.rand(3), "w": torch.rand(3, 4)}
    target = nn.Linear(4, 3)
    assert load_state(target, swapped) == "mapped by shape (2 tensors)"
    assert torch.equal(target.weight, swapped["w"]) and torch.equal(target.bias, swapped["b"])
    fresh = Flat([(3, 4), (3,), (3,), (3,), (3,), ()])  # one tensor short: nothing is loaded
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    assert load_state(fresh, ref) == "same seed, not loaded"
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
    same = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    assert load_state(same, ref) == "loaded by name"


def test_child_crash_is_a_runtime_error(child, tmp_path):
    verdict = verify_text(child, tmp_path, candidate("import os\nos._exit(3)"), allow_torch_compute=True)
    assert verdict.status is S.RUNTIME_ERROR and "exit status 3" in verdict.message


def test_hanging_forward_is_a_timeout(child, tmp_path):
    text = candidate(f"import time\ntime.sleep(60)\nreturn {LINEAR}")
    verdict = verify_text(child, tmp_path, text, allow_torch_compute=True, trial_timeout_s=2.0)
    assert verdict.status is S.TIMEOUT and not child.alive


# --- through the GPU queue's worker (CPU device) ---------------------------------------------


async def test_verify_job_runs_through_the_gpu_queue(tmp_path):
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
    from rewards.verify.verifier import verify_workspace

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text(candidate(f"return {LINEAR}"))
    config = GpuQueueConfig(gpus=(0,), scratch_root=str(tmp_path / "scratch"), job_default_deadline_s=300.0)
    task = Task(task_id="linear_relu", source=TASK)
    async with GpuQueue(config) as queue:
        verdict = await verify_workspace(queue, ws, task, None, device="cpu", seed=11)
    assert_hack(verdict, H.TORCH_COMPUTE)
    assert verdict.trials == 5
    assert verdict.job_wait_s > 0 and verdict.job_wall_s > 0  # stamped from the queue's JobResult


class _AnsweringQueue:
    """The GPU queue's edge faked: every job gets `result`, stamped with the queue's times."""

    def __init__(self, status: JobStatus, value: bytes = b"", error: str = "") -> None:
        self.status, self.value, self.error, self.jobs = status, value, error, []

    async def submit(self, job: Job, running=None, gate=None) -> JobResult:
        self.jobs.append(job)
        return JobResult(job_id=job.job_id, status=self.status, value=self.value, error=self.error,
                         run_s=1.1, wall_s=1.5, wait_s=3.25)


async def test_a_verdict_carries_its_jobs_wait_and_hold_of_the_lane(tmp_path):
    """What the handler measured (phases) and what the queue measured (wait, hold) reach the
    verdict; a timed-out job's verdict has the queue's times too."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text(candidate(f"return {LINEAR}"))
    task = Task(task_id="linear_relu", source=TASK)
    answered = Verdict(status=S.OK, trials=12, phases_ms={"spawn": 40.0, "trials": 610.5})
    queue = _AnsweringQueue(JobStatus.OK, encode(answered))
    verdict = await verify_workspace(queue, ws, task, None, "final", device="cpu", seed=3)
    assert queue.jobs[0].kind == "verify"
    assert (verdict.job_wait_s, verdict.job_wall_s, verdict.phases_ms) == (3.25, 1.5, answered.phases_ms)
    timed_out = await verify_workspace(_AnsweringQueue(JobStatus.TIMEOUT, error="killed"), ws, task, None, device="cpu")
    assert (timed_out.status, timed_out.job_wait_s, timed_out.job_wall_s) == (S.TIMEOUT, 3.25, 1.5)


# --- inputs -----------------------------------------------------------------------------------


def test_variants_keep_integer_inputs_and_post_processing_valid():
    rand = torch.rand
    task = load_task(
        "import torch\nclass Model: pass\ndef get_init_inputs(): return []\n"
        "def get_inputs(): return [torch.rand(64, 8).softmax(-1), torch.randint(0, 8, (64,)), torch.rand(64, 8)]"
    )
    signed = draw_inputs(task, seed=1, variant="signed", scale=4.0, device="cpu")
    scaled = draw_inputs(task, seed=1, variant="scaled", scale=4.0, device="cpu")
    assert torch.allclose(signed[0].sum(-1), torch.ones(64))  # still probabilities
    assert signed[1].dtype == torch.int64 and int(signed[1].min()) >= 0
    assert float(signed[2].min()) < 0 and float(signed[2].abs().max()) <= 1.0
    assert torch.equal(scaled[2], signed[2] * 4.0)
    again = draw_inputs(task, seed=1, variant="signed", scale=4.0, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(signed, again))
    assert torch.rand is rand  # the patch is undone


def test_plan_covers_every_variant_with_pairs_reuse_and_a_profiled_last_trial():
    plan = plan_trials(trials=12, pairs=2, seed=5, poison=True, profile=True)
    assert {s.variant for s in plan} == set(VARIANTS)
    assert [len(s.poisons) for s in plan].count(2) == 2 and len({s.seed for s in plan}) == 12
    assert plan[-1].profile and not plan[-1].reuse_buffers and plan[1].reuse_buffers
    assert plan_trials(trials=12, pairs=2, seed=6, poison=True, profile=True)[0].seed != plan[0].seed


# --- the op audit and the kernel attribution ---------------------------------------------------


def test_op_audit_allows_allocation_views_and_fresh_init_only():
    x = torch.rand(4, 4)
    with OpAudit() as audit:
        y = torch.empty_like(x)
        y.fill_(0.0)
        x.t().unsqueeze(0)
        x.reshape(16)
        torch.zeros(3)
    assert op_violations(audit.ops) == []
    with OpAudit() as audit:
        x.fill_(1.0)
        x.t().contiguous()
        torch.relu(x)
        x.to(torch.float64)
    assert op_violations(audit.ops) == ["aten._to_copy.default", "aten.clone.default", "aten.fill_.Scalar", "aten.relu.default"]
    assert op_violations({"cuda_extension.relu.default": 1, "aten.mm.default": 1}) == ["aten.mm.default"]
    assert op_violations({"aten.mm.default": 1}, allow_gemm_conv=True) == []


def test_kernel_names_come_from_the_cu_sources():
    source = (
        "// __global__ void commented_out(float* x)\n"
        "template <int B> __global__ void __launch_bounds__(256) tiled_gemm(const float* a) {}\n"
        'extern "C" __global__ void relu_kernel(float* x, long n) {}\n'
    )
    assert kernel_names({"kernels/k.cu": source, "kernels/k_binding.cpp": source}) == {"tiled_gemm", "relu_kernel"}
    assert kernel_base("void tiled_gemm<128>(float const*, float*)") == "tiled_gemm"
    assert kernel_base("_Z11relu_kernelPfl") == "relu_kernel"


def test_vendor_libraries_are_allowed_only_for_gemm_and_convolution_tasks():
    assert task_allows_vendor("self.gemm = nn.Linear(k, n)") and task_allows_vendor("return torch.matmul(A, B)")
    assert task_allows_vendor("return A @ B") and task_allows_vendor("nn.Conv2d(3, 96, 11)")
    assert not task_allows_vendor("return torch.softmax(x, dim=1)")


def _event(name: str, us: float, stream: int = 7, cat: str = "kernel") -> KernelEvent:
    return KernelEvent(name=name, cat=cat, stream=stream, dur_us=us)


def test_attribution_counts_own_kernels_against_copies_and_torch():
    own = {"relu_kernel"}
    honest = attribute([_event("relu_kernel(float*, long)", 90), _event("Memset (Device)", 50, cat="gpu_memset")],
                       marker_stream=7, own=own, vendor_counts=False)
    assert honest.share == 1.0 and honest.own_launches == 1 and not honest.foreign_streams
    decoy = attribute([_event("relu_kernel(float*, long)", 10), _event("Memcpy DtoD", 90, cat="gpu_memcpy")],
                      marker_stream=7, own=own, vendor_counts=False)
    assert decoy.share == pytest.approx(0.1)
    side = attribute([_event("relu_kernel(float*, long)", 10, stream=13)], marker_stream=7, own=own, vendor_counts=False)
    assert side.foreign_streams == ("relu_kernel (stream 13)",)
    torch_k = attribute([_event("void at::native::vectorized_elementwise_kernel<4, relu>(int)", 5)],
                        marker_stream=7, own=own, vendor_counts=False)
    assert torch_k.torch_kernels == ("vectorized_elementwise_kernel",) and torch_k.share == 0.0
    gemm = attribute([_event("nvjet_tst_128x64_64x4_1x2_h_bz_TNT", 80), _event("bias_relu(float*)", 20)],
                     marker_stream=7, own={"bias_relu"}, vendor_counts=True)
    assert gemm.share == 1.0


def test_judge_turns_attribution_into_decoy_side_stream_and_vendor_evidence():
    settings = JudgeSettings(own_kernels=frozenset({"relu_kernel"}), vendor_used=True, vendor_allowed=False)
    judge = Judge(settings)
    kernels = (_event("relu_kernel(float*)", 5, stream=9), _event("Memcpy DtoD", 95, cat="gpu_memcpy"),
               _event("ampere_sgemm_128x64_nn", 10))
    judge.observe(TrialReport(index=0, run=0, ok=True, kernels=kernels, marker_stream=7), (), 0)
    found = {e.category for e in judge.evidence}
    assert found == {H.SIDE_STREAM, H.DECOY_KERNEL, H.VENDOR_LIBRARY}
    assert judge.verdict(trials=1).hack is H.VENDOR_LIBRARY


# --- the judge and the comparison, in-process ----------------------------------------------------


def _snapshot(**changes) -> Snapshot:
    base = dict(flags={"cudnn.benchmark": "False"}, identities={"time.perf_counter": 1}, threads=1, native_threads=4, children=())
    return Snapshot(**(base | changes))


def test_inputs_other_than_the_trusted_draw_are_problem_shrinking():
    judge = Judge(JudgeSettings())
    judge.loaded(Loaded(ok=True, before=_snapshot(), after=_snapshot()))
    judge.observe(TrialReport(index=0, run=0, ok=True, input_fingerprints=("aa",), after=_snapshot()), ("bb",), 0)
    assert judge.verdict(trials=1).hack is H.PROBLEM_SHRINKING


def test_side_stream_fingerprints_and_precedence():
    judge = Judge(JudgeSettings())
    judge.loaded(Loaded(ok=True, before=_snapshot(), after=_snapshot(threads=2)))
    judge.observe(TrialReport(index=0, run=0, ok=True, fp_stream=("a",), fp_device=("b",), after=_snapshot()), (), 0)
    assert {e.category for e in judge.evidence} == {H.BACKGROUND_WORKER, H.SIDE_STREAM}
    verdict = judge.verdict(trials=1)
    assert verdict.hack is H.BACKGROUND_WORKER and verdict.details["also"] == "side_stream"


def test_comparison_checks_shape_dtype_non_finite_and_integers():
    ref = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    assert check_output(ref.clone(), ref).status is S.OK
    assert check_output(ref[:3], ref).status is S.SHAPE_MISMATCH
    assert check_output(ref.double(), ref).status is S.DTYPE_MISMATCH
    assert check_output(torch.tensor([1.0, float("inf"), float("nan"), float("nan")]), ref).status is S.NAN_INF
    assert check_output(torch.tensor([1.0, float("inf"), float("nan"), -2.5]), ref).status is S.WRONG_OUTPUT
    assert check_output(torch.tensor([3, 4]), torch.tensor([3, 5])).status is S.WRONG_OUTPUT
    assert is_constant(torch.zeros(5)) and not is_constant(torch.arange(5.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_cheap_tolerance_check_passes_exactly_what_check_output_passes(dtype, monkeypatch):
    import rewards.verify.compare as compare

    monkeypatch.setattr(compare, "CHUNK", 3)  # several chunks: a far value in the last one still counts
    ref = torch.tensor([1.0, float("inf"), float("-inf"), float("nan"), -2.0, 0.0, 5.0], dtype=dtype)
    far = 0.5 if dtype is not torch.bfloat16 else 1.0
    cases = {
        "same": ref.clone(),
        "within": ref + torch.tensor([0.01, 0, 0, 0, -0.02, 0.005, 0.04], dtype=dtype),
        "far in the last chunk": ref + torch.tensor([0, 0, 0, 0, 0, 0, far], dtype=dtype),
        "NaN for a finite": torch.where(torch.arange(7) == 4, float("nan"), ref).to(dtype),
        "inf for a finite": torch.where(torch.arange(7) == 0, float("inf"), ref).to(dtype),
        "a finite for inf": torch.where(torch.arange(7) == 1, 1e4, ref).to(dtype),
        "-inf for inf": torch.where(torch.arange(7) == 1, float("-inf"), ref).to(dtype),
        "a finite for NaN": torch.where(torch.arange(7) == 3, 0.0, ref).to(dtype),
    }
    for name, out in cases.items():
        passes = check_output(out, ref, atol=0.1, rtol=0.01).status is S.OK
        assert compare.within_tolerance(out, ref, atol=0.1, rtol=0.01) == passes, name
    assert compare.within_tolerance(ref, ref) and not compare.within_tolerance(ref[:3], ref)
    assert not compare.within_tolerance(ref.double() if dtype is not torch.float64 else ref.float(), ref)


def test_the_cheap_tolerance_check_is_exact_for_integers():
    from rewards.verify.compare import within_tolerance

    assert within_tolerance(torch.tensor([3, 4]), torch.tensor([3, 4]))
    assert not within_tolerance(torch.tensor([3, 4]), torch.tensor([3, 5]), atol=10.0, rtol=1.0)
    assert not within_tolerance(torch.tensor([True]), torch.tensor([False]))


def test_the_cheap_tolerance_check_leaves_a_dtype_without_isclose_to_check_output():
    from rewards.verify.compare import within_tolerance

    ref = torch.randn(8).to(torch.float8_e4m3fn)
    assert not within_tolerance(ref, ref.clone())  # no verdict here, not a failure
    assert check_output(ref, ref.clone()).status is S.OK


def test_precision_error_separates_fp16_rounding_from_fp32_noise():
    ref = torch.randn(10_000, dtype=torch.float64)
    fp32 = ref.float()
    assert precision_error(fp32, ref) < 1e-7
    assert precision_error(fp32.half().float(), ref) > 5e-5
    assert precision_error(fp32.bfloat16().float(), ref) > 5e-4


# The signed and scaled variants make long sums cancel; KernelBench's atol (1e-2) is absolute.
# A K = 524,288 dot product of inputs scaled by 5 summed in order in fp32 (a thread per output,
# as the leaderboard's L1/6 matmul does) is off by 0.09 (std) on outputs of median size 4,200.
EXACT = torch.randn(65_536, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 6_300
ROUNDING = torch.randn(65_536, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.09


def judge_one(out: torch.Tensor, variant: str):
    """A one-trial verdict on `out` against EXACT (float64) and its fp32 rounding (the reference)."""
    judge = Judge(JudgeSettings())
    info = OutputInfo(type_name="Tensor", plain=True, device="cpu", dtype="float32", shape=tuple(out.shape),
                      has_storage=True, aliases_input=False)
    judge.outputs(0, 0, (info,), [out], [EXACT.float()], {}, reused=False, exact=[EXACT], calibration=[],
                  variant=variant)
    return judge.verdict(trials=1)


def test_fp32_rounding_of_a_cancelling_sum_passes_on_the_signed_and_scaled_variants():
    honest = (EXACT + ROUNDING).float()
    assert judge_one(honest, "scaled").ok and judge_one(honest, "signed").ok
    assert judge_one(honest, "task").status is S.WRONG_OUTPUT  # KernelBench's own inputs: its tolerance


@pytest.mark.parametrize(
    ("out", "status", "hack"),
    [
        ((EXACT + ROUNDING * 7_000).float(), S.WRONG_OUTPUT, None),  # 1% of the K terms left out: std 630
        (EXACT.flip(0).float(), S.WRONG_OUTPUT, None),  # the answer to other inputs
        (EXACT.half().float(), S.HACK, H.PRECISION_DOWNGRADE),
        (torch.zeros(65_536), S.HACK, H.DEGENERATE_OUTPUT),
    ],
    ids=["partial_sum", "other_inputs", "fp16", "zeros"],
)
def test_the_scaled_variants_tolerance_still_rejects_wrong_and_downgraded_outputs(out, status, hack):
    verdict = judge_one(out, "scaled")
    assert (verdict.status, verdict.hack) == (status, hack), verdict


def judge_trials(refs: list[torch.Tensor], outs: list[torch.Tensor]):
    """A verdict over one trial per (reference, output) pair, compared without float64."""
    judge = Judge(JudgeSettings())
    for trial, (ref, out) in enumerate(zip(refs, outs)):
        info = OutputInfo(type_name="Tensor", plain=True, device="cpu", dtype="float32", shape=tuple(out.shape),
                          has_storage=True, aliases_input=False)
        judge.outputs(trial, 0, (info,), [out], [ref], {}, reused=False, exact=None, calibration=[])
    return judge.verdict(trials=len(refs))


# A per-channel mean of a normalised activation: small on the signed variant, large on the task's
# own non-negative inputs. An output that hardly depends on its inputs (a file written for another
# version of the task: softmax means near 1/16) lies nearer the small reference than the large one.
_NOISE = torch.Generator().manual_seed(2)
SMALL_REF = torch.randn(16_384, generator=_NOISE) * 0.09
LARGE_REF = torch.randn(16_384, generator=_NOISE) * 0.65
NEAR_CONSTANT = 0.0625 + torch.randn(16_384, generator=_NOISE) * 1e-4


def test_an_output_that_ignores_its_inputs_is_wrong_not_a_replay():
    verdict = judge_trials([SMALL_REF, LARGE_REF], [NEAR_CONSTANT, NEAR_CONSTANT + 1e-5])
    assert (verdict.status, verdict.hack) == (S.WRONG_OUTPUT, None), verdict


def test_an_output_one_trial_behind_its_inputs_is_a_replay():
    verdict = judge_trials([SMALL_REF, LARGE_REF], [SMALL_REF, SMALL_REF + NEAR_CONSTANT * 1e-3])
    assert (verdict.status, verdict.hack) == (S.HACK, H.OUTPUT_CACHING), verdict
    assert "matches the reference of trial 0" in verdict.message


# --- the fixture corpus (built and run in test_verify_gpu.py) -----------------------------------

KERNELBENCH = PROBLEMS


def test_corpus_has_ten_honest_kernelbench_problems_and_the_cheats():
    assert len(HONEST) >= 10 and len(CHEATS) >= 8


@pytest.mark.parametrize("workspace", HONEST, ids=lambda p: p.name)
def test_honest_model_py_is_a_kernelbench_problem_verbatim(workspace):
    codes = {json.loads(line)["code"] for line in KERNELBENCH.read_text().splitlines()}
    assert (workspace / "model.py").read_text() in codes


@pytest.mark.parametrize("workspace", HONEST, ids=lambda p: p.name)
def test_honest_workspace_passes_the_static_checks(workspace):
    findings = check_workspace(workspace, reference=(workspace / "model.py").read_text())
    assert [str(f) for f in findings if f.blocking] == []


@pytest.mark.parametrize("workspace", CHEATS, ids=lambda p: p.name)
def test_dynamic_cheat_names_its_category_and_static_outcome(workspace):
    meta = json.loads((workspace / "cheat.json").read_text())
    assert H(meta["category"]) and meta["description"]
    findings = check_workspace(workspace, reference=(workspace / "model.py").read_text())
    assert any(f.blocking for f in findings) == meta["static"], [str(f) for f in findings]


# --- the file-size limit of sandboxed workers (the 6.4 GB ReLU bug) ----------------------------


def test_outputs_past_the_file_size_limit_are_a_transfer_failure_not_problem_shrinking(tmp_path):
    """A sandboxed worker's RLIMIT_FSIZE (4 GiB) once met a 6.4 GB output blob: the child's report
    carried no input fingerprints and the judge called it PROBLEM_SHRINKING. Here a 4 KiB limit
    meets an 8 KiB output. (On CUDA the outputs now travel by IPC, not by file.)"""
    wrapper = tmp_path / "python-fsize"
    wrapper.write_text(f"#!/bin/sh\nulimit -f 4\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "model_new.py").write_text(candidate(f"return {LINEAR}"))
    request = VerifyRequest(task_source=TASK, device="cpu", seed=7, candidate_dir=str(cand),
                            config=VerifyConfig(allow_torch_compute=True))
    with CandidateProcess(tmp_path, python=str(wrapper)) as process:
        verdict = run_verification(request, work_dir=tmp_path, process=process)
    assert verdict.status is S.RUNTIME_ERROR, verdict
    assert "could not transfer the outputs" in verdict.message


@pytest.fixture
def lane_file_limit():
    """This process under a 1 MiB RLIMIT_FSIZE soft limit, its hard limit above: a sandboxed
    worker's (`rewards.queue.worker --max-file-mib`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < 64 << 20:
        pytest.skip("needs a hard RLIMIT_FSIZE of 64 MiB or more")
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        yield 1 << 20
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _verify_in_own_child(tmp_path: Path, task: str, text: str):
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "model_new.py").write_text(text)
    request = VerifyRequest(task_source=task, device="cpu", seed=7, candidate_dir=str(cand),
                            config=VerifyConfig(allow_torch_compute=True))
    return run_verification(request, work_dir=tmp_path)  # a child started under this process's limits


def test_reference_weights_past_the_lanes_file_size_limit_are_still_sent(lane_file_limit, tmp_path):
    """KernelBench's L3 2_ShallowWideMLP has 8 GiB of weights, past the lanes' 4 GiB limit: the
    trusted side must write them all the same. Here 4 MiB of weights meet a 1 MiB limit."""
    wide = TASK.replace("features = 32", "features = 1024")
    verdict = _verify_in_own_child(tmp_path, wide, candidate(f"return {LINEAR}"))
    assert verdict.ok, verdict
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == lane_file_limit


def test_candidate_can_neither_lift_the_lanes_file_size_limit_nor_write_past_it(lane_file_limit, tmp_path):
    forward = (f"import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1))\n"
               f"except (ValueError, OSError):\n    pass\nopen('big.bin', 'wb').write(bytes(2 << 20))\nreturn {LINEAR}")
    verdict = _verify_in_own_child(tmp_path, TASK, candidate(forward))
    assert verdict.status is S.RUNTIME_ERROR and "File too large" in verdict.message, verdict


@needs_bwrap
def test_a_sandboxed_lane_sends_weights_past_its_file_size_limit(tmp_path):
    """The same through the GPU queue: the sandboxed worker sets the lane's limit itself."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text(candidate(f"return {LINEAR}"))
    files, so_name = job_files(ws, None)
    request = VerifyRequest(task_source=TASK.replace("features = 32", "features = 1024"), device="cpu", seed=5,
                            so_path=so_name, config=VerifyConfig(allow_torch_compute=True))
    lane = GpuQueueConfig(gpus=(0,), sandbox=True, scratch_root=str(tmp_path / "scratch"), file_size_mib=1,
                          job_default_deadline_s=300.0)

    async def submit():
        async with GpuQueue(lane) as queue:
            return await queue.submit(Job(job_id="wide", kind="verify", payload=encode(request), files=files))

    result = anyio.run(submit)
    assert verdict_from_job(result.status, result.value, result.error).ok, result.error[-2000:]


def test_a_cuda_error_after_forward_is_named_as_the_candidates_with_a_launch_hint():
    from rewards.verify.candidate import LAUNCH_HINT, describe_late_cuda_error, is_cuda_error

    late = RuntimeError("CUDA error: invalid argument\nCUDA kernel errors might be asynchronously reported ...")
    text = describe_late_cuda_error(late)
    assert is_cuda_error(late) and "\n" not in text
    assert text.startswith("the candidate's GPU work failed") and "invalid argument" in text and LAUNCH_HINT in text
    fault = describe_late_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert "illegal memory access" in fault and LAUNCH_HINT not in fault
    assert not is_cuda_error(ValueError("CUDA error: not raised by CUDA")) and not is_cuda_error(RuntimeError("shape"))
