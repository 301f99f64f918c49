"""The precision rule on the CPU: fp32 approximations pass, fp16/bf16/TF32 compute does not.

Past the float32 floor (2e-5), the mantissa probe (`rewards.verify.inputs.PROBES`) decides: the
candidate runs on two versions of its inputs that differ only in the mantissa bits an fp16, bf16
or TF32 conversion drops. Pure-PyTorch candidates run in one real candidate child for the module,
with `allow_torch_compute` so that the precision rule decides, as in test_verify.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rewards.verdict import HackCategory as H
from rewards.verify.compare import (
    APPROXIMATION_FLOOR,
    PROBE_MIN_ELIGIBLE,
    mantissa_change,
)
from rewards.verify.inputs import probe_inputs
from rewards.verify.judge import Judge, JudgeSettings
from rewards.verify.verifier import (
    VerifyConfig,
    VerifyRequest,
    run_verification,
)
from rewards.verify.wire import OutputInfo

HEADER = "import math\nimport numpy as np\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
ROUND10 = "def round10(t):\n    return (t.view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)\n\n"


def task(forward: str, inputs: str, *, init: str = "pass", init_inputs: str = "[]") -> str:
    return (f"{HEADER}class Model(nn.Module):\n    def __init__(self, *args):\n        super().__init__()\n"
            f"        {init}\n\n    def forward(self, *xs):\n        return {forward}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return {init_inputs}\n")


def model_new(forward: str, *, init: str = "pass", prelude: str = "") -> str:
    return (f"{HEADER}{prelude}class ModelNew(nn.Module):\n    def __init__(self, *args):\n"
            f"        super().__init__()\n        {init}\n\n    def forward(self, *xs):\n        return {forward}\n")


GELU = task("F.gelu(xs[0])", "[torch.rand(64, 4096)]")
TANH_GELU = "0.5 * xs[0] * (1 + torch.tanh(math.sqrt(2 / math.pi) * (xs[0] + 0.044715 * xs[0] ** 3)))"
# KernelBench L1/4's shape of work: a matrix-vector product over K = 2**20, one output per row.
MATVEC = task("torch.matmul(xs[0], xs[1])", "[torch.rand(32, 1 << 20), torch.rand(1 << 20, 1)]")
IN_ORDER = "torch.from_numpy(np.cumsum((xs[0] * xs[1].T).numpy(), axis=1, dtype=np.float32)[:, -1:].copy())"
LINEAR = task("torch.relu(self.linear(xs[0]))", "[torch.rand(64, 256)]",
              init="self.linear = nn.Linear(256, 256)")
LINEAR_INIT = "self.linear = nn.Linear(256, 256)"
W, B = "self.linear.weight", "self.linear.bias"


def verify(child, tmp_path: Path, task_source: str, text: str):
    cand = tmp_path / "cand"
    cand.mkdir(exist_ok=True)
    (cand / "model_new.py").write_text(text)
    request = VerifyRequest(task_source=task_source, device="cpu", seed=7, candidate_dir=str(cand),
                            config=VerifyConfig(allow_torch_compute=True))
    return run_verification(request, work_dir=tmp_path, process=child)


# --- end to end -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_source", "forward"),
    [(GELU, TANH_GELU), (MATVEC, IN_ORDER)],
    ids=["tanh_gelu", "in_order_sum_of_1M_terms"],
)
def test_honest_fp32_approximation_past_the_floor_passes(child, tmp_path, task_source, forward):
    verdict = verify(child, tmp_path, task_source, model_new(forward))
    assert verdict.ok, verdict
    assert verdict.details["precision_err"] > 2e-5  # the floor alone would reject it
    assert verdict.details["precision_allowed"] == APPROXIMATION_FLOOR
    assert verdict.details["probe_eligible"] >= PROBE_MIN_ELIGIBLE and verdict.details["probe_frozen"] == 0


@pytest.mark.parametrize(
    ("forward", "prelude"),
    [
        (f"torch.relu(F.linear(xs[0].half(), {W}.half(), {B}.half())).float()", ""),
        (f"torch.relu(F.linear(xs[0].bfloat16(), {W}.bfloat16(), {B}.bfloat16())).float()", ""),
        (f"torch.relu(F.linear(round10(xs[0]), round10({W}), {B}))", ROUND10),
        (f"torch.relu(F.linear(xs[0], {W}, {B})).half().float()", ""),
    ],
    ids=["fp16_compute", "bf16_compute", "tf32_matmul", "fp16_output"],
)
def test_reduced_precision_compute_is_a_precision_downgrade(child, tmp_path, forward, prelude):
    verdict = verify(child, tmp_path, LINEAR, model_new(forward, init=LINEAR_INIT, prelude=prelude))
    assert verdict.hack is H.PRECISION_DOWNGRADE, verdict
    assert "do not follow the inputs' low mantissa bits" in verdict.message


def test_the_probe_does_not_run_when_the_floor_passes(child, tmp_path):
    verdict = verify(child, tmp_path, GELU, model_new("F.gelu(xs[0]) * (1 + 1e-6)"))
    assert verdict.ok, verdict
    assert "probe_eligible" not in verdict.details
    assert not any(name.startswith("probe.") for name in verdict.phases_ms)


def test_inputs_a_conversion_keeps_exactly_leave_the_floor_to_decide(child, tmp_path):
    """Small integers as floats lose nothing to fp16: the probe moves no output, the floor decides."""
    integers = task("F.gelu(xs[0])", "[torch.randint(-4, 5, (64, 1024)).float()]")
    verdict = verify(child, tmp_path, integers, model_new(TANH_GELU))
    assert verdict.hack is H.PRECISION_DOWNGRADE, verdict
    assert "moved too few outputs" in verdict.message and verdict.details["probe_eligible"] == 0


# --- the probe's parts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "convert",
    [
        lambda t: t.half().float(),
        lambda t: t.bfloat16().float(),
        lambda t: (t.view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32),  # TF32, truncating
        lambda t: (t.view(torch.int32) & ~((1 << 16) - 1)).view(torch.float32),  # bf16, truncating
    ],
    ids=["fp16", "bf16", "tf32_truncated", "bf16_truncated"],
)
def test_every_conversion_maps_both_probe_inputs_to_the_same_values(convert):
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    near, rounded = probe_inputs([x.clone()], "near")[0], probe_inputs([x.clone()], "rounded")[0]
    assert not torch.equal(near, rounded)
    assert torch.equal(convert(near), convert(rounded))


def test_the_probe_leaves_other_dtypes_and_non_finite_values_alone():
    ints, doubles = torch.arange(10), torch.rand(10, dtype=torch.float64)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    out = probe_inputs([ints.clone(), doubles.clone(), special.clone(), 3], "rounded")
    assert torch.equal(out[0], ints) and torch.equal(out[1], doubles) and out[3] == 3
    assert torch.equal(out[2][:2], special[:2]) and out[2][2].isnan() and out[2][3] == 0


def test_mantissa_change_counts_frozen_outputs():
    x = torch.rand(4096, generator=torch.Generator().manual_seed(1)) + 0.5
    near, rounded = probe_inputs([x.clone()], "near")[0], probe_inputs([x.clone()], "rounded")[0]
    honest = mantissa_change(near.exp(), rounded.exp(), near.exp(), rounded.exp())
    frozen = mantissa_change(near.half().exp().float(), rounded.half().exp().float(), near.exp(), rounded.exp())
    assert honest.eligible == frozen.eligible > 3800
    assert honest.frozen == 0 and frozen.frozen == frozen.eligible and frozen.cand_change == 0.0


def _judge(error_scale: float):
    judge = Judge(JudgeSettings())
    ref = torch.randn(4096, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = (ref * (1 + error_scale)).float()
    info = OutputInfo(type_name="Tensor", plain=True, device="cpu", dtype="float32", shape=tuple(out.shape),
                      has_storage=True, aliases_input=False)
    judge.outputs(0, 0, (info,), [out], [ref.float()], {}, reused=False, exact=[ref], calibration=[1e-8])
    return judge


@pytest.mark.parametrize(("error_scale", "wanted"), [(1e-6, False), (2e-4, True), (5e-3, False)],
                         ids=["under_the_floor", "between", "past_the_approximation_floor"])
def test_the_probe_is_wanted_only_between_the_floors(error_scale, wanted):
    assert _judge(error_scale).probe_wanted() is wanted
