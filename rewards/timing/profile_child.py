"""The profile child: `python -P -s -m rewards.timing.profile_child --read-fd R --write-fd W`.

What it is: the process that runs candidate code while it is timed. It reads one
`rewards.timing.profile.TimeCandidate`, builds ModelNew exactly as the verification child does
(`rewards.verify.candidate.build_model`: extension by path, model_new.py by path, the parent's state_dict
loaded strictly), draws input sets from the task's get_inputs under `input_seed + i` (as the
baselines do), times forward with `rewards.timing.baselines.measure_model` and answers one `Timed`.

What it is not: a judge or a verifier; the reference Model is dropped from the task namespace and
never runs here. It is a separate module from `rewards.verify.candidate` so that the verification
protocol stays untouched.

How it is used: started by `rewards.timing.profile.ProfileChild`, one per profiled candidate.
"""

from __future__ import annotations

import argparse
import sys
import time

from rewards.verify.phases import Phases, process_age_ms

_STARTUP_MS = {"interpreter": process_age_ms()}  # issue 3: where a profile job's time goes
_import_start = time.perf_counter()

import torch

from rewards.verify import probes
from rewards.timing.baselines import measure_model
from rewards.verify.candidate import _die_with_parent, build_model, describe_exception
from rewards.verify.inputs import load_task
from rewards.timing.profile import TimeCandidate, Timed, time_request_decoder
from rewards.verify.wire import ChildGone, Pipe

_STARTUP_MS["import"] = (time.perf_counter() - _import_start) * 1e3  # torch, baselines, the harness


def make_inputs_fn(source: str, input_seed: int, device: str):
    task = load_task(source, keep_model=False)

    def make_inputs(i: int) -> tuple:
        torch.manual_seed(input_seed + i)
        with torch.device(device):
            values = task.get_inputs()
        return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)

    return make_inputs


def time_candidate(msg: TimeCandidate) -> Timed:
    phases = Phases()
    phases.merge(_STARTUP_MS, prefix="")
    probes.pin_precision()  # the numerics the candidate was verified under
    try:
        with phases.phase("build"):  # CUDA context, extension, model_new.py, ModelNew, state
            model = build_model(msg.load)
            make_inputs = make_inputs_fn(msg.load.task_source, msg.input_seed, msg.load.device)
        with phases.phase("measure"):
            measurement = measure_model(model, make_inputs, msg.config)
    except BaseException as exc:  # noqa: BLE001 - a candidate that fails here is a result
        return Timed(ok=False, error=describe_exception(exc), phases_ms=phases.as_dict())
    # measure = input pool and flush buffer set-up + warm-up (clocks up) + sampling
    phases.add("measure.warmup", measurement.warmup_s * 1e3)
    phases.add("measure.sampling", measurement.sampling_s * 1e3)
    return Timed(ok=True, measurement=measurement, phases_ms=phases.as_dict())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.timing.profile_child", description=__doc__.split("\n")[0])
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    pipe = Pipe(args.read_fd, args.write_fd)
    try:
        msg = pipe.receive(time_request_decoder)
    except ChildGone:
        return 0
    pipe.send(time_candidate(msg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
