"""Paired timing (rewards.timing.paired) on a CPU: the rotation, the order-statistic interval,
the stopping rule, the milestone that is not granted when an interval straddles its threshold,
and its reward; the round loop with fake samplers under a launch speed that drifts for all
subjects alike (pairing recovers the true ratio where two medians measured apart do not); the
profile protocol's paired messages; the stability bench's summaries. The child's paired timing
of a small task on a GPU is the `gpu` test at the end."""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import statistics
import sys
import time
import types
from pathlib import Path

import anyio
import msgspec
import pytest

from agentcore.types import ProfileResult
from bench.system import reward_stability
from rewards.evaluate import EvaluateConfig, FinalEvaluator
from rewards.queue.jobs import decode, encode
from rewards.reward import RewardConfig, score_paired, score_untimed
from rewards.timing.headroom import HeadroomWatch, required
from rewards.timing.paired import (
    PairedConfig,
    PairedSpeedup,
    PairedSubject,
    PairedTiming,
    RoundSubject,
    RoundTimes,
    compare,
    interval_ranks,
    paired_milestone,
    paired_speedup,
    paired_speedups,
    rotation,
    rounds_needed,
    run_rounds,
    samples_per_round,
    stop_reason,
    subject_warmup_s,
)
from rewards.timing.profile import (
    CACHED_NOTE,
    Measure,
    Measured,
    Prepared,
    Profile,
    ProfileRequest,
    TimeCandidate,
    Timed,
    TimePaired,
    time_paired,
    time_request_decoder,
    to_profile_result,
)
from rewards.timing.sampling import METHOD_EVENT, Run, Sample, TimingConfig, WarmUp, summarize, warm_up
from rewards.verdict import HackCategory, Timing, Verdict, VerdictStatus, reward_info, score_decoder
from rewards.verify.wire import Load

OK = Verdict(status=VerdictStatus.OK, trials=12)


def speedup(estimate: float, low: float, high: float, rounds: int = 20) -> PairedSpeedup:
    return PairedSpeedup(estimate=estimate, ci_low=low, ci_high=high, rounds=rounds, confidence=0.95)


def rounds_of(eager_ratio: float, compile_ratio: float, n: int = 12, jitter: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    return [RoundTimes(candidate_ms=1.0, eager_ms=eager_ratio * (1 + rng.uniform(-jitter, jitter)),
                       compiled_ms=compile_ratio * (1 + rng.uniform(-jitter, jitter))) for _ in range(n)]


def measurement(ms: float):
    run = Run(device_ms=[ms] * 20, host_ms=[ms + 0.02] * 20, stop="converged", seconds=0.1)
    return summarize(run, WarmUp(3, 0.2, ms), config=TimingConfig(), method=METHOD_EVENT, calls=1, flush_ms=0.06,
                     input_pool=4, l2_bytes=50 << 20, flush_bytes=256 << 20)


def paired_timing(vs_eager: PairedSpeedup, vs_compile: PairedSpeedup) -> PairedTiming:
    subjects = tuple(PairedSubject(role=role, label=label, measurement=measurement(ms), samples_per_round=4)
                     for role, label, ms in (("candidate", "", 1.0), ("eager", "ieee", vs_eager.estimate),
                                             ("compile", "ieee", vs_compile.estimate)))
    return PairedTiming(rounds=tuple(rounds_of(vs_eager.estimate, vs_compile.estimate)), stop="converged",
                        seconds=1.0, vs_eager=vs_eager, vs_compile=vs_compile, subjects=subjects,
                        method=METHOD_EVENT, config=PairedConfig())


# --- rotation and interval ---------------------------------------------------------------------


def test_rotation_is_abc_cab_bca():
    assert [rotation(r, 3) for r in range(4)] == [(0, 1, 2), (2, 0, 1), (1, 2, 0), (0, 1, 2)]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_subject_takes_every_position_equally_often(n):
    seen = [[0] * n for _ in range(n)]
    for r in range(3 * n):
        for position, subject in enumerate(rotation(r, n)):
            seen[subject][position] += 1
    assert all(count == 3 for row in seen for count in row)


def test_a_95_percent_interval_needs_six_rounds():
    assert rounds_needed(0.95) == 6
    assert interval_ranks(5, 0.95) is None
    assert interval_ranks(6, 0.95) == (0, 5)
    assert interval_ranks(10, 0.95) == (1, 8)


@pytest.mark.parametrize("n", [6, 10, 25, 60, 200])
def test_the_order_statistic_interval_has_its_coverage_exactly(n):
    lo, hi = interval_ranks(n, 0.95)
    k = lo + 1  # 1-based rank of the lower bound
    coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
    assert coverage >= 0.95
    wider = 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    assert wider < 0.95  # the next narrower interval would fall short: k is the largest rank


def test_speedup_is_the_median_of_per_round_ratios():
    s = paired_speedup([2.0, 4.0, 3.0, 6.0, 5.0, 8.0], [1.0, 2.0, 1.0, 2.0, 1.0, 2.0], 0.95)
    assert s.estimate == statistics.median([2, 2, 3, 3, 5, 4])
    assert (s.ci_low, s.ci_high) == (2.0, 5.0)  # six rounds: min and max of the ratios
    with pytest.raises(ValueError, match="need 6"):
        paired_speedup([1.0] * 5, [1.0] * 5, 0.95)


def test_config_refuses_fewer_rounds_than_an_interval_needs():
    with pytest.raises(ValueError, match="needs 6"):
        PairedConfig(min_rounds=5)
    with pytest.raises(ValueError):
        PairedConfig(min_rounds=20, max_rounds=10)


def test_samples_per_round_fill_the_round_target_within_the_cap():
    config = PairedConfig(round_target_ms=20.0, max_samples_per_round=16)
    assert samples_per_round(config, 5.0) == 4
    assert samples_per_round(config, 50.0) == 1
    assert samples_per_round(config, 0.01) == 16


def test_a_kernel_bound_subject_takes_the_shorter_share_of_a_round():
    config = PairedConfig(round_target_ms=20.0, kernel_round_target_ms=8.0, kernel_bound_ratio=0.1)
    assert samples_per_round(config, 2.7, launch_ratio=0.01) == 3  # KernelBench's L1/1 matmul
    assert samples_per_round(config, 2.7, launch_ratio=0.24) == 8  # LeNet5's launches: the full share
    assert samples_per_round(config, 2.7, launch_ratio=None) == 8  # graph mode: not measured
    assert samples_per_round(config, 2.7, launch_ratio=0.0) == 8  # no launch time measured
    assert samples_per_round(config, 50.0, launch_ratio=0.01) == 1


# --- stopping rule ---------------------------------------------------------------------------------


def test_no_stop_before_min_rounds_even_past_the_time_cap():
    config = PairedConfig(min_rounds=10, time_cap_s=1.0)
    assert stop_reason(rounds_of(1.2, 1.1, n=9), 100.0, config) is None


def test_tight_rounds_converge_at_min_rounds():
    assert stop_reason(rounds_of(1.2, 1.1, n=10, jitter=0.001), 0.5, PairedConfig(min_rounds=10)) == "converged"


def test_one_wide_interval_keeps_sampling_until_a_cap():
    config = PairedConfig(min_rounds=10, max_rounds=40, time_cap_s=5.0)
    rounds = [RoundTimes(candidate_ms=1.0, eager_ms=1.2, compiled_ms=c) for c in [1.0, 1.3] * 6]
    assert stop_reason(rounds, 1.0, config) is None
    assert stop_reason(rounds, 5.0, config) == "max_time"
    assert stop_reason(rounds * 4, 1.0, config) == "max_rounds"


# --- the round loop under a drifting launch speed -------------------------------------------------


class Drift:
    """A fake clock and a launch-speed factor that random-walks between 1x and 2x over time, the
    same for every subject at a given moment (what a VM's CPU does to launch-bound models)."""

    def __init__(self, seed: int) -> None:
        self.rng, self.now, self.factor = random.Random(seed), 0.0, 1.0 + random.Random(seed).random()

    def clock(self) -> float:
        return self.now

    def sampler(self, base_ms: float, noise: float = 0.01):
        def sample(i: int) -> Sample:
            self.factor = min(2.0, max(1.0, self.factor * math.exp(self.rng.gauss(0, 0.003))))
            ms = base_ms * self.factor * (1 + self.rng.gauss(0, noise))
            self.now += (ms + 0.1) / 1e3
            return Sample(device_ms=ms, host_ms=ms + 0.05, launch_ms=0.95 * ms)

        return sample


def paired_run(seed: int, true_ratio: float = 1.10, config: PairedConfig = PairedConfig()):
    drift = Drift(seed)
    subjects = [RoundSubject("candidate", drift.sampler(5.0 / true_ratio), 4),
                RoundSubject("eager", drift.sampler(5.0), 4), RoundSubject("compile", drift.sampler(4.0), 4)]
    return run_rounds(subjects, config, clock=drift.clock)


def test_pairing_recovers_the_true_ratio_under_a_common_drift():
    covered, estimates = 0, []
    for seed in range(60):
        run = paired_run(seed)
        vs_eager, _ = paired_speedups(run.rounds, 0.95)
        covered += vs_eager.ci_low <= 1.10 <= vs_eager.ci_high
        estimates.append(vs_eager.estimate)
    assert covered >= 0.9 * 60
    assert max(estimates) / min(estimates) < 1.03


def test_two_medians_measured_apart_carry_the_drift():
    ratios = []
    for seed in range(20):
        eager, candidate = Drift(seed), Drift(1000 + seed)  # two processes, two moments
        e = statistics.median(eager.sampler(5.0)(i).device_ms for i in range(50))
        c = statistics.median(candidate.sampler(5.0 / 1.10)(i).device_ms for i in range(50))
        ratios.append(e / c)
    assert max(ratios) / min(ratios) > 1.3
    assert sum(abs(r / 1.10 - 1) > 0.05 for r in ratios) >= 5  # the milestone would be a coin flip


def test_the_check_between_rounds_runs_where_asked_and_costs_the_time_cap_nothing():
    now = [0.0]
    seen = []

    def sample(ms):
        def take(i):
            now[0] += ms / 1e3
            return Sample(device_ms=ms, host_ms=ms, launch_ms=0.0)
        return take

    def between(n):
        seen.append(n)
        now[0] += 100.0  # a slow check: were it counted, the time cap would stop the rounds at once

    subjects = [RoundSubject("candidate", sample(1.0), 1), RoundSubject("eager", sample(1.3), 1),
                RoundSubject("compile", sample(1.1), 1)]
    run = run_rounds(subjects, PairedConfig(min_rounds=10, time_cap_s=1.0), clock=lambda: now[0], between=between)
    assert seen == list(range(1, len(run.rounds) + 1)) and run.elapsed_s < 1.0


def test_rounds_record_every_sample_and_stop_with_a_reason():
    run = paired_run(3)
    assert run.stop in ("converged", "max_rounds", "max_time")
    assert len(run.rounds) >= PairedConfig().min_rounds
    assert [len(d) for d in run.device_ms] == [4 * len(run.rounds)] * 3
    assert all(launch == pytest.approx(0.95 * d, rel=1e-9) for launch, d in zip(run.launch_ms[0], run.device_ms[0]))


def test_the_round_loop_needs_one_candidate_and_both_baselines():
    drift = Drift(0)
    with pytest.raises(ValueError):
        run_rounds([RoundSubject("candidate", drift.sampler(1.0), 1), RoundSubject("eager", drift.sampler(1.0), 1)],
                   PairedConfig(), clock=drift.clock)


# --- the decision and its reward ----------------------------------------------------------------


def test_outcome_is_decided_by_the_whole_interval():
    t = 1 / 0.95
    assert compare(speedup(1.2, 1.15, 1.25), 0.05) == "beaten"
    assert compare(speedup(1.0, 0.98, 1.02), 0.05) == "not_beaten"
    assert compare(speedup(1.06, 1.04, 1.08), 0.05) == "inconclusive"
    assert compare(speedup(1.06, t, 1.08), 0.05) == "inconclusive"  # a bound on the threshold does not clear it
    assert compare(speedup(1.0, 0.9, t), 0.05) == "not_beaten"


def test_an_inconclusive_eager_comparison_gives_the_lower_milestone_and_says_why():
    m = paired_milestone(speedup(1.06, 1.04, 1.08), speedup(1.2, 1.15, 1.25), 0.05)
    assert (m.level, m.vs_eager, m.inconclusive) == (1, "inconclusive", True)
    assert "eager" in m.note and "[1.0400, 1.0800]" in m.note and "1.0526" in m.note


def test_an_inconclusive_compile_comparison_stops_at_milestone_two():
    m = paired_milestone(speedup(1.3, 1.25, 1.35), speedup(1.06, 1.04, 1.08), 0.05)
    assert (m.level, m.vs_compile, m.inconclusive) == (2, "inconclusive", True)
    assert "torch.compile" in m.note


def test_an_inconclusive_compile_comparison_costs_nothing_when_eager_was_not_beaten():
    m = paired_milestone(speedup(1.0, 0.99, 1.01), speedup(1.06, 1.04, 1.08), 0.05)
    assert (m.level, m.inconclusive, m.note) == (1, False, "")


@pytest.mark.parametrize("eager, compiled, level", [
    (speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25), 3),
    (speedup(1.3, 1.25, 1.35), speedup(1.0, 0.98, 1.02), 2),
    (speedup(1.0, 0.98, 1.02), speedup(1.2, 1.15, 1.25), 1),
])
def test_decided_intervals_give_the_papers_milestones(eager, compiled, level):
    assert paired_milestone(eager, compiled, 0.05).level == level


def test_score_paired_keeps_the_papers_rewards_and_records_the_intervals():
    s = score_paired(OK, paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.06, 1.04, 1.08)))
    assert (s.reward, s.milestone, s.paired, s.inconclusive) == (2.0, 2, True, True)
    assert s.speedup_vs_eager == 1.3 and s.speedup_vs_compile_ci == (1.04, 1.08)
    assert s.breakdown["vs_compile"] == "inconclusive" and s.breakdown["inconclusive_vs_compile"] is True
    info = reward_info(s)
    assert info["inconclusive"] is True and info["timing_paired"] is True
    assert (info["speedup_vs_compile_low"], info["speedup_vs_compile_high"]) == (1.04, 1.08)
    assert info["candidate_host_ratio"] == pytest.approx(1.0 / 1.02)
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in info.values())
    assert score_decoder.decode(msgspec.json.encode(s)) == s


def test_an_untimed_score_is_milestone_one_with_no_speedup_and_says_so():
    s = score_untimed(OK)
    assert (s.reward, s.milestone, s.candidate, s.speedup_vs_eager) == (1.0, 1, None, None)
    assert s.breakdown["untimed"] and reward_info(s)["untimed"]
    failed = score_untimed(Verdict(status=VerdictStatus.WRONG_OUTPUT, message="off"))
    assert (failed.reward, failed.milestone) == (-1.0, None)
    assert score_untimed(OK, RewardConfig(mode="speedup")).reward == 0.0  # log(1): no speedup claimed


async def test_an_untimed_final_evaluation_verifies_and_never_asks_for_a_profile(tmp_path):
    """The GPU edge faked: a kernel environment whose final verification answers and whose
    timing must not be reached."""

    class VerifyingEnv:
        async def final_verdict(self, snapshot, task, build, inline=None, running=None):
            return OK

        async def time(self, *args, **kwargs):
            raise AssertionError("an untimed evaluation asked for a profile job")

    prepared = types.SimpleNamespace(verdict=None, build=None, inline=None, notes=())
    evaluator = FinalEvaluator(VerifyingEnv(), EvaluateConfig(timed=False))
    s = await evaluator.evaluate_prepared(tmp_path, types.SimpleNamespace(task_id="t"), prepared)
    assert (s.reward, s.milestone, s.breakdown["untimed"]) == (1.0, 1, True)


def test_score_paired_gives_three_for_decided_wins_and_minus_one_for_failures():
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    assert score_paired(OK, timing).reward == 3.0
    failed = Verdict(status=VerdictStatus.WRONG_OUTPUT, message="mismatch")
    assert score_paired(failed, None).reward == -1.0
    assert score_paired(failed, timing).milestone is None
    with pytest.raises(ValueError):
        score_paired(OK, None)


def test_score_paired_speedup_mode_uses_the_paired_estimates():
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    s = score_paired(OK, timing, RewardConfig(mode="speedup", speedup_baseline="best", speedup_transform="clipped"))
    assert s.reward == pytest.approx(1.2)


# --- the memory left to the baselines ---------------------------------------------------------------

GIB = 1 << 30


def probe_of(values: list[int]):
    it = iter(values)
    return lambda: next(it)


def test_headroom_below_what_the_baselines_need_is_starved_at_the_first_moment_seen():
    watch = HeadroomWatch(GIB, probe_of([40 * GIB, 30 * GIB, GIB // 10, GIB // 20]))
    watch.sample("after the warm-ups")
    assert watch.starved == ""  # 30 GiB left: plenty
    watch.sample("after round 3")
    watch.sample("after round 4")
    assert "after round 3" in watch.starved and "102 MiB free" in watch.starved
    assert f"need {required(GIB) // (1 << 20)} MiB" in watch.starved
    assert (watch.lowest, watch.lowest_at) == (GIB // 20, "after round 4")


def test_headroom_that_was_short_before_the_candidate_is_not_the_candidates_doing():
    watch = HeadroomWatch(GIB, probe_of([GIB, GIB // 2]))  # a shared GPU, say: short from the start
    watch.sample("after the warm-ups")
    assert watch.starved == "" and watch.lowest == GIB // 2


def test_what_the_timing_harness_takes_is_not_the_candidates_doing():
    # 2 GiB free before the candidate was built; the harness's input pool then takes 1.9 of it
    watch = HeadroomWatch(GIB // 16, probe_of([2 * GIB, 2 * GIB, GIB // 10, GIB // 10]))
    watch.harness_since(watch.probe())
    watch.sample("after the warm-ups")
    assert watch.starved == "" and watch.before == GIB // 10


def test_a_starved_run_decides_no_comparison_and_pays_no_speedup():
    why = "the baselines were starved of device memory after round 2: 50 MiB free"
    m = paired_milestone(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25), 0.05, starved=why)
    assert (m.level, m.vs_eager, m.vs_compile, m.inconclusive, m.note) == (1, "inconclusive", "inconclusive", True, why)
    slow = paired_milestone(speedup(1.0, 0.98, 1.02), speedup(0.9, 0.88, 0.92), 0.05, starved=why)
    assert (slow.level, slow.vs_eager, slow.inconclusive) == (1, "not_beaten", False)  # it lost nothing
    timing = msgspec.structs.replace(paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25)), starved=why)
    s = score_paired(OK, timing)
    assert (s.reward, s.milestone, s.inconclusive) == (1.0, 1, True)
    assert s.breakdown["baselines_starved"] is True and s.breakdown["inconclusive_note"] == why
    fast = score_paired(OK, timing, RewardConfig(mode="speedup", speedup_baseline="best", speedup_transform="clipped"))
    assert fast.reward == pytest.approx(1.0)  # 1.2 when the baselines had their memory
    assert score_paired(OK, msgspec.structs.replace(timing, starved="")).breakdown["baselines_starved"] is False


# --- the profile protocol --------------------------------------------------------------------------


def test_paired_timing_round_trips_in_a_profile():
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    profile = Profile(ok=True, candidate=timing.fastest("candidate").timing, paired=timing, compile_cache=b"\x00blob")
    assert decode(encode(profile), Profile) == profile


def test_a_tasks_reference_is_compiled_by_a_job_that_shares_its_gpu(tmp_path):
    """The first paired job of a task used to compile its reference while it had the GPU alone
    (every other job of the machine waiting); a job of a shared kind records the artifacts first.
    On the CPU: the real queue, worker and handler, Inductor's C++ codegen for the device."""
    import anyio

    from agentcore.types import Task
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
    from rewards.timing.profile import COMPILE_HANDLER, COMPILE_KIND, reference_artifacts

    config = GpuQueueConfig(gpus=(0,), handlers={COMPILE_KIND: COMPILE_HANDLER}, job_default_deadline_s=600.0,
                            scratch_root=str(tmp_path / "scratch"), gpu_locks=False)
    assert COMPILE_KIND in config.shared_kinds

    async def compile_twice() -> tuple[bytes, bytes, object]:
        async with GpuQueue(config) as queue:
            task = Task(task_id="pointwise", source=POINTWISE_TASK.replace("8 * 1024 * 1024", "4096"))
            artifacts = await reference_artifacts(queue, task, device="cpu")
            broken = await reference_artifacts(queue, Task(task_id="broken", source="import torch\n"), device="cpu")
            return artifacts, broken, queue.statistics()

    artifacts, broken, stats = anyio.run(compile_twice)
    assert artifacts  # Inductor's artifacts of the compile, for the paired job to load
    assert broken == b""  # a reference that cannot be built: nothing, and the paired job says why
    assert stats.jobs_done == 2 and sum(lane.exclusive_jobs for lane in stats.lanes) == 0


def test_the_child_tells_paired_from_single_requests():
    load = Load(task_source="", candidate_dir="c", so_path="", device="cuda", init_inputs="[]", init_seed=0, state={},
                transfer_dir="t")
    single = TimeCandidate(load=load, config=TimingConfig(), input_seed=1)
    paired = TimePaired(load=load, config=TimingConfig(), paired=PairedConfig(), input_seed=1, policy="fp32-ieee")
    assert time_request_decoder.decode(msgspec.msgpack.encode(single)) == single
    assert time_request_decoder.decode(msgspec.msgpack.encode(paired)) == paired


TASK = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return torch.relu(x) * self.scale
def get_inputs():
    return [torch.rand(256, 4)]
def get_init_inputs():
    return []
"""

CANDIDATE = """
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return torch.relu(x) * self.scale
"""


def workspace(tmp_path: Path) -> Path:
    (tmp_path / "candidate").mkdir()
    (tmp_path / "candidate" / "model_new.py").write_text(CANDIDATE)
    return tmp_path


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_reference_that_cannot_be_built_in_the_child_is_not_the_candidates_failure(tmp_path):
    timed = time_paired(ProfileRequest(task_source=TASK, device="cuda", paired=True), workspace(tmp_path))
    assert not timed.ok and timed.harness_error


def _spawned(**fields) -> ProfileRequest:
    """A paired request whose child is spawned (no zygote)."""
    config = msgspec.structs.replace(ProfileRequest(task_source=TASK).config, child_launcher="spawn")
    return ProfileRequest(paired=True, config=config, **fields)


class RecordingPipe:
    """The child's end of its pipe to the parent: what it sent, and the parent's go."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, message) -> None:
        self.sent.append(message)

    def receive(self, decoder, timeout_s=None):
        self.sent.append("go")
        return Measure()


@pytest.mark.parametrize("fails", ["", "before_ready", "after_ready", "after_timing"])
def test_a_staged_child_says_it_is_ready_between_building_and_timing(monkeypatch, fails):
    from rewards.timing import profile_child

    def fake_time_paired(msg, ready, measured):
        if fails == "before_ready":
            return Timed(ok=False, error="no ModelNew")
        ready()
        if fails == "after_ready":
            return Timed(ok=False, error="raised while timed")
        measured()
        measured()  # said once only
        return Timed(ok=fails == "", diverged="the last check failed" if fails else "")

    monkeypatch.setattr(profile_child, "_time_paired", fake_time_paired)
    load = Load(task_source="", candidate_dir="c", so_path="", device="cuda", init_inputs="[]", init_seed=0, state={},
                transfer_dir="t")
    msg = TimePaired(load=load, config=TimingConfig(), paired=PairedConfig(), input_seed=1, policy="fp32-ieee",
                     staged=True)
    pipe = RecordingPipe()
    answer = profile_child.time_paired(msg, pipe)
    if fails == "before_ready":  # its one answer: what it ends with, as the first (Prepared) frame
        assert pipe.sent == [] and answer == Prepared(failed=Timed(ok=False, error="no ModelNew"))
    else:  # Measured before the Timed, whether the timing ended or raised
        assert pipe.sent == [Prepared(), "go", Measured()] and isinstance(answer, Timed)
        assert answer.ok == (fails == "")
    unstaged = RecordingPipe()
    assert isinstance(profile_child.time_paired(msgspec.structs.replace(msg, staged=False), unstaged), Timed)
    assert unstaged.sent == []


FAKE_STAGED_CHILD = """
import argparse, time
from rewards.timing.profile import Measured, Prepared, Timed, measure_decoder, time_request_decoder
from rewards.verify.wire import Pipe

parser = argparse.ArgumentParser()
parser.add_argument("--read-fd", type=int)
parser.add_argument("--write-fd", type=int)
args = parser.parse_args()
pipe = Pipe(args.read_fd, args.write_fd)
pipe.receive(time_request_decoder)
pipe.send(Prepared())
pipe.receive(measure_decoder)
pipe.send(Measured())
time.sleep(0.2)  # its last check, beside other jobs
pipe.send(Timed(ok=True, error=repr(time.time())))
"""


def test_the_parent_shares_the_gpu_again_once_its_staged_child_says_measured(tmp_path, monkeypatch):
    from rewards.timing.profile import ProfileChild

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_staged_child.py").write_text(FAKE_STAGED_CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))

    class FakeChild(ProfileChild):
        module = "fake_staged_child"

    events: list[tuple[str, float]] = []
    load = Load(task_source="", candidate_dir="c", so_path="", device="cuda", init_inputs="[]", init_seed=0, state={},
                transfer_dir="t")
    msg = TimePaired(load=load, config=TimingConfig(), paired=PairedConfig(), input_seed=1, policy="fp32-ieee",
                     staged=True)
    child = FakeChild(tmp_path)
    child.start()
    try:
        timed = child.time(msg, 30.0, gpu_alone=lambda: events.append(("alone", time.time())) or 0.0,
                           gpu_shared=lambda: events.append(("shared", time.time())))
    finally:
        child.close()
    assert timed.ok and [e for e, _ in events] == ["alone", "shared"]
    assert events[1][1] < float(timed.error)  # shared before the child's last check ended


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_staged_child_whose_reference_cannot_be_built_never_asks_for_the_gpu(tmp_path):
    asked: list[float] = []
    timed = time_paired(_spawned(task_source=TASK, device="cuda"), workspace(tmp_path),
                        gpu_alone=lambda: asked.append(1.0) or 0.0)
    assert not timed.ok and timed.harness_error and asked == []


@pytest.mark.gpu
def test_a_staged_child_asks_for_the_gpu_alone_once_all_three_are_built(tmp_path):
    from rewards.timing.profile import run_profile

    asked: list[str] = []

    def gpu_alone() -> float:
        asked.append("alone")
        return 0.25

    outcome = run_profile(_spawned(task_source=TASK), work_dir=workspace(tmp_path), gpu_alone=gpu_alone,
                          gpu_shared=lambda: asked.append("shared"))
    assert outcome.ok and asked[:2] == ["alone", "shared"], outcome.message  # shared once it said Measured
    assert outcome.phases_ms["child.gpu_alone_wait"] == 250.0
    assert outcome.phases_ms["child.reference.compile"] > 0 and outcome.phases_ms["child.build"] > 0
    assert outcome.phases_ms["child.measure.after_check"] > 0
    broken = tmp_path / "broken"
    (broken / "candidate").mkdir(parents=True)
    (broken / "candidate" / "model_new.py").write_text("raise RuntimeError('no model here')\n")
    asked.clear()
    failed = run_profile(_spawned(task_source=TASK), work_dir=broken, gpu_alone=gpu_alone)
    assert not failed.ok and "no model here" in failed.message and asked == []  # it never asked


def test_the_profile_tool_says_when_the_baselines_are_cached():
    t = Timing.from_samples([1.0], method=METHOD_EVENT)
    fresh = to_profile_result(Profile(ok=True, candidate=t, eager=t, compiled=t))
    cached = to_profile_result(Profile(ok=True, candidate=t, eager=t, compiled=t, baselines_cached=True))
    assert fresh == ProfileResult(ok=True, candidate_ms=1.0, eager_ms=1.0, compile_ms=1.0)
    assert cached.message == CACHED_NOTE


def test_the_final_evaluation_refuses_the_timing_only_harness_mode():
    t = Timing.from_samples([1.0], method=METHOD_EVENT)
    evaluator = FinalEvaluator(env=None)
    with pytest.raises(ValueError, match="harness"):
        evaluator._scored(OK, Profile(ok=True, candidate=t, eager=t, compiled=t, reference_candidate=True))


# --- what the candidate computes after its timed calls -------------------------------------------

COUNTING = """
import torch
class ModelNew(torch.nn.Module):
    calls = [0]  # a counter the verifier's dozen calls never push past the limit
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        ModelNew.calls[0] += 1
        if ModelNew.calls[0] > {limit}:
            return torch.empty_like(x).zero_()
        return torch.relu(x) * self.scale
"""


def _subjects(candidate_source: str):
    import torch

    from rewards.timing import baselines
    from rewards.timing.paired_timer import PairedCall
    from rewards.timing.profile_child import after_timing_check

    model, make_inputs = baselines.load_task(TASK, device="cpu")
    namespace: dict = {}
    exec(candidate_source, namespace)
    candidate = namespace["ModelNew"]()
    return candidate, PairedCall("eager", "ieee", model), make_inputs, after_timing_check, torch


def test_an_honest_candidate_still_computes_the_task_after_its_timed_calls():
    candidate, eager, make_inputs, check, torch = _subjects(CANDIDATE)
    for i in range(50):
        candidate(*make_inputs(i))
    with torch.no_grad():
        assert check(candidate, eager, make_inputs) == ""


def test_a_candidate_that_counts_its_calls_is_caught_after_its_timed_calls():
    candidate, eager, make_inputs, check, torch = _subjects(COUNTING.format(limit=20))
    with torch.no_grad():
        assert check(candidate, eager, make_inputs) == ""  # the verifier's first calls: the task
        for i in range(50):  # the timed calls
            candidate(*make_inputs(i))
        why = check(candidate, eager, make_inputs)
    assert why.startswith("after the timed calls, output 0 on a fresh input set:") and "outside" in why


DROPOUT_TASK = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, p=0.2, training=True)
def get_inputs():
    return [torch.rand(256, 64)]
def get_init_inputs():
    return []
"""


def test_a_task_that_draws_random_numbers_in_forward_gets_the_same_draws_in_both_calls():
    from rewards.timing import baselines
    from rewards.timing.paired_timer import PairedCall
    from rewards.timing.profile_child import after_timing_check

    reference, make_inputs = baselines.load_task(DROPOUT_TASK, device="cpu")
    candidate, _ = baselines.load_task(DROPOUT_TASK, device="cpu")
    assert after_timing_check(candidate, PairedCall("eager", "ieee", reference), make_inputs) == ""


def test_a_check_that_runs_out_of_memory_gives_no_verdict_and_a_failing_forward_diverges():
    import torch

    from rewards.timing.profile_child import checked_after_timing
    from rewards.verify.phases import Phases

    _, eager, make_inputs, _, _ = _subjects(CANDIDATE)

    def out_of_memory(x):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    def broken(x):
        raise RuntimeError("illegal memory access")

    phases = Phases()
    assert checked_after_timing(out_of_memory, eager, make_inputs, phases) == ""
    assert phases.as_dict()["measure.after_check_out_of_memory"] == 1.0
    why = checked_after_timing(broken, eager, make_inputs, Phases())
    assert why.startswith("forward failed after the timed calls") and "illegal memory access" in why


def test_a_final_evaluation_records_where_its_profile_job_spent_its_time():
    """The trajectory's record says how long the final evaluation's timing job waited in the GPU
    queue, how long it had the GPU alone and on what (its phases): a run's slow phases read from it."""
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    timed = Profile(ok=True, candidate=timing.fastest("candidate").timing, paired=timing, job_wait_s=12.5,
                    job_wall_s=4.9, phases_ms={"compile_cache": 0.0, "child.reference": 3296.8})
    scored = FinalEvaluator(env=None)._scored(OK, timed)
    assert scored.reward == score_paired(OK, timing).reward  # the times are a record, not part of the reward
    info = reward_info(scored)
    assert (info["breakdown.profile_wait_s"], info["breakdown.profile_held_s"]) == (12.5, 4.9)
    assert info["breakdown.profile_ms.child.reference"] == 3296.8 and info["breakdown.profile_ms.compile_cache"] == 0.0


class _JudgingEnv:
    """The GPU edge faked: the final verification answers `verdict`, timing answers `timed`."""

    def __init__(self, verdict: Verdict, timed: Profile | None = None) -> None:
        self.verdict, self.timed = verdict, timed

    async def final_verdict(self, snapshot, task, build, inline=None, running=None):
        return self.verdict

    async def time(self, *args, **kwargs):
        return self.timed


VERIFIED = msgspec.structs.replace(OK, job_wait_s=7.25, job_wall_s=1.75, phases_ms={"spawn": 410.0, "trials": 820.4})


@pytest.mark.parametrize("case", ["untimed", "failed", "timed"])
async def test_a_final_evaluation_records_where_its_verify_job_spent_its_time(tmp_path, case):
    """Whatever became of a verified candidate (untimed, failed, timed), the trajectory's record says
    how long the final evaluation's verify job waited in the GPU queue, held its lane, and on what."""
    verdict = VERIFIED if case != "failed" else msgspec.structs.replace(
        VERIFIED, status=VerdictStatus.WRONG_OUTPUT, message="off")
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    timed = Profile(ok=True, candidate=timing.fastest("candidate").timing, paired=timing, job_wall_s=4.9)
    evaluator = FinalEvaluator(_JudgingEnv(verdict, timed), EvaluateConfig(timed=case == "timed"))
    prepared = types.SimpleNamespace(verdict=None, build=None, inline=None, notes=())
    info = reward_info(await evaluator.evaluate_prepared(tmp_path, types.SimpleNamespace(task_id="t"), prepared))
    assert (info["breakdown.verify_wait_s"], info["breakdown.verify_held_s"]) == (7.25, 1.75), info
    assert (info["breakdown.verify_ms.spawn"], info["breakdown.verify_ms.trials"]) == (410.0, 820.4), info
    assert ("breakdown.profile_held_s" in info) == (case == "timed"), info
    assert info["untimed"] == (case == "untimed") and (info["reward"] > 0) == (case != "failed"), info


class _OverlappingEnv:
    """The GPU edge faked, in time: the verify job waits for a lane, then judges for a while; the
    profile job prepares at once and asks its gate before it would time."""

    def __init__(self, verdict: Verdict, timed: Profile, spare: bool = True) -> None:
        self.verdict, self.timed, self.spare, self.events = verdict, timed, spare, []

    def spare_lane(self) -> bool:
        return self.spare

    async def final_verdict(self, snapshot, task, build, inline=None, running=None):
        await anyio.sleep(0.05)  # waiting for a lane
        self.events.append("verify has a lane")
        if running is not None:
            running.set()
        await anyio.sleep(0.2)
        self.events.append("verdict")
        return self.verdict

    async def time(self, snapshot, task, build, *, paired=False, gate=None):
        self.events.append("profile prepares")
        if gate is not None:
            given = await gate()
            self.events.append(f"gate {given}")
            if not given:
                return Profile(ok=False, message="not profiled: withdrawn")
        return self.timed


@pytest.mark.parametrize("passes", [True, False])
async def test_the_profile_job_prepares_beside_its_verification_and_times_only_a_pass(tmp_path, passes):
    verdict = OK if passes else Verdict(status=VerdictStatus.WRONG_OUTPUT, message="off by 3")
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    env = _OverlappingEnv(verdict, Profile(ok=True, candidate=timing.fastest("candidate").timing, paired=timing))
    prepared = types.SimpleNamespace(verdict=None, build=None, inline=None, notes=())
    scored = await FinalEvaluator(env).evaluate_prepared(tmp_path, types.SimpleNamespace(task_id="t"), prepared)
    assert env.events == ["verify has a lane", "profile prepares", "verdict", f"gate {passes}"]
    assert (scored.reward, scored.milestone) == ((3.0, 3) if passes else (-1.0, None)), scored
    if not passes:
        assert scored.verdict.message == "off by 3"


@pytest.mark.parametrize("why", ["overlap off", "no spare lane"])
async def test_the_profile_job_starts_after_the_verdict_without_overlap_or_a_spare_lane(tmp_path, why):
    """Preparing beside the verification is speculation: it never takes a lane that other jobs wait for."""
    timing = paired_timing(speedup(1.3, 1.25, 1.35), speedup(1.2, 1.15, 1.25))
    env = _OverlappingEnv(OK, Profile(ok=True, candidate=timing.fastest("candidate").timing, paired=timing),
                          spare=why != "no spare lane")
    prepared = types.SimpleNamespace(verdict=None, build=None, inline=None, notes=())
    scored = await FinalEvaluator(env, EvaluateConfig(overlap=why != "overlap off")).evaluate_prepared(
        tmp_path, types.SimpleNamespace(task_id="t"), prepared)
    assert env.events == ["verify has a lane", "verdict", "profile prepares"] and scored.reward == 3.0


async def test_a_verdict_that_never_reached_the_gpu_records_no_verify_job(tmp_path):
    hack = Verdict(status=VerdictStatus.HACK, hack=HackCategory.TORCH_COMPUTE, message="torch.matmul")
    prepared = types.SimpleNamespace(verdict=hack, build=None, inline=None, notes=())
    scored = await FinalEvaluator(_JudgingEnv(VERIFIED)).evaluate_prepared(tmp_path, None, prepared)
    assert scored.reward == -1.0 and not any(k.startswith("verify_") for k in scored.breakdown), scored.breakdown


def test_diverged_timed_calls_are_output_caching_and_minus_one():
    evaluator = FinalEvaluator(env=None)
    diverged = Profile(ok=False, message="the candidate's timed calls diverged: x", diverged="x")
    score = evaluator._scored(OK, diverged)
    assert score.reward == -1 and score.verdict.hack is HackCategory.OUTPUT_CACHING
    assert "diverged" in score.verdict.message


@pytest.mark.gpu
def test_the_paired_child_checks_the_candidate_after_timing_it(tmp_path):
    from rewards.timing.profile import run_profile

    request = ProfileRequest(task_source=TASK, paired=True, config=msgspec.structs.replace(
        ProfileRequest(task_source=TASK).config, child_launcher="spawn"))
    ws = workspace(tmp_path)
    (ws / "candidate" / "model_new.py").write_text(COUNTING.format(limit=20))
    outcome = run_profile(request, work_dir=ws)
    assert not outcome.ok and outcome.diverged, outcome.message


# --- measure_paired with the GPU faked ------------------------------------------------------------


class NoClocks:
    def __call__(self) -> None:
        return None

    def max_sm_clock_mhz(self) -> None:
        return None


class FakeGpu:
    """The edge of `rewards.timing.gpu_timer.Gpu`: a sample is the call's return value in ms."""

    index, l2_bytes = 0, 50 << 20
    launch_share = 0.9  # of the call's device time its launch takes: launch-bound

    def __init__(self, config: TimingConfig) -> None:
        self.flush_buffer = types.SimpleNamespace(numel=lambda: 256 << 20)
        self.clocks = NoClocks()

    def timed(self, call) -> Sample:
        ms = call()
        return Sample(device_ms=ms, host_ms=ms + 0.02, launch_ms=self.launch_share * ms)

    def flush_ms(self) -> float:
        return 0.06

    def clock_ready(self, config):
        return None


def test_measure_paired_times_every_subject_in_rounds_and_reports_why_no_graph(monkeypatch):
    from rewards.timing import paired_timer

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext())))
    monkeypatch.setattr(paired_timer, "Gpu", FakeGpu)
    rng = random.Random(0)
    calls = [paired_timer.PairedCall("candidate", "", lambda x: 1.0 * (1 + rng.gauss(0, 0.002))),
             paired_timer.PairedCall("eager", "ieee", lambda x: 1.3 * (1 + rng.gauss(0, 0.002))),
             paired_timer.PairedCall("compile", "ieee", lambda x: 1.1 * (1 + rng.gauss(0, 0.002)))]
    config = TimingConfig(warmup_s=0.01, graph="never")
    released = []  # the subjects' input pool and buffers go once the rounds are summarised
    monkeypatch.setattr(paired_timer.SubjectTimer, "release", lambda self: released.append(1))
    seen_at_check = []
    # built: 50 GiB; the harness's pool and flush buffer take 1; the candidate takes it after the warm-ups
    headroom = [50 * GIB, 50 * GIB, 49 * GIB, 49 * GIB] + [GIB // 8] * 100
    watch = HeadroomWatch(GIB // 4, probe_of(headroom))
    timing = paired_timer.measure_paired(calls, lambda i: (i,), config, PairedConfig(),
                                         check=lambda: seen_at_check.append(len(released)), headroom=watch,
                                         timed=lambda: seen_at_check.append("timed"))
    assert "after round 1:" in timing.starved and timing.baseline_need_bytes == GIB // 4
    assert timing.lowest_headroom_bytes == GIB // 8
    # between two rounds drawn at random and after the last timed call (said by `timed`), before anything
    # of the rounds was released
    assert seen_at_check == [0] * PairedConfig().checks_between_rounds + ["timed", 0]
    assert timing.stop == "converged" and len(timing.rounds) == PairedConfig().min_rounds
    assert timing.vs_eager.estimate == pytest.approx(1.3, rel=0.01)
    assert timing.vs_compile.ci_low <= timing.vs_compile.estimate <= timing.vs_compile.ci_high
    assert [s.role for s in timing.subjects] == ["candidate", "eager", "compile"]
    m = timing.fastest("eager")
    assert m.launch_ratio == pytest.approx(0.9) and m.timing.host_ratio == pytest.approx(1.3 / 1.32, rel=0.01)
    assert m.graph_info_ms is None and m.graph_info_error  # launch-bound, but no CUDA here to capture a graph
    assert decode(encode(timing), PairedTiming) == timing


def test_measure_paired_gives_kernel_bound_subjects_shorter_rounds(monkeypatch):
    from rewards.timing import paired_timer

    class KernelBoundGpu(FakeGpu):
        launch_share = 0.02

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext())))
    calls = [paired_timer.PairedCall(role, "", lambda x, ms=ms: ms)
             for role, ms in (("candidate", 2.7), ("eager", 2.7), ("compile", 2.7))]
    config, paired = TimingConfig(warmup_s=0.01, graph="never"), PairedConfig(graph_info=False)
    per_round = {}
    for gpu in (FakeGpu, KernelBoundGpu):
        monkeypatch.setattr(paired_timer, "Gpu", gpu)
        timing = paired_timer.measure_paired(calls, lambda i: (i,), config, paired)
        per_round[gpu.launch_share] = {s.samples_per_round for s in timing.subjects}
        assert {s.measurement.timing.samples for s in timing.subjects} == {len(timing.rounds) * min(per_round[gpu.launch_share])}
    assert per_round == {0.9: {8}, 0.02: {3}}


def test_only_the_first_subject_warms_up_by_the_timing_config():
    timing, paired = TimingConfig(warmup_s=0.2), PairedConfig(subject_warmup_ms=20.0)
    assert [subject_warmup_s(timing, paired, k) for k in range(3)] == [0.2, 0.02, 0.02]
    assert subject_warmup_s(TimingConfig(warmup_s=0.01), paired, 1) == 0.01  # never longer than the first


def test_a_later_subject_warms_up_in_a_few_calls_of_its_own_length():
    """A 2.67 ms call, 2.8 ms a sample with the flush and the synchronize: 73 calls for the first
    subject, 9 for each later one; a 1 s call makes warmup_min_calls calls either way."""
    timing, paired = TimingConfig(), PairedConfig()

    def calls(call_ms: float, position: int) -> int:
        now = [0.0]

        def sample(i: int) -> Sample:
            now[0] += call_ms / 1e3 + 0.13e-3
            return Sample(device_ms=call_ms, host_ms=call_ms + 0.13)

        config = msgspec.structs.replace(timing, warmup_s=subject_warmup_s(timing, paired, position))
        return warm_up(sample, config, clock=lambda: now[0]).calls

    assert (calls(2.67, 0), calls(2.67, 1), calls(2.67, 2)) == (73, 9, 9)
    assert calls(1000.0, 0) == calls(1000.0, 1) == timing.warmup_min_calls


def test_measure_paired_warms_up_the_first_subject_by_time_and_the_rest_briefly(monkeypatch):
    from rewards.timing import paired_timer

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext())))
    monkeypatch.setattr(paired_timer, "Gpu", FakeGpu)
    calls = [paired_timer.PairedCall(role, "", lambda x, ms=ms: ms)
             for role, ms in (("candidate", 1.0), ("eager", 1.3), ("compile", 1.1))]
    timing = paired_timer.measure_paired(calls, lambda i: (i,), TimingConfig(warmup_s=0.1, graph="never"),
                                         PairedConfig(subject_warmup_ms=1.0))
    first, *rest = [s.measurement.warmup_s for s in timing.subjects]
    assert first >= 0.1 and all(0.001 <= s < 0.1 for s in rest), (first, rest)


# --- the stability bench's summaries ---------------------------------------------------------------


def row(milestone: int, e: float, c: float, ci: float | None = None, inconclusive: bool = False) -> dict:
    r = {"ok": True, "wall_s": 2.0, "milestone": milestone, "speedup_vs_eager": e, "speedup_vs_compile": c}
    if ci is not None:
        r |= {"ci_vs_eager": [e * (1 - ci), e * (1 + ci)], "ci_vs_compile": [c * (1 - ci), c * (1 + ci)],
              "inconclusive": inconclusive}
    return r


def test_the_stability_bench_takes_paired_config_overrides_and_refuses_bad_ones():
    config = reward_stability.paired_config(["min_rounds=6", "round_target_ms=10"], time_cap_s=5.0)
    assert (config.min_rounds, config.round_target_ms, config.time_cap_s) == (6, 10.0, 5.0)
    for bad in (["min_rounds=3"], ["no_such_field=1"], ["min_rounds"]):
        with pytest.raises(SystemExit, match="--paired"):
            reward_stability.paired_config(bad)


def test_stability_summary_counts_agreement_spread_and_widths():
    old = [row(1, 1.0, 0.8), row(2, 1.6, 1.0), row(1, 0.9, 0.9), {"ok": False, "wall_s": 1.0, "error": "x"}]
    paired = [row(1, 1.00, 0.80, 0.01), row(1, 1.01, 0.81, 0.02), row(1, 1.02, 0.80, 0.01, inconclusive=True)]
    o, p = reward_stability.way_summary(old), reward_stability.way_summary(paired)
    assert (o["runs"], o["failed"], o["agreement"], o["modal_milestone"]) == (4, 1, 2, 1)
    assert o["spread_vs_eager"] == pytest.approx(1.6 / 0.9)
    assert p["ci_width_vs_eager_median"] == pytest.approx(0.02, rel=1e-6) and p["inconclusive"] == 1
    goals = reward_stability.targets(o, p)
    assert goals["paired_agreement_ok"] is True
    assert goals["paired_spread_ok"] == {"vs_eager": True, "vs_compile": None}
    text = reward_stability.markdown([{"task": "4_LeNet5", "candidate": "reference",
                                       "summary": {"old": o, "paired": p, "targets": goals}}], None)
    assert "| 4_LeNet5 | reference | 3 | 2 (m1)" in text and "| ok |" in text and "PairedConfig" not in text
    shorter = {"task": "4_LeNet5", "candidate": "reference", "summary": {"old": o, "paired": p, "targets": goals},
               "paired_config": msgspec.to_builtins(PairedConfig(min_rounds=6))}
    assert "Paired runs with PairedConfig min_rounds=6 (the rest default)." in reward_stability.markdown([shorter], None)


# --- on a GPU ---------------------------------------------------------------------------------------


POINTWISE_TASK = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(torch.nn.functional.gelu(x, approximate="tanh")) * 2.0
def get_inputs():
    return [torch.rand(8 * 1024 * 1024)]
def get_init_inputs():
    return []
"""

POINTWISE_CANDIDATE = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(torch.nn.functional.gelu(x, approximate="tanh")) * 2.0
"""


@pytest.mark.gpu
def test_artifacts_compiled_in_another_lanes_cache_dir_time_in_this_lane(tmp_path, monkeypatch):
    """A queue of several lanes hands one lane's Inductor artifacts to another lane's child, where
    the first lane's cache dir cannot be written. A pointwise kernel that autotunes at its first
    call used to save its choice there and fail the job (OSError in the smoke's teachers)."""
    from rewards.timing.profile import run_profile

    spawn = msgspec.structs.replace(ProfileRequest(task_source=POINTWISE_TASK).config, child_launcher="spawn")
    other_lane = tmp_path / "lane0-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(other_lane))
    first = tmp_path / "first"
    (first / "candidate").mkdir(parents=True)
    (first / "candidate" / "model_new.py").write_text(POINTWISE_CANDIDATE)
    recorded = run_profile(ProfileRequest(task_source=POINTWISE_TASK, paired=True, config=spawn), work_dir=first)
    assert recorded.ok and recorded.compile_cache, recorded.message
    shutil.rmtree(other_lane)
    other_lane.write_text("")  # unwritable as a directory, as another lane's dir is in the sandbox
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "lane1-cache"))
    second = tmp_path / "second"
    (second / "candidate").mkdir(parents=True)
    (second / "candidate" / "model_new.py").write_text(POINTWISE_CANDIDATE)
    request = ProfileRequest(task_source=POINTWISE_TASK, paired=True, config=spawn,
                             compile_cache=recorded.compile_cache)
    outcome = run_profile(request, work_dir=second)
    assert outcome.ok, outcome.message


@pytest.mark.gpu
def test_the_child_times_candidate_eager_and_compile_together(tmp_path):
    from rewards.timing.profile import run_profile

    request = ProfileRequest(task_source=TASK, paired=True, config=msgspec.structs.replace(
        ProfileRequest(task_source=TASK).config, child_launcher="spawn"))
    outcome = run_profile(request, work_dir=workspace(tmp_path))
    assert outcome.ok, outcome.message
    p = outcome.paired
    assert len(p.rounds) >= p.config.min_rounds and p.stop in ("converged", "max_rounds", "max_time")
    assert {s.role for s in p.subjects} == {"candidate", "eager", "compile"}
    assert all(s.measurement.timing.method == p.method and s.measurement.timing.host_ratio for s in p.subjects)
    assert 0.5 < p.vs_eager.estimate < 2.0 and p.vs_eager.ci_low <= p.vs_eager.estimate <= p.vs_eager.ci_high
    assert outcome.compile_cache  # recorded by the trusted side for later requests
    assert p.starved == "" and p.lowest_headroom_bytes > p.baseline_need_bytes > 0
    assert score_paired(OK, p).milestone in (1, 2, 3)
    harness = run_profile(msgspec.structs.replace(request, candidate="reference", compile_cache=outcome.compile_cache),
                          work_dir=tmp_path)
    assert harness.ok and harness.reference_candidate and not harness.compile_cache
    assert score_paired(OK, harness.paired).milestone == 1  # the reference is not 5% faster than itself


def test_the_childs_account_of_its_reference_compile_sums_torchs_regions(monkeypatch):
    from torch._dynamo import utils as dynamo_utils

    from rewards.timing import profile_child

    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics", {"entire_frame_compile": [0.5, 0.25],
                                                                    "inductor_compile": [0.125]})
    assert profile_child._compile_seconds() == {"entire_frame_compile": 0.75, "inductor_compile": 0.125}
