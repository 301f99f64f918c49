"""The comparisons read the GPU a fixed number of times, however many chunks an output has.

Each host read of a CUDA tensor waits for the GPU; on a GPU shared by several verifiers and the
model, reads per chunk made a large output's judging take seconds. Counted on the CPU with
`bench.system.host_reads`, which sees the same calls the GPU would.
"""

from __future__ import annotations

import pytest
import torch

from bench.system import judge_reads
from bench.system.host_reads import HostReads
from rewards.verify import compare, probes


@pytest.fixture
def small_chunks(monkeypatch):
    def set_chunk(n: int) -> None:
        monkeypatch.setattr(compare, "CHUNK", n)
        monkeypatch.setattr(probes, "_CHUNK", n)
    return set_chunk


def _pair(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g)
    return ref + 1e-6 * torch.randn(n, generator=g), ref


def _reads(fn, *args, **kwargs) -> int:
    with HostReads() as reads:
        fn(*args, **kwargs)
    return reads.total


def test_host_reads_counts_reads_and_boolean_masks():
    x = torch.arange(8.0)
    with HostReads() as reads:
        float(x.sum())
        bool(x.any())
        x[x > 3]
        x[2:4]
        x.tolist()
    assert reads.by_name == {"__float__": 1, "__bool__": 1, "mask index": 1, "tolist": 1}


@pytest.mark.parametrize("fn", [compare.check_output, compare.precision_error])
def test_comparison_reads_do_not_grow_with_chunks(small_chunks, fn):
    out, ref = _pair(4096)
    small_chunks(4096)
    one = _reads(fn, out, ref)
    small_chunks(128)
    assert _reads(fn, out, ref) == one <= 4


def test_check_output_in_chunks_gives_the_same_numbers(small_chunks):
    out, ref = _pair(5000)
    out[7], out[4100] = float("nan"), ref[4100] + 1.0  # one non-finite value, one mismatch
    whole = compare.check_output(out, ref)
    small_chunks(128)
    chunked = compare.check_output(out, ref)
    assert (chunked.status, chunked.mismatches, chunked.max_abs_err) == (whole.status, whole.mismatches, whole.max_abs_err)
    assert chunked.max_rel_err == pytest.approx(whole.max_rel_err)
    assert chunked.status.value == "nan_inf" and "1 NaN/Inf" in chunked.message


def test_mismatches_and_peaks_are_counted_across_chunks(small_chunks):
    out, ref = _pair(1000)
    out[10] += 0.5
    out[900] += 2.0  # the largest error sits in the last chunk
    small_chunks(64)
    check = compare.check_output(out, ref)
    assert check.mismatches == 2 and check.max_abs_err == pytest.approx(2.0, rel=1e-5)


def test_precision_error_and_rms_agree_with_whole_tensor_math(small_chunks):
    out, ref = _pair(3000, seed=1)
    ref[5] = float("inf")
    small_chunks(100)
    finite = torch.isfinite(ref)
    r, o = ref[finite].double(), out[finite].double()
    rms = float(r.pow(2).mean().sqrt())
    assert compare.rms(ref) == pytest.approx(rms, rel=1e-12)
    assert compare.precision_error(out, ref) == pytest.approx(float(((o - r).abs() / (r.abs() + rms)).mean()), rel=1e-9)


def test_is_constant_reads_once_and_sees_a_difference_in_any_chunk(small_chunks):
    t = torch.zeros(1000)
    small_chunks(64)
    assert compare.is_constant(t) and _reads(compare.is_constant, t) == 1
    t[999] = 1.0
    assert not compare.is_constant(t)


def test_mantissa_change_reads_do_not_grow_with_chunks(small_chunks):
    cand, ref = _pair(2048, seed=2)
    args = (cand, cand + 1e-4, ref, ref + 1e-4)
    small_chunks(2048)
    whole = compare.mantissa_change(*args)
    one = _reads(compare.mantissa_change, *args)
    small_chunks(64)
    assert _reads(compare.mantissa_change, *args) == one
    chunked = compare.mantissa_change(*args)
    assert (chunked.elements, chunked.eligible, chunked.frozen) == (whole.elements, whole.eligible, whole.frozen)
    assert chunked.cand_change == pytest.approx(whole.cand_change) and whole.elements == 2048


def test_a_final_verifications_judging_reads_do_not_grow_with_chunks(small_chunks):
    small_chunks(1 << 14)
    few = judge_reads.run(1 << 16, "cpu", trials=3, pairs=1)
    small_chunks(1 << 10)
    many = judge_reads.run(1 << 16, "cpu", trials=3, pairs=1)
    assert many["chunks"] == 64 and few["chunks"] == 4
    assert many["host_reads"] == few["host_reads"]


def test_judge_reads_splits_a_call_into_the_judges_parts():
    got = judge_reads.run(1 << 12, "cpu", trials=3, pairs=1)
    assert set(got["ms_per_call_by_part"]) == {"queue", "read", "decide"} and got["process_cpu_s"] >= 0.0
    assert got["host_reads_per_call"] > 0


def test_judge_reads_sleeps_in_the_driver_only_on_cuda(capsys):
    with pytest.raises(SystemExit):
        judge_reads.main(["--blocking-sync"])
    assert "only with --device cuda" in capsys.readouterr().err
