"""Paired timing, the GPU half: `measure_paired(calls, make_inputs, config, paired)` times a
candidate and its eager and torch.compile baselines together in one process, in the rotated
rounds of `rewards.timing.paired`, each subject sampled as `rewards.timing.gpu_timer` samples one
(L2 flush, CUDA events on torch's stream, device-wide synchronize, one shared input pool).

What it is not: no model building (`rewards.timing.profile_child` builds the three subjects), no
statistics or stopping rule (`rewards.timing.paired`), no reward. Importing it does not touch CUDA.

Example (in the profile child, under torch.no_grad()):
    calls = [PairedCall("candidate", "", model_new), PairedCall("eager", "ieee", model),
             PairedCall("compile", "ieee", compiled)]
    paired = measure_paired(calls, make_inputs, TimingConfig(), PairedConfig())
    paired.vs_eager.estimate, paired.vs_eager.ci_low, paired.stop
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec

from rewards.timing import stats
from rewards.timing.gpu_timer import (
    Gpu,
    SubjectTimer,
    build_pool,
    gc_paused,
    graph_sampler,
)
from rewards.timing.headroom import HeadroomWatch
from rewards.timing.paired import (
    PairedConfig,
    PairedSubject,
    PairedTiming,
    Role,
    RoundSubject,
    paired_speedups,
    run_rounds,
    samples_per_round,
    subject_warmup_s,
)
from rewards.timing.sampling import (
    METHOD_EVENT,
    METHOD_GRAPH,
    GraphCaptureError,
    Measurement,
    Run,
    TimingConfig,
    graph_calls,
    use_graph,
)


class PairedCall(NamedTuple):
    """A subject of `measure_paired`: its role, a label (a baseline's math mode), the callable,
    and the context its calls run in (entered around its warm-up, capture and each round)."""

    role: Role
    label: str
    fn: Callable[..., Any]
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def _paired_method(calls: Sequence[PairedCall], timers: list[SubjectTimer], config: TimingConfig) -> str:
    """One method for every subject, as for cached baselines: the first eager subject's warm-up
    picks it. A baseline that cannot be captured puts everyone in event mode; a candidate that
    cannot be captured is the candidate's failure (GraphCaptureError), as in `forced` timing."""
    eager = next(t for c, t in zip(calls, timers) if c.role == "eager")
    if not use_graph(config, eager.warm.estimate_ms):
        return METHOD_EVENT
    order = sorted(range(len(calls)), key=lambda i: calls[i].role == "candidate")  # baselines first
    for i in order:
        try:
            with calls[i].context():
                timers[i].capture()
        except GraphCaptureError as exc:
            if calls[i].role == "candidate" or config.graph == "always":
                raise
            for t in timers:
                t.to_events(f"{calls[i].role} ({calls[i].label}): {exc}")
            return METHOD_EVENT
    return METHOD_GRAPH


def _graph_info(gpu: Gpu, call: PairedCall, timer: SubjectTimer, m: Measurement, paired: PairedConfig) -> Measurement:
    """`m` with the CUDA-graph time of a launch-bound subject timed with events, for information
    (never for the reward); a capture that fails is recorded, not raised."""
    if m.timing.method != METHOD_EVENT or m.launch_ratio < paired.launch_bound_ratio:
        return m
    try:
        calls = graph_calls(timer.config, m.timing.median_ms)
        with call.context():
            sampler, graph = graph_sampler(gpu, timer.fn, timer.pool, calls)
            graph_ms = stats.median([sampler(i).device_ms for i in range(paired.graph_info_samples)])
        del graph
    except Exception as exc:  # noqa: BLE001 - information only: the reason is the result
        return msgspec.structs.replace(m, graph_info_error=f"{type(exc).__name__}: {exc}"[:300])
    timing = msgspec.structs.replace(m.timing, graph_ms=graph_ms)
    return msgspec.structs.replace(m, graph_info_ms=graph_ms, timing=timing)


def measure_paired(
    calls: Sequence[PairedCall],
    make_inputs: Callable[[int], Sequence[Any]],
    config: TimingConfig,
    paired: PairedConfig,
    check: Callable[[], None] | None = None,
    headroom: HeadroomWatch | None = None,
    timed: Callable[[], None] | None = None,
) -> PairedTiming:
    """Time a candidate and its baselines together (`rewards.timing.paired`): one input pool and one
    flush buffer for all, each subject warmed up in turn (the first for TimingConfig's warm-up,
    which brings the SM clock up for all, the rest briefly: `subject_warmup_s`), one method for all
    (`_paired_method`), rotated rounds until `paired`'s stopping rule, then the informational
    CUDA-graph time of launch-bound subjects. `check` runs after `paired.checks_between_rounds`
    rounds drawn at random (untimed) and once after the last timed call (the rounds, the graph
    times), while the input pool and the flush buffer exist as they do for the timed calls.
    `timed` is called once, right after the last timed call (what follows may share the GPU).
    `headroom` (made before the candidate was built) samples the memory left to the baselines
    after the warm-ups, after every round and after the last: a starved run says so
    (`PairedTiming.starved`). Call under torch.no_grad(); a subject that raises propagates."""
    import cupy

    start = 0 if headroom is None else headroom.probe()
    gpu = Gpu(config)
    with cupy.cuda.Device(gpu.index), gc_paused():
        pool = build_pool(make_inputs, config)
        if headroom is not None:  # the flush buffer and the input pool: the harness's memory
            headroom.harness_since(start)
        timers = [SubjectTimer(gpu, c.fn, pool, config) for c in calls]
        before, flush_ms = gpu.clocks(), gpu.flush_ms()
        for position, (call, timer) in enumerate(zip(calls, timers)):
            with call.context():
                timer.warm_up(subject_warmup_s(config, paired, position))
        method = _paired_method(calls, timers, config)
        subjects = [RoundSubject(c.role, t.sample, samples_per_round(
                        paired, t.warm.estimate_ms * t.calls, t.warm.launch_ratio if t.method == METHOD_EVENT else None),
                        c.context) for c, t in zip(calls, timers)]
        if headroom is not None:
            headroom.sample("after the warm-ups")
        chosen = set()
        if check is not None:
            chosen = set(random.SystemRandom().sample(range(1, paired.min_rounds + 1), paired.checks_between_rounds))

        def between(n: int) -> None:
            if headroom is not None:
                headroom.sample(f"after round {n}")
            if n in chosen:
                check()

        run = run_rounds(subjects, paired, between=between)
        after = gpu.clocks()
        measurements = []
        for i, timer in enumerate(timers):
            own = Run(run.device_ms[i], run.host_ms[i], run.stop, run.seconds[i], run.launch_ms[i])
            measurements.append(timer.summary(own, flush_ms=flush_ms, before=before, after=after))
        if paired.graph_info:  # event-mode subjects only, which hold no graph of their own
            measurements = [_graph_info(gpu, c, t, m, paired) for c, t, m in zip(calls, timers, measurements)]
        if timed is not None:
            timed()
        if check is not None:
            check()
        for timer in timers:
            timer.release()
    vs_eager, vs_compile = paired_speedups(run.rounds, paired.confidence)
    return PairedTiming(
        rounds=tuple(run.rounds),
        stop=run.stop,
        seconds=run.elapsed_s,
        vs_eager=vs_eager,
        vs_compile=vs_compile,
        subjects=tuple(PairedSubject(role=c.role, label=c.label, measurement=m, samples_per_round=s.per_round)
                       for c, m, s in zip(calls, measurements, subjects)),
        method=method,
        config=paired,
        **({} if headroom is None else {"starved": headroom.starved, "baseline_need_bytes": headroom.need_bytes,
                                        "lowest_headroom_bytes": headroom.lowest}),
    )
