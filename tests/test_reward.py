"""The milestone reward (rewards/README.md) and its boundary types, on hand-computed cases."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewards.reward import RewardConfig, beats, milestone, score
from rewards.verdict import (
    Finding,
    HackCategory,
    Score,
    Timing,
    Verdict,
    VerdictStatus,
    hack_verdict,
    reward_info,
    score_decoder,
)

OK = Verdict(status=VerdictStatus.OK, trials=5, max_abs_err=1e-4)
SPEEDUP = RewardConfig(mode="speedup")


def t(ms: float, *, rel_stderr: float = 0.001, method: str = "cuda_event") -> Timing:
    return Timing(
        median_ms=ms,
        mean_ms=ms,
        std_ms=0.0,
        rel_stderr=rel_stderr,
        samples=100,
        min_ms=ms,
        max_ms=ms,
        method=method,
    )


def reward_of(candidate: float, eager: float, compiled: float, config=RewardConfig()) -> float:
    return score(OK, t(candidate), t(eager), t(compiled), config).reward


# --- milestones ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "eager", "compiled", "expected"),
    [
        (1.0, 2.0, 1.5, 3.0),  # 50% and 33% faster: both baselines beaten
        (1.0, 2.0, 1.0, 2.0),  # 50% faster than eager, tied with compile
        (1.0, 1.02, 0.9, 1.0),  # 2% faster than eager, slower than compile
        (1.0, 1.0, 2.0, 1.0),  # faster than compile only: still 1 (the paper's rule)
        (2.0, 1.0, 1.0, 1.0),  # correct but twice as slow
        (1.0, 1.2, 1.1, 3.0),  # 16.7% and 9.1% faster
        (1.0, 1.2, 1.05, 2.0),  # 16.7% faster than eager, 4.8% than compile
    ],
)
def test_milestone_rewards_match_hand_computed_cases(candidate, eager, compiled, expected):
    assert reward_of(candidate, eager, compiled) == expected


@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 7.0, 20.0, 1e3])
def test_exactly_five_percent_faster_does_not_beat_a_baseline(scale):
    # (t0 - t) / t0 == 0.05 exactly is not "more than 5%", whatever the float rounding.
    assert reward_of(0.95 * scale, 1.0 * scale, 10.0 * scale) == 1.0
    assert reward_of(0.95 * scale, 10.0 * scale, 1.0 * scale) == 2.0


@pytest.mark.parametrize("scale", [1e-3, 1.0, 20.0])
def test_just_over_five_percent_faster_beats_a_baseline(scale):
    assert reward_of(0.9499 * scale, 1.0 * scale, 1.0 * scale) == 3.0


def test_beats_uses_medians_against_the_margin():
    assert beats(t(1.0), t(0.94), RewardConfig())
    assert not beats(t(1.0), t(0.96), RewardConfig())
    assert beats(t(1.0), t(0.96), RewardConfig(margin=0.0))


def test_stderr_sigmas_demand_a_gain_clear_of_timing_noise():
    noisy = RewardConfig(stderr_sigmas=1.0)
    # 6% gain, combined relative standard error hypot(0.02, 0.02) = 2.8%: needs 7.8%.
    assert not beats(t(1.0, rel_stderr=0.02), t(0.94, rel_stderr=0.02), noisy)
    assert beats(t(1.0, rel_stderr=0.02), t(0.90, rel_stderr=0.02), noisy)


def test_score_reports_speedups_as_baseline_over_candidate():
    s = score(OK, t(1.0), t(2.5), t(2.0))
    assert (s.speedup_vs_eager, s.speedup_vs_compile, s.milestone) == (2.5, 2.0, 3)
    assert s.breakdown["improvement_vs_eager"] == pytest.approx(0.6)


@given(
    candidate=st.floats(0.01, 100.0),
    faster=st.floats(0.01, 1.0),
    eager=st.floats(0.01, 100.0),
    compiled=st.floats(0.01, 100.0),
)
def test_a_faster_candidate_never_earns_a_lower_milestone(candidate, faster, eager, compiled):
    config = RewardConfig()
    slow = milestone(t(candidate), t(eager), t(compiled), config)
    fast = milestone(t(candidate * faster), t(eager), t(compiled), config)
    assert fast >= slow


# --- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [s for s in VerdictStatus if s is not VerdictStatus.OK])
def test_every_failed_verdict_scores_minus_one(status):
    hack = HackCategory.TORCH_COMPUTE if status is VerdictStatus.HACK else None
    verdict = Verdict(status=status, hack=hack, message="failed")
    s = score(verdict, t(0.1), t(10.0), t(10.0))  # fast timings do not rescue a failure
    assert (s.reward, s.milestone) == (-1.0, None)


def test_a_failed_verdict_needs_no_timings():
    s = score(Verdict(status=VerdictStatus.COMPILE_ERROR), None, None, None)
    assert s.reward == -1.0


def test_a_failure_scores_fail_reward_in_speedup_mode_too():
    s = score(Verdict(status=VerdictStatus.WRONG_OUTPUT), t(0.1), t(1.0), t(1.0), SPEEDUP)
    assert s.reward == SPEEDUP.fail_reward


def test_an_ok_verdict_without_timings_is_a_harness_bug():
    with pytest.raises(ValueError, match="timings"):
        score(OK, t(1.0), None, t(1.0))


def test_timings_from_different_harnesses_are_refused():
    with pytest.raises(ValueError, match="harnesses"):
        score(OK, t(1.0, method="cuda_graph"), t(2.0), t(2.0))


# --- the raw-speedup ablation ---------------------------------------------------------------------


def test_speedup_mode_log_rewards_log_of_compile_speedup():
    assert reward_of(1.0, 3.0, 2.0, SPEEDUP) == pytest.approx(math.log(2.0))


def test_speedup_mode_clips_the_speedup():
    clipped = RewardConfig(mode="speedup", speedup_transform="clipped", clip_high=4.0)
    assert reward_of(1.0, 50.0, 20.0, clipped) == 4.0
    assert reward_of(1.0, 1.5, 1.5, clipped) == 1.5


@pytest.mark.parametrize(("baseline", "expected"), [("eager", 3.0), ("best", 2.0)])
def test_speedup_mode_baseline_is_configurable(baseline, expected):
    config = RewardConfig(mode="speedup", speedup_transform="clipped", speedup_baseline=baseline)
    assert reward_of(1.0, 3.0, 2.0, config) == expected


def test_speedup_mode_keeps_a_slow_correct_kernel_above_a_failure():
    assert reward_of(100.0, 1.0, 1.0, SPEEDUP) == pytest.approx(math.log(SPEEDUP.clip_low))
    assert reward_of(100.0, 1.0, 1.0, SPEEDUP) > SPEEDUP.fail_reward


def test_speedup_mode_still_records_the_milestone():
    assert score(OK, t(1.0), t(2.0), t(1.5), SPEEDUP).milestone == 3


def test_config_refuses_a_clip_that_scores_correct_below_failure():
    with pytest.raises(ValueError, match="below a failure"):
        RewardConfig(mode="speedup", clip_low=0.1)


# --- boundary types -------------------------------------------------------------------------------


def test_timing_from_samples_matches_hand_computation():
    timing = Timing.from_samples([1.0, 2.0, 3.0], method="cuda_event")
    assert (timing.median_ms, timing.mean_ms, timing.std_ms) == (2.0, 2.0, 1.0)
    assert timing.rel_stderr == pytest.approx(1.0 / math.sqrt(3) / 2.0)
    assert (timing.min_ms, timing.max_ms, timing.samples) == (1.0, 3.0, 3)


def test_timing_rejects_a_non_positive_median():
    with pytest.raises(ValueError):
        t(0.0)


def test_verdict_hack_category_must_match_status():
    with pytest.raises(ValueError):
        Verdict(status=VerdictStatus.HACK)
    with pytest.raises(ValueError):
        Verdict(status=VerdictStatus.OK, hack=HackCategory.SIDE_STREAM)


def test_hack_verdict_names_the_first_blocking_finding():
    note = Finding(
        category=HackCategory.VENDOR_LIBRARY, file="k.cu", line=1, message="n", blocking=False
    )
    hit = Finding(category=HackCategory.SIDE_STREAM, file="k.cu", line=9, message="stream")
    verdict = hack_verdict([note, hit])
    assert (verdict.status, verdict.hack) == (VerdictStatus.HACK, HackCategory.SIDE_STREAM)
    assert "k.cu:9" in verdict.message
    assert hack_verdict([note]) is None


def test_reward_info_is_flat_scalars():
    info = reward_info(score(OK, t(1.0), t(2.0), t(1.5)))
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in info.values())
    assert (info["reward"], info["milestone"], info["status"]) == (3.0, 3, "ok")
    assert (info["candidate_ms"], info["eager_ms"], info["compile_ms"]) == (1.0, 2.0, 1.5)
    assert info["breakdown.beats_compile"] is True


def test_reward_info_keeps_the_exception_at_the_end_of_a_long_traceback():
    frames = "".join(f'  File "/work/main/rewards/verify/candidate.py", line {n}, in _trial\n' for n in range(40))
    message = f"trial 0: forward failed:\nTraceback (most recent call last):\n{frames}" \
              "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    info = reward_info(score(Verdict(status=VerdictStatus.RUNTIME_ERROR, message=message), None, None, None))
    assert len(info["message"]) <= 500
    assert info["message"].startswith("trial 0: forward failed:")
    assert info["message"].endswith("an illegal memory access was encountered")


def test_score_round_trips_through_json():
    s = score(OK, t(1.0), t(2.0), t(1.5))
    assert score_decoder.decode(msgspec.json.encode(s)) == s
    assert isinstance(s, Score)
