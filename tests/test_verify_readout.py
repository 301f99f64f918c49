"""One host read per judged call: the comparison's statistics are queued on the device and read together.

On a CPU: queueing reads nothing and `Readout.read` reads once per device (counted with
`bench.system.host_reads`); int64 values cross to the bit and floats keep NaN and -0.0; what
`compare.queue_output` gives equals the plain functions, the device-side scaled atol included; a
judged call reads once and times its parts. On a GPU: queueing a whole comparison, with the kernels and with the torch
versions, makes no synchronisation until the read (torch's sync debug mode raises on one).
"""

from __future__ import annotations

import math

import pytest
import torch

from bench.system.host_reads import HostReads
from rewards.verify import compare, fused, probes
from rewards.verify.inputs import plan_trials
from rewards.verify.judge import Judge, JudgeSettings
from rewards.verify.readout import Readout
from rewards.verify.wire import OutputInfo


def _pair(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g) * 30
    return ref + 1e-4 * torch.randn(n, generator=g), ref


def test_readout_keeps_bits_and_reads_once():
    readout = Readout()
    floats = readout.add(torch.tensor([1.5, float("nan"), -0.0, float("inf")]))
    ints = readout.add(torch.tensor([-(2**63), 2**63 - 1, 5]))
    narrow = readout.add(torch.tensor(3, dtype=torch.int32))
    with HostReads() as reads:
        readout.read()
    assert reads.total == 1
    got = readout.floats(floats)
    assert got[0] == 1.5 and math.isnan(got[1]) and math.copysign(1.0, got[2]) == -1.0 and got[3] == math.inf
    assert readout.ints(ints) == [-(2**63), 2**63 - 1, 5] and readout.floats(narrow) == [3.0]
    assert readout.tensor(floats).dtype == torch.float64 and readout.tensor(floats).shape == (4,)
    with pytest.raises(RuntimeError):
        readout.add(torch.zeros(1))


def test_queueing_an_output_reads_nothing():
    out, ref = _pair(5000)
    readout = Readout()
    with HostReads() as reads:
        queued = compare.queue_output(out, ref, readout, exact=ref.double(), scaled_atol=True, with_samples=True)
    assert reads.total == 0
    readout.read()
    assert queued().check.status.name == "OK"


def _typical_magnitude(t: torch.Tensor) -> float:
    """The host's median |value| of the finite samples (the lower middle one of an even count)."""
    values = compare.samples(t).abs()
    values = values[torch.isfinite(values)]
    return float(values.median()) if values.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_queued_facts_equal_the_plain_functions(dtype):
    out, ref = _pair(3001, seed=1)
    out[17] = float("nan")
    out, ref = out.to(dtype), ref.to(dtype)
    readout = Readout()
    queued = compare.queue_output(out, ref, readout, with_samples=True)
    readout.read()
    facts = queued()
    assert facts.check == compare.check_output(out, ref)
    assert facts.digest == probes.fingerprint(out) and facts.ref_digest == probes.fingerprint(ref)
    assert facts.constant == compare.is_constant(out) and facts.ref_constant == compare.is_constant(ref)
    torch.testing.assert_close(facts.samples, compare.samples(out), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(facts.ref_samples, compare.samples(ref), rtol=0, atol=0, equal_nan=True)
    if dtype == torch.float32:
        assert facts.precision == compare.precision_error(out, ref)
    else:
        assert facts.precision is None  # exact dtypes have no precision floor


def test_a_shape_mismatch_is_judged_without_the_values():
    out, ref = _pair(100)
    readout = Readout()
    queued = compare.queue_output(out[:99], ref, readout)
    readout.read()
    facts = queued()
    assert facts.check.status.name == "SHAPE_MISMATCH" and facts.precision is None


@pytest.mark.parametrize("count", [4096, 4095, 1])
def test_the_scaled_atol_is_the_typical_magnitude_on_the_device(count):
    """The device's nanmedian over the samples, non-finite values left out, equals the host's median."""
    g = torch.Generator().manual_seed(count)
    ref = torch.randn(count * 3, generator=g, dtype=torch.float64) * 50
    ref[::7] = float("nan")
    ref[3::11] = float("inf")
    assert compare._atol_scale(ref).item() == max(1.0, _typical_magnitude(ref))
    assert compare._atol_scale(torch.full((10,), float("nan"))).item() == 1.0
    assert compare._atol_scale(torch.full((10,), 0.25)).item() == 1.0


def test_a_scaled_atol_admits_what_the_magnitude_allows():
    ref = torch.linspace(100.0, 200.0, 4096)
    out = ref + 1.0  # within atol + rtol x |ref| >= 1.01 everywhere
    out[5] = ref[5] + 2.0  # past 1e-2 + 1e-2 x ~100 = 1.01; within 1e-2 x ~150 (the median) + 1.01
    assert compare.check_output(out, ref).status.name == "WRONG_OUTPUT"
    scaled = compare.check_output(out, ref, scaled_atol=True)
    assert scaled.status.name == "OK"
    out[5] = ref[5] + 10.0
    wrong = compare.check_output(out, ref, scaled_atol=True)
    assert wrong.status.name == "WRONG_OUTPUT" and f"atol={1e-2 * _typical_magnitude(ref):g}" in wrong.message


def test_a_judged_call_reads_once():
    out, ref = _pair(1 << 14, seed=3)
    judge = Judge(JudgeSettings())
    info = OutputInfo(type_name="Tensor", plain=True, device="cpu", dtype="float32", shape=tuple(out.shape),
                      has_storage=True, aliases_input=False)
    spec = next(s for s in plan_trials(trials=3, pairs=1, seed=1, poison=True, profile=True) if s.variant != "task")
    with HostReads() as reads:
        assert judge.outputs(spec.index, 1, (info,), [out], [ref], {}, reused=False, exact=None, calibration=None,
                             variant=spec.variant)
    assert reads.total == 1  # run 1: no replay samples to look at on the host
    assert set(judge.phases.ms) == {"trial.judge.queue", "trial.judge.read", "trial.judge.decide"}

# -- on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("n", [fused.MIN_ELEMENTS + 777, 5000])  # the kernels, then the torch versions
def test_queueing_a_comparison_never_waits_for_the_gpu(n):
    g = torch.Generator(device="cuda").manual_seed(4)
    ref = torch.randn(n, device="cuda", generator=g)
    out = ref + 1e-5 * torch.randn(n, device="cuda", generator=g)
    compare.check_output(out, ref)  # loads the kernels (an NVRTC compile may synchronise)
    readout = Readout()
    torch.cuda.set_sync_debug_mode("error")
    try:
        queued = compare.queue_output(out, ref, readout, exact=ref.double(), scaled_atol=True, with_samples=True)
        wanted = compare.queue_precision(ref, ref.double(), readout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    readout.read()
    facts = queued()
    assert facts.check.status.name == "OK" and facts.digest == probes.fingerprint(out)
    assert facts.precision == pytest.approx(compare.precision_error(out, ref.double()), rel=1e-9)
    assert wanted() == pytest.approx(compare.precision_error(ref, ref.double()), rel=1e-9)
