"""The profile handler's child protocol on a CPU machine: the trusted side ships the reference's
state and a `TimeCandidate` to a fresh `rewards.timing.profile_child`, and whatever goes wrong on the
candidate's side comes back as a `Timed(ok=False)` value with the reason, never an exception.
Timing itself needs a GPU (tests/test_env_gpu.py)."""

from __future__ import annotations

from pathlib import Path

from agentcore.types import ProfileResult
from rewards.timing.profile import Profile, ProfileRequest, time_candidate, to_profile_result
from rewards.timing.sampling import TimingConfig
from rewards.verdict import Timing

TASK = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return torch.relu(x) * self.scale
def get_inputs():
    return [torch.rand(2, 4)]
def get_init_inputs():
    return []
"""


def candidate(tmp_path: Path, body: str) -> Path:
    (tmp_path / "candidate").mkdir()
    (tmp_path / "candidate" / "model_new.py").write_text(body)
    return tmp_path


def test_a_candidate_that_fails_to_build_is_a_timed_failure(tmp_path):
    work = candidate(tmp_path, "raise RuntimeError('boom at import')\n")
    timed = time_candidate(ProfileRequest(task_source=TASK, device="cpu"), TimingConfig(), work)
    assert not timed.ok
    assert "boom at import" in timed.error


def test_a_candidate_with_other_parameters_is_built_as_verification_builds_it(tmp_path):
    """No parameter maps onto Model's: built under the same seed, not loaded, and measured (on
    this CPU machine measuring is what fails)."""
    body = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    timed = time_candidate(ProfileRequest(task_source=TASK, device="cpu"), TimingConfig(), candidate(tmp_path, body))
    assert "measure" in timed.phases_ms and "load_state" not in timed.error


def test_profile_result_carries_the_three_medians():
    def t(ms: float) -> Timing:
        return Timing.from_samples([ms], method="cuda_event+l2_flush")

    outcome = Profile(ok=True, candidate=t(1.0), eager=t(2.0), compiled=t(1.5))
    assert to_profile_result(outcome) == ProfileResult(ok=True, candidate_ms=1.0, eager_ms=2.0, compile_ms=1.5)
