"""The candidate child: `python -P -s -m rewards.verify.candidate --read-fd R --write-fd W`.

What it is: the only process that runs candidate code during verification. It answers the
parent's messages (`rewards.verify.wire`): `Load` builds ModelNew (extension loaded by path,
model_new.py imported by path, constructed under the init seed, the parent's state_dict loaded
as far as `load_state` can map it, moved to the device); each `Trial` draws the inputs with
`rewards.verify.inputs` from the seed the parent sends, poisons the allocator, runs forward
once under the dispatch audit (or the profiler), probes what forward left behind, writes the
outputs to a blob file and reports.

What it is not: a judge. It reports observations and never decides; whatever it says can be a
lie of the candidate it hosts, which is why correctness is decided by the parent on the raw
outputs. No reference model ever runs here (its class is dropped from the task namespace), so
an allocation cannot hand the candidate a freed reference output (rewards/README.md, hack 6):
that cheat is impossible by construction.

How it is used: started by `rewards.verify.verifier.CandidateProcess`, one per verified candidate (tests
may reuse one for several pure-PyTorch candidates). The channel lives on private fds; stdout and
stderr go to a log file the parent quotes on failures. On CUDA, forward runs on a harness-created
non-blocking stream, so work a candidate puts on any other stream is not ordered with it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import ctypes
import importlib.util
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from rewards.verify.phases import Phases, process_age_ms

_STARTUP_MS = {"interpreter": process_age_ms()}  # where a verify job's time goes (phases)
_import_start = time.perf_counter()

import torch

from rewards.verify import probes
from rewards.verify.audit import OpAudit, gpu_events
from rewards.verify.inputs import TaskModule, draw_inputs, load_task, probe_inputs
from rewards.verify.wire import (
    BlobWriter,
    Bye,
    ChildGone,
    Load,
    Loaded,
    OutputInfo,
    Pipe,
    Trial,
    TrialReport,
    lock_file_size,
    parent_decoder,
    read_tensor,
    share_cuda,
)

_STARTUP_MS["import"] = (time.perf_counter() - _import_start) * 1e3  # torch and the harness
_synchronize = torch.cuda.synchronize  # bound before any candidate is imported
ERROR_CHARS = 4000


def describe_exception(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text[-ERROR_CHARS:]


LAUNCH_HINT = ("a launch with more than 1024 threads per block, a zero-sized grid, or more shared memory "
               "than a block may have fails this way")


def is_cuda_error(exc: BaseException) -> bool:
    """An error CUDA reported through torch (torch.AcceleratorError, or a RuntimeError naming it)."""
    return type(exc).__name__ == "AcceleratorError" or (isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


def describe_late_cuda_error(exc: BaseException) -> str:
    """A CUDA error that the harness's first GPU call after the candidate's forward raised. CUDA
    reports a kernel's bad launch or fault at a later call, so its traceback names harness code:
    the message names the candidate instead, with the error's own first line."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    text = f"the candidate's GPU work failed (CUDA reported it after forward returned): {first}"
    if "invalid argument" in first or "invalid configuration" in first:
        text += f"; {LAUNCH_HINT}"
    return text


def _import_model_new(path: Path):
    spec = importlib.util.spec_from_file_location("model_new", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_new"] = module
    spec.loader.exec_module(module)
    return module


def build_model(load: Load) -> tuple[torch.nn.Module, str]:
    """ModelNew(*init_inputs) under the init seed, with the reference's state_dict as far as
    `load_state` can map it; the model on the device and how its state was loaded."""
    root = Path(load.candidate_dir)
    if load.so_path:
        from rewards.build.loader import load_extension

        load_extension(root / load.so_path)
    module = _import_model_new(root / "model_new.py")
    model_cls = getattr(module, "ModelNew", None)
    if not isinstance(model_cls, type) or not issubclass(model_cls, torch.nn.Module):
        raise TypeError("model_new.py defines no class ModelNew(nn.Module)")
    torch.manual_seed(load.init_seed)
    model = model_cls(*ast.literal_eval(load.init_inputs))
    state = {name: read_tensor(Path(load.transfer_dir), ref) for name, ref in load.state.items()}
    how = load_state(model, state)
    return model.to(load.device), how


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Load the reference's state_dict into ModelNew as far as it can be mapped; say how.

    By name when both have the same names with the same shapes. Otherwise by position when the
    two lists of (shape, dtype) agree in order, or by shape when they agree as sets and every
    (shape, dtype) occurs once: ModelNew may call `conv.weight` `conv_weight`, or hold a fused
    module's parameters itself. Otherwise nothing is loaded and ModelNew keeps the values it
    was built with under the init seed, the seed the reference was built under (KernelBench's
    rule: parameters created in the same order get the same values). Naming alone never fails
    a candidate; one whose parameters differ from the reference's is judged on its outputs.
    The candidate receives the same tensors it always did, only under its own names.
    """
    own = model.state_dict()
    plan = _state_plan(own, state)
    if plan is None:
        return "same seed, not loaded"
    how, names = plan
    try:
        model.load_state_dict({mine: state[theirs] for mine, theirs in names.items()}, strict=True)
    except RuntimeError as exc:
        raise RuntimeError(f"ModelNew rejected the reference's state_dict ({how}): {exc}") from None
    return how


def _state_plan(own: dict, ref: dict) -> tuple[str, dict[str, str]] | None:
    """(how, ModelNew's name -> the reference's name), or None when no mapping is sound."""
    if own.keys() == ref.keys() and all(own[k].shape == ref[k].shape for k in own):
        return "loaded by name", {k: k for k in own}
    if not own or len(own) != len(ref):
        return None
    mine, theirs = [_signature(t) for t in own.values()], [_signature(t) for t in ref.values()]
    if mine == theirs:
        return f"mapped by position ({len(own)} tensors)", dict(zip(own, ref))
    if len(set(mine)) == len(mine) and set(mine) == set(theirs):
        by_signature = {_signature(t): name for name, t in ref.items()}
        return f"mapped by shape ({len(own)} tensors)", {k: by_signature[_signature(t)] for k, t in own.items()}
    return None


def _signature(t: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(t.shape), t.dtype


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _tensors(values: list) -> list[tuple[int, torch.Tensor]]:
    return [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError):
        return None


class Session:
    """One loaded candidate and the state carried between its forward calls."""

    def __init__(self, load: Load, model: torch.nn.Module, task: TaskModule) -> None:
        self.load, self.model, self.task = load, model, task
        self.device = torch.device(load.device)
        self.cuda = self.device.type == "cuda"
        self.stream = None
        if self.cuda:
            default = load.harness_stream == "default"
            self.stream = torch.cuda.default_stream(self.device) if default else torch.cuda.Stream(self.device)
        self.transfer = Path(load.transfer_dir)
        self.inputs: list | None = None
        self.prev_outputs: list[torch.Tensor] = []
        self.prev_fps: list[str] = []
        self.shared: list[torch.Tensor] = []  # outputs shared by IPC, alive until the next trial

    @classmethod
    def start(cls, load: Load) -> tuple[Session | None, Loaded]:
        phases = Phases()
        phases.merge(_STARTUP_MS, prefix="")
        probes.pin_precision()
        with phases.phase("warm_up"):  # torch._dynamo import, CUDA context, profiler start-up
            _warm_up(load.device)
        with phases.phase("snapshot"):
            before = probes.snapshot()
        try:
            with phases.phase("build"):  # extension, model_new.py, ModelNew, state_dict, .to(device)
                task = load_task(load.task_source, keep_model=False)
                model, state = build_model(load)
        except BaseException as exc:  # noqa: BLE001 - a candidate that fails to load is a verdict
            return None, Loaded(ok=False, error=describe_exception(exc), pid=os.getpid(), before=before,
                                phases_ms=phases.as_dict())
        session = cls(load, model, task)
        with phases.phase("snapshot"):
            after = probes.snapshot()
        return session, Loaded(ok=True, pid=os.getpid(), before=before, after=after, state=state,
                               phases_ms=phases.as_dict())

    def stream_context(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def synchronize(self) -> None:
        if self.cuda:
            _synchronize(self.device)

    def trial(self, msg: Trial) -> TrialReport:
        with self.stream_context():
            return self._trial(msg)

    def _trial(self, msg: Trial) -> TrialReport:
        # Phases (rewards.verify.phases) add no synchronize here: the fingerprints' own host
        # syncs end the GPU work of the phase before them, and the side-stream check needs the
        # harness stream's fingerprints taken before the device-wide synchronize.
        phases = Phases()
        with phases.phase("inputs"):
            inputs = self._inputs(msg)
            tensors = _tensors(inputs)
            fps = tuple(probes.fingerprint(t) for _, t in tensors)
        with phases.phase("poison"):
            poisoned = msg.poison is not None and probes.poison(str(self.device), msg.expected_nbytes, msg.poison)
        start = probes.now()
        try:
            outputs, ops, kernels, marker = self._forward(inputs, msg)
        except BaseException as exc:  # noqa: BLE001 - the candidate's failure is reported
            return TrialReport(index=msg.index, run=msg.run, ok=False, error=describe_exception(exc), input_fingerprints=fps)
        forward_ms = probes.elapsed_ms(start)
        phases.add("profiled_forward" if msg.profile and self.cuda else "forward", forward_ms)
        try:
            with phases.phase("probes"):
                plain = [o for o in outputs if type(o) is torch.Tensor]
                fp_stream = tuple(probes.fingerprint(o) for o in plain)  # ordered on the harness stream only
                self.synchronize()
                fp_device = tuple(probes.fingerprint(o) for o in plain)
                after = probes.snapshot()
                changed = tuple(i for (i, t), fp in zip(tensors, fps) if probes.fingerprint(t) != fp)
                prev_changed, same_storage = self._previous(plain, tensors)
        except Exception as exc:
            if not is_cuda_error(exc):
                raise
            return TrialReport(index=msg.index, run=msg.run, ok=False, error=describe_late_cuda_error(exc),
                               input_fingerprints=fps)
        try:
            with phases.phase("send_outputs"):
                infos = self._send_outputs(outputs, tensors, msg)
        except Exception as exc:  # noqa: BLE001 - e.g. a blob past RLIMIT_FSIZE: the harness's failure, said so
            error = f"the harness could not transfer the outputs: {describe_exception(exc)}"
            return TrialReport(index=msg.index, run=msg.run, ok=False, error=error, input_fingerprints=fps)
        self.prev_outputs, self.prev_fps = plain, list(fp_device)
        return TrialReport(
            index=msg.index, run=msg.run, ok=True, outputs=infos, input_fingerprints=fps,
            inputs_changed=changed, ops=ops, after=after, fp_stream=fp_stream,
            fp_device=fp_device, prev_changed=prev_changed, prev_same_storage=same_storage,
            kernels=tuple(kernels), marker_stream=marker, poisoned=poisoned, forward_ms=forward_ms,
            phases_ms=phases.as_dict(),
        )

    def _previous(self, plain: list[torch.Tensor], tensors: list) -> tuple[bool, bool]:
        """Did an earlier call's outputs change during this call, does an output reuse their
        memory? Outputs that alias this call's inputs are left out: the harness itself wrote
        the new inputs into reused tensors (an aliasing output is judged as the input it is)."""
        input_keys = {_storage(t) for _, t in tensors} - {None}
        kept = [(o, fp) for o, fp in zip(self.prev_outputs, self.prev_fps) if _storage(o) not in input_keys]
        changed = any(probes.fingerprint(o) != fp for o, fp in kept)
        prev_keys = {_storage(o) for o, _ in kept} - {None}
        return changed, any(_storage(o) in prev_keys for o in plain)

    def _inputs(self, msg: Trial) -> list:
        drawn = draw_inputs(self.task, seed=msg.seed, variant=msg.variant, scale=msg.scale, device=str(self.device))
        if msg.probe:
            probe_inputs(drawn, msg.probe)
        old = self.inputs
        if msg.reuse_buffers and old is not None and _same_layout(old, drawn):
            for target, value in zip(old, drawn):
                if isinstance(target, torch.Tensor):
                    target.copy_(value)
            drawn = [t if isinstance(t, torch.Tensor) else v for t, v in zip(old, drawn)]
        self.inputs = drawn
        return drawn

    def _forward(self, inputs: list, msg: Trial):
        if msg.profile and self.cuda:
            return self._profiled_forward(inputs, msg.run)
        audit = OpAudit() if msg.audit else contextlib.nullcontext()
        with torch.no_grad(), audit:
            out = self.model(*inputs)
        return _as_list(out), dict(audit.ops) if msg.audit else {}, [], None

    def _profiled_forward(self, inputs: list, run: int):
        from torch.profiler import ProfilerActivity, profile

        trace = self.transfer / f"trace-{run}.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(1000)  # the marker: its stream is the harness stream
            with torch.no_grad():
                out = self.model(*inputs)
            self.synchronize()
        prof.export_chrome_trace(str(trace))
        kernels, marker = gpu_events(trace)
        trace.unlink(missing_ok=True)
        return _as_list(out), {}, kernels, marker

    def _send_outputs(self, outputs: list, tensors: list, msg: Trial) -> tuple[OutputInfo, ...]:
        input_keys = {_storage(t) for _, t in tensors} - {None}
        infos, self.shared = [], []
        with BlobWriter(self.transfer, f"out-{msg.run}.bin") as writer:
            for out in outputs:
                info = _describe(out, input_keys, writer, self.shared if msg.share_cuda and self.cuda else None)
                infos.append(info)
        return tuple(infos)


def _warm_up(device: str) -> None:
    """Do once what the harness would otherwise do lazily inside the first trial, so that the
    baseline snapshot already shows it: the dispatch mode imports torch._dynamo, which rebinds
    torch.manual_seed (torch/_dynamo/__init__.py); CUDA and the profiler start their threads."""
    import torch._dynamo  # noqa: F401
    import torch.profiler

    with OpAudit():
        torch.empty(1, device=device)
    if torch.device(device).type == "cuda":  # the profiler's first session starts its machinery
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.empty(1, device=device).fill_(0.0)
        _synchronize(device)


def _same_layout(old: list, new: list) -> bool:
    if len(old) != len(new):
        return False
    for a, b in zip(old, new):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor) and (a.shape != b.shape or a.dtype != b.dtype):
            return False
    return True


def _describe(out, input_keys: set[int], writer: BlobWriter, shared: list | None) -> OutputInfo:
    if not isinstance(out, torch.Tensor):
        return OutputInfo(type_name=type(out).__name__, plain=False, device="", dtype="", shape=(), has_storage=False, aliases_input=False)
    plain = type(out) is torch.Tensor
    key = _storage(out) if plain else None
    has_storage = plain and out.device.type != "meta" and (key is not None or out.numel() == 0)
    data, cuda = None, None
    if has_storage and shared is not None and out.is_cuda and out.numel() > 0:
        shared.append(out.detach().contiguous())
        cuda = share_cuda(shared[-1])
    elif has_storage:
        data = writer.add(out)
    return OutputInfo(
        type_name=f"{type(out).__module__}.{type(out).__qualname__}", plain=plain, device=str(out.device),
        dtype=str(out.dtype).removeprefix("torch."), shape=tuple(out.shape), has_storage=has_storage,
        aliases_input=key in input_keys, data=data, cuda=cuda,
    )


# ---------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(pipe: Pipe) -> int:
    session: Session | None = None
    while True:
        try:
            msg = pipe.receive(parent_decoder)
        except ChildGone:
            return 0
        if isinstance(msg, Bye):
            return 0
        if isinstance(msg, Load):
            session = None
            session, reply = Session.start(msg)
        elif session is None:
            reply = TrialReport(index=msg.index, run=msg.run, ok=False, error="no candidate is loaded")
        else:
            try:
                reply = session.trial(msg)
            except BaseException as exc:  # noqa: BLE001 - e.g. a kernel's fault surfacing at a later sync
                reply = TrialReport(index=msg.index, run=msg.run, ok=False, error=describe_exception(exc))
        pipe.send(reply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.verify.candidate", description=__doc__.split("\n")[0])
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    lock_file_size()
    return serve(Pipe(args.read_fd, args.write_fd))


if __name__ == "__main__":
    sys.exit(main())
