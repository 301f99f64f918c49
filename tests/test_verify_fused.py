"""The parent's single-pass comparison kernels (`rewards.verify.fused`) against the torch versions.

On a CPU: the kernels' source compiles with the real nvcc for every instantiation the module asks
NVRTC for, CPU tensors take the torch versions, and a fingerprint's sums taken elsewhere format
as the torch ones. On a GPU: every statistic equals the torch version's on outputs with NaN, Inf,
-0.0, mismatches and a length no block divides, for every dtype pair; the fingerprint is the
child's to the bit for every word size; the kernels run on torch's current stream.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rewards.verify import compare, fused, probes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
N = fused.MIN_ELEMENTS + 12_345  # past the threshold, and no multiple of a block


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_source_compiles_for_every_instantiation(tmp_path):
    taken = ",\n    ".join(f"(void*)&{name}" for name in fused.NAMES)
    source = tmp_path / "fused.cu"
    source.write_text(fused.SOURCE + f"\nvoid* instantiate[] = {{\n    {taken}\n}};\n")
    done = subprocess.run(["nvcc", "-c", "-std=c++14", "-arch=sm_90", "-Werror=all-warnings", str(source),
                           "-o", str(tmp_path / "fused.o")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_cpu_tensors_take_the_torch_versions():
    a = torch.randn(N)
    assert not fused.applies(a, a.clone())
    assert fused.check_stats(a, a, torch.tensor([1e-2, 1e-2])) is None
    assert fused.word_sums(a.view(torch.int32)) is None
    assert compare.check_output(a, a.clone()).status.name == "OK"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.int64, torch.uint8])
def test_the_fingerprints_sums_are_the_words_wrapping_sums(dtype):
    t = (torch.randn(1000) * 1000).to(dtype)
    words = probes.fingerprint_words(t)
    assert words.element_size() == t.element_size() and words.numel() == t.numel()
    wide = [int(x) for x in words.tolist()]
    wrap = lambda v: (v + 2**63) % 2**64 - 2**63  # noqa: E731
    by_hand = wrap(sum(wide)), wrap(sum(x * x for x in wide))
    assert probes.fingerprint(t) == probes.digest(t, *by_hand) == compare.fingerprint(t)


def test_the_rel_error_of_a_nan_reference_is_no_nan():
    ref = torch.tensor([1.0, float("nan"), 2.0])
    out = torch.tensor([1.001, float("nan"), 2.0])
    check = compare.check_output(out, ref)
    assert check.status.name == "OK" and math.isfinite(check.max_rel_err)


# -- on a GPU ---------------------------------------------------------------------------------------


def _with_specials(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[::997] = float("nan")
    t[5::1013] = float("inf")
    t[7::1019] = float("-inf")
    t[9::1021] = -0.0
    return t


def _torch(fn, *args):
    """`fn` with the kernels out of reach (the threshold past any tensor here)."""
    saved, fused.MIN_ELEMENTS = fused.MIN_ELEMENTS, 1 << 62
    try:
        return fn(*args)
    finally:
        fused.MIN_ELEMENTS = saved


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype,ref_dtype", [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                                 (torch.float64, torch.float64), (torch.float64, torch.float32)])
def test_check_stats_equal_the_torch_ones(out_dtype, ref_dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    ref = _with_specials(torch.randn(N, device="cuda", generator=gen, dtype=torch.float64))
    out = ref + 1e-3 * torch.randn(N, device="cuda", generator=gen, dtype=torch.float64)
    out[3::4099] += 0.5  # mismatches
    out[11::5003] = float("nan")  # NaN where the reference is finite (or where it is NaN: the same special)
    out[1013 * 7 + 5] = float("-inf")  # the other infinity where the reference is +inf
    out, ref = out.to(out_dtype), ref.to(ref_dtype)
    tol = compare.tolerance_for(ref.dtype)
    limits = torch.tensor([tol.atol, tol.rtol], dtype=torch.float64, device="cuda")
    got = fused.check_stats(out, ref, limits)
    assert got is not None, "the kernels did not run"
    got, want = got.tolist(), compare._float_stats(out, ref, limits).tolist()
    assert got[:2] == want[:2] and got[0] > 0 and got[1] > 0
    assert got[2] == want[2] and got[3] == want[3]
    assert _torch(compare.check_output, out, ref) == compare.check_output(out, ref)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_and_precision_equal_the_torch_ones(dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    ref = _with_specials(torch.randn(N, device="cuda", generator=gen)).to(dtype)
    out = (ref.double() * (1 + 1e-5 * torch.randn(N, device="cuda", generator=gen, dtype=torch.float64))).to(dtype)
    one = torch.ones((), dtype=torch.float64, device="cuda")
    assert fused.rms_stats(ref) is not None and fused.precision_stats(out, ref, one) is not None
    assert compare.rms(ref) == pytest.approx(_torch(compare.rms, ref), rel=1e-12)
    assert compare.precision_error(out, ref) == pytest.approx(_torch(compare.precision_error, out, ref), rel=1e-9)
    assert compare.precision_error(out.float(), ref.double()) == pytest.approx(
        _torch(compare.precision_error, out.float(), ref.double()), rel=1e-9)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool,
                                   torch.uint8, torch.int32, torch.int64])
def test_fingerprints_are_the_childs_to_the_bit(dtype):
    gen = torch.Generator(device="cuda").manual_seed(2)
    t = (torch.randn(N, device="cuda", generator=gen) * 3e4).to(dtype)  # negative words, large squares
    words = t.reshape(-1).view(torch.uint8) if dtype == torch.bool else t.reshape(-1)
    words = words.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[words.element_size()])
    assert fused.word_sums(words) is not None, "the kernels did not run"
    assert compare.fingerprint(t) == probes.fingerprint(t)
    big = torch.full((N,), -(2**62) - 12345, dtype=torch.int64, device="cuda")  # sums that wrap
    assert compare.fingerprint(big) == probes.fingerprint(big)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.int64])
def test_constant_outputs(dtype):
    t = torch.zeros(N, dtype=dtype, device="cuda")
    assert compare.is_constant(t) and _torch(compare.is_constant, t)
    t[-1] = 1
    assert fused.differing_words(t.view(torch.uint8) if dtype == torch.bool else t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])).item() == 1
    assert not compare.is_constant(t) and not _torch(compare.is_constant, t)
    nan = torch.full((N,), float("nan"), device="cuda")
    assert compare.is_constant(nan)


@cuda
@pytest.mark.gpu
def test_the_environment_can_turn_the_kernels_off(monkeypatch):
    a = torch.randn(N, device="cuda")
    limits = torch.tensor([1e-2, 1e-2], dtype=torch.float64, device="cuda")
    assert fused.check_stats(a, a, limits) is not None
    monkeypatch.setenv("CUDA_AGENT_FUSED_COMPARE", "0")
    assert fused.check_stats(a, a, limits) is None
    assert compare.check_output(a, a.clone()).status.name == "OK"


def _fresh_process(script: str) -> list[str]:
    """What `script` prints in a new interpreter (nothing compiled or turned off yet), word by word."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_profile_child_keeps_the_kernels_off():
    """A profile job's child is a fresh process per job: its two after-timing checks take the
    torch versions instead of compiling the kernels (~1 s) each time."""
    script = ("import os, sys\n"
              "from rewards.timing import profile_child\n"
              "from rewards.verify import fused\n"
              "before = fused._KERNELS.off\n"
              "request, unused = os.pipe()\n"
              "os.close(unused)  # no parent: the child's first read finds the pipe closed and returns\n"
              "_, reply = os.pipe()\n"
              "code = profile_child.main(['--read-fd', str(request), '--write-fd', str(reply)])\n"
              "print(before, fused._KERNELS.off, code)\n")
    assert _fresh_process(script) == ["False", "True", "0"]


@cuda
@pytest.mark.gpu
def test_kept_off_a_process_compares_with_torch_and_compiles_nothing():
    script = ("import torch\n"
              "from rewards.verify import compare, fused\n"
              "fused.keep_off()\n"
              "a = torch.randn(fused.MIN_ELEMENTS + 1, device='cuda')\n"
              "limits = torch.tensor([1e-2, 1e-2], dtype=torch.float64, device='cuda')\n"
              "print(fused.check_stats(a, a, limits), compare.check_output(a, a + 1).status.name, fused._KERNELS.module)\n")
    assert _fresh_process(script) == ["None", "WRONG_OUTPUT", "None"]


@cuda
@pytest.mark.gpu
def test_the_kernels_run_on_torchs_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ref = torch.randn(N, device="cuda")
        for _ in range(20):  # queue enough work that an unordered kernel would read unfinished memory
            ref = ref * 1.0001
        out = ref.clone()
        out[-1] += 1.0
        check = compare.check_output(out, ref)
    assert check.mismatches == 1 and check.max_abs_err == pytest.approx(1.0, rel=1e-3)
