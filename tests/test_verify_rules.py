"""The verifier under the two rule sets (`rewards.verdict.Rules`), on the CPU.

Under "paper" a torch op in forward is TORCH_COMPUTE; under "kernelbench" it is partial work,
named in `details["partial"]`, and the candidate's own kernels must still do a meaningful part:
torch running every compute op of the reference, no own kernel launched, or own kernels under
`partial_min_own_share` of the GPU time are DECOY_KERNEL. The judge is fed fabricated profiler
events (the attribution rules); the end-to-end cases run a real candidate child on a small
Linear+ReLU task, where the reference's ops are audited in the trusted parent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rewards.verdict import HackCategory as H
from rewards.verdict import VerdictStatus as S
from rewards.verdict import partial_work
from rewards.verify.judge import Judge, JudgeSettings
from rewards.verify.verifier import (
    CandidateProcess,
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


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    process = CandidateProcess(tmp_path_factory.mktemp("child"))
    process.start()
    yield process
    process.close()


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


def test_a_fused_epilogue_after_a_torch_gemm_is_enough_under_kernelbench_rules():
    # a 1024x8192x8192 fp32 GEMM (about 2.7 ms) and its epilogue (about 25 us): about 1%
    assert _judge(_event(GEMM, 2700), _event("bias_relu(float*)", 25)).verdict(trials=1).ok
