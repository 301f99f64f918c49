"""The profile child: `python -P -s -m rewards.timing.profile_child --read-fd R --write-fd W`.

What it is: the process that runs candidate code while it is timed. It reads one request and
answers one `Timed`:
- `rewards.timing.profile.TimeCandidate`: build ModelNew exactly as the verification child does
  (`rewards.verify.candidate.build_model`: extension by path, model_new.py by path, the parent's
  state_dict loaded by `load_state`), draw input sets from the task's get_inputs under
  `input_seed + i` (as the baselines do) and time forward with
  `rewards.timing.baselines.measure_model`;
- `rewards.timing.profile.TimePaired`: first, before any candidate code runs, build the reference
  Model and its torch.compile from the trusted task source as `rewards.timing.baselines` does
  (same seeds, backend, mode and math modes; Inductor's artifacts from the trusted side loaded
  first), the memory one call of each takes (`rewards.timing.headroom`), then ModelNew, and time
  the three together with `rewards.timing.paired_timer.measure_paired` on one input pool,
  watching the memory the candidate leaves the baselines.
`candidate="reference"` (benchmarks of the timer only) times the task's own Model, with the state
ModelNew would get, as the candidate.

What it is not: a judge or a verifier; no output is compared here. Under TimeCandidate the
reference Model is dropped from the task namespace and never runs here. It is a separate module
from `rewards.verify.candidate` so that the verification protocol stays untouched.

How it is used: started by `rewards.timing.profile.ProfileChild`, one per profiled candidate.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rewards.verify.phases import Phases, process_age_ms

_STARTUP_MS = {"interpreter": process_age_ms()}  # where a profile job's time goes (phases)
_import_start = time.perf_counter()

import torch

from rewards.timing import baselines, headroom
from rewards.timing.baselines import measure_model
from rewards.timing.paired_timer import PairedCall, measure_paired
from rewards.timing.profile import (
    Measured,
    Prepared,
    TimeCandidate,
    Timed,
    TimePaired,
    measure_decoder,
    time_request_decoder,
)
from rewards.verify import fused, probes
from rewards.verify.candidate import _as_list, _die_with_parent, build_model, describe_exception
from rewards.verify.inputs import load_task
from rewards.verify.precision import policy, precision_flags
from rewards.verify.wire import ChildGone, Load, Pipe, lock_file_size, read_tensor

_STARTUP_MS["import"] = (time.perf_counter() - _import_start) * 1e3  # torch, baselines, the harness


def make_inputs_fn(source: str, input_seed: int, device: str):
    task = load_task(source, keep_model=False)

    def make_inputs(i: int) -> tuple:
        torch.manual_seed(input_seed + i)
        with torch.device(device):
            values = task.get_inputs()
        return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)

    return make_inputs


def reference_candidate(load: Load) -> torch.nn.Module:
    """The timing-only harness mode: the task's own Model, built and loaded as ModelNew would be."""
    task = load_task(load.task_source)
    torch.manual_seed(load.init_seed)
    model = task.Model(*ast.literal_eval(load.init_inputs))
    model.load_state_dict({name: read_tensor(Path(load.transfer_dir), ref) for name, ref in load.state.items()})
    return model.to(load.device)


def candidate_model(msg: TimeCandidate | TimePaired) -> torch.nn.Module:
    """ModelNew, its state loaded as verification loaded it (or the reference, harness mode)."""
    return reference_candidate(msg.load) if msg.candidate == "reference" else build_model(msg.load)[0]


def time_candidate(msg: TimeCandidate) -> Timed:
    phases = Phases()
    phases.merge(_STARTUP_MS, prefix="")
    probes.pin_precision()  # the numerics the candidate was verified under
    try:
        with phases.phase("build"):  # CUDA context, extension, model_new.py, ModelNew, state
            model = candidate_model(msg)
            make_inputs = make_inputs_fn(msg.load.task_source, msg.input_seed, msg.load.device)
        with phases.phase("measure"):
            measurement = measure_model(model, make_inputs, msg.config)
    except BaseException as exc:  # noqa: BLE001 - a candidate that fails here is a result
        return Timed(ok=False, error=describe_exception(exc), phases_ms=phases.as_dict())
    # measure = input pool and flush buffer set-up + warm-up (clocks up) + sampling
    phases.add("measure.warmup", measurement.warmup_s * 1e3)
    phases.add("measure.sampling", measurement.sampling_s * 1e3)
    return Timed(ok=True, measurement=measurement, phases_ms=phases.as_dict())


def baseline_calls(msg: TimePaired, phases: Phases) -> tuple[list[PairedCall], object]:
    """Eager and torch.compile of the reference under each math mode of the policy, compiled and
    warmed up here, and the task's `make_inputs`; built as `rewards.timing.baselines` builds them."""
    if msg.compile_cache_path:
        with phases.phase("reference.compile_cache"):
            torch.compiler.load_cache_artifacts(Path(msg.compile_cache_path).read_bytes())
    with phases.phase("reference.build"):  # CUDA context, Model, the compiled wrapper (no trace yet)
        model, make_inputs = baselines.load_task(msg.load.task_source, init_seed=msg.load.init_seed,
                                                 input_seed=msg.input_seed, device=msg.load.device)
        compiled = torch.compile(model, backend=baselines.COMPILE_BACKEND, mode=baselines.COMPILE_MODE)
    modes = policy(msg.policy).baseline_modes
    before = _compile_seconds()
    with phases.phase("reference.compile"):
        for mode in modes:
            with precision_flags(mode):
                baselines.compile_warmup(compiled, make_inputs)
    for name, seconds in _compile_seconds().items():
        spent = seconds - before.get(name, 0.0)
        if spent >= 1e-3:
            phases.add(f"reference.compile.torch.{name}", spent * 1e3)
    calls = [PairedCall(role, mode, fn, functools.partial(precision_flags, mode))
             for role, fn in (("eager", model), ("compile", compiled)) for mode in modes]
    return calls, make_inputs


def _compile_seconds() -> dict[str, float]:
    """torch's own account of the compiles in this process so far, seconds by region
    (`torch._dynamo.utils.compilation_time_metrics`: Dynamo's trace, AOTAutograd, Inductor's cache
    lookups and code loading; regions nest). Where a warm reference compile's second goes."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return {}
    return {name: sum(times) for name, times in compilation_time_metrics.items()}


def time_paired(msg: TimePaired, pipe: Pipe | None = None) -> Timed | Prepared:
    """The three built, then timed together. A staged message: `Prepared` on `pipe` between the
    two, the timing only once the parent's `Measure` comes (the GPU is then the job's alone), and
    `Measured` once nothing more is timed (sent before the `Timed` whatever happened after the
    `Measure`); a staged child that fails before it is ready answers `Prepared(failed=...)` instead."""
    if not msg.staged or pipe is None:
        return _time_paired(msg, lambda: None, lambda: None)
    said: set[str] = set()

    def ready() -> None:
        pipe.send(Prepared())
        said.add("prepared")
        pipe.receive(measure_decoder)

    def measured() -> None:
        if "measured" not in said:
            pipe.send(Measured())
            said.add("measured")

    timed = _time_paired(msg, ready, measured)
    if "prepared" not in said:
        return Prepared(failed=timed)
    measured()
    return timed


def _time_paired(msg: TimePaired, ready: Callable[[], None], measured: Callable[[], None]) -> Timed:
    phases = Phases()
    phases.merge(_STARTUP_MS, prefix="")
    probes.pin_precision()  # the numerics the candidate was verified under, the baselines' too
    try:
        with phases.phase("reference"):  # CUDA context, Model, its compile; no candidate code yet
            calls, make_inputs = baseline_calls(msg, phases)
            with phases.phase("reference.memory"), torch.no_grad():  # what one baseline call takes
                watch = headroom.HeadroomWatch(headroom.baseline_need(calls, make_inputs))
    except BaseException as exc:  # noqa: BLE001 - not the candidate's failure: the parent raises
        return Timed(ok=False, harness_error=True, error=describe_exception(exc), phases_ms=phases.as_dict())
    try:
        with phases.phase("build"):  # extension, model_new.py, ModelNew, state
            candidate = candidate_model(msg)
            if torch.device(msg.load.device).type == "cuda":
                torch.cuda.synchronize()  # nothing of the build still running once it says it is ready
        ready()
        checks: list[str] = []
        with phases.phase("measure"), torch.no_grad():
            paired = measure_paired([PairedCall("candidate", "", candidate), *calls], make_inputs, msg.config,
                                    msg.paired, check=lambda: checks.append(
                                        checked_after_timing(candidate, calls[0], make_inputs, phases)),
                                    headroom=watch, timed=measured)
    except BaseException as exc:  # noqa: BLE001 - a candidate that fails here is a result
        return Timed(ok=False, error=describe_exception(exc), phases_ms=phases.as_dict())
    if diverged := next((why for why in checks if why), ""):
        return Timed(ok=False, error=diverged, diverged=diverged, phases_ms=phases.as_dict())
    # measure = input pool + each subject's warm-up (after its first call) + graph captures + rounds
    phases.add("measure.warmup", sum(s.measurement.warmup_s for s in paired.subjects) * 1e3)
    phases.add("measure.rounds", paired.seconds * 1e3)
    return Timed(ok=True, measurement=paired.fastest("candidate"), paired=paired, phases_ms=phases.as_dict())


def checked_after_timing(candidate, eager: PairedCall, make_inputs, phases: Phases) -> str:
    """`after_timing_check` between or right after the rounds (the pool and flush buffer allocated,
    as for the timed calls); a candidate that raises there diverged too."""
    try:
        with phases.phase("measure.after_check"):
            return after_timing_check(candidate, eager, make_inputs)
    except torch.cuda.OutOfMemoryError:
        # the check's own input sets on top of the timing's pool (GiB-sized tasks): no verdict
        # either way; its timed calls could not tell a check from another timed call
        phases.add("measure.after_check_out_of_memory", 1.0)
        return ""
    except Exception as exc:  # noqa: BLE001 - the candidate's failure after its timed calls
        return f"forward failed after the timed calls: {describe_exception(exc).splitlines()[-1]}"


AFTER_CHECK_INPUTS = (1_000_003, 1_000_004)  # input sets no timed call drew (the pool's are 0..n-1)
AFTER_CHECK_SCALE = 10.0  # times the verifier's tolerance: this looks for other work, not precision


def after_check_tolerance(dtype) -> dict[str, float]:
    """The after-timing check's atol and rtol for outputs of `dtype`: `AFTER_CHECK_SCALE` times the
    verifier's ({} for the exact dtypes)."""
    from rewards.verify.compare import tolerance_for

    tol = tolerance_for(dtype)
    return {} if tol is None else {"atol": tol.atol * AFTER_CHECK_SCALE, "rtol": tol.rtol * AFTER_CHECK_SCALE}


def after_timing_check(candidate, eager: PairedCall, make_inputs) -> str:
    """What the candidate computes after (some of) its timed calls, on two fresh input sets,
    against the reference (`eager`, in its math mode): '' when it still does the task's work, else
    why not. The verifier saw the candidate's first calls only; one that counts its calls (a static
    counter in its binding, a `__device__` global) could compute something cheaper once timed."""
    from rewards.verdict import VerdictStatus
    from rewards.verify.compare import check_output, within_tolerance

    for index in AFTER_CHECK_INPUTS:
        # each draw reseeds: both calls get the same inputs and the same RNG state after them
        # (a task's dropout draws the same mask), and neither sees what the other wrote
        outs = _as_list(candidate(*make_inputs(index)))  # the inputs go once the call returns
        with eager.context():
            refs = _as_list(eager.fn(*make_inputs(index)))
        if len(outs) != len(refs):
            return f"forward returned {len(outs)} outputs after the timed calls, the reference {len(refs)}"
        for k, (out, ref) in enumerate(zip(outs, refs)):
            if not isinstance(ref, torch.Tensor):
                continue
            if not isinstance(out, torch.Tensor):
                return f"output {k} is a {type(out).__name__} after the timed calls"
            scale = after_check_tolerance(ref.dtype)
            if within_tolerance(out, ref, **scale):  # the usual answer, without the float64 path's cost
                continue
            check = check_output(out, ref, **scale)
            if check.status is not VerdictStatus.OK:
                return f"after the timed calls, output {k} on a fresh input set: {check.message}"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.timing.profile_child", description=__doc__.split("\n")[0])
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    lock_file_size()
    fused.keep_off()  # its after-timing check's two comparisons: the torch versions, nothing to compile
    pipe = Pipe(args.read_fd, args.write_fd)
    try:
        msg = pipe.receive(time_request_decoder)
    except ChildGone:
        return 0
    pipe.send(time_paired(msg, pipe) if isinstance(msg, TimePaired) else time_candidate(msg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
