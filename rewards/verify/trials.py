"""One verification's trial loop on the trusted side (the body of `rewards.verify.verifier.run_verification`).

What it is: `Verification(request, work_dir, transfer, child, deadline).run()` pins fp32 precision,
builds the reference Model under the init seed, ships its state_dict to the child, then for every
planned trial draws the inputs, computes the reference (exact fp32, and float64 for the first trials
when cheap), asks the child for one or two forward runs, reads the outputs back and feeds the
`Judge`. A variant whose reference is not finite (a log of a negative input) falls back to the
task's own distribution for that trial. When the precision verdict hangs on it
(`Judge.probe_wanted`), the mantissa probe follows: two more forward runs on the first trial's
inputs with the low mantissa bits an fp16, bf16 or TF32 conversion drops cleared
(`rewards.verify.inputs.PROBES`). When the candidate's profiled forward runs kernels off the harness
stream, the reference is profiled once on the same inputs, so that the judge can tell a library's
internal streams from the candidate's own. Once the candidate has run, an exception in the trial
loop is a RUNTIME_ERROR verdict naming it (and logged with its traceback): the candidate's process
shares the GPU's memory and the scratch dir, and its outputs and reports are what the judge reads. A
CUDA error of this process other than out of memory is the machine's and raises
(`candidate_caused`), as does anything before the candidate ran.

What it is not: the rules (`rewards.verify.judge`), the comparison (`rewards.verify.compare`), the process
handle (`rewards.verify.verifier.CandidateProcess`). Torch is imported here, so the orchestrator side of
`rewards.verify.verifier` stays free of it.
"""

from __future__ import annotations

import ast
import copy
import logging
import os
import time
from pathlib import Path

import torch

from rewards.verdict import Verdict
from rewards.verify import compare
from rewards.verify.audit import (
    OpAudit,
    kernel_names,
    library_kernels,
    op_calls,
    profiler_gpu_events,
    sources_call_vendor,
    task_allows_vendor,
)
from rewards.verify.inputs import (
    PROBES,
    TrialSpec,
    derive_seed,
    draw_inputs,
    load_task,
    plan_trials,
    probe_inputs,
    probed,
)
from rewards.verify.judge import JUDGE_PHASE, Judge, JudgeSettings
from rewards.verify.phases import Phases
from rewards.verify.probes import pin_precision
from rewards.verify.wire import (
    ChildGone,
    KernelEvent,
    Load,
    Loaded,
    Trial,
    TrialReport,
    open_cuda,
    read_tensor,
    write_state,
)

MIB, GIB = 1 << 20, 1 << 30
logger = logging.getLogger(__name__)
# Sticky or hardware CUDA errors of this process are the machine's, whatever the candidate did.
_MACHINE = ("cuda error", "cudaerror", "cublas", "cudnn", "nccl", "ecc error")


def candidate_caused(exc: BaseException) -> bool:
    """Whether an exception of the trial loop, once the candidate's code has run, is put down to
    the candidate: out of device memory (its process holds the rest), the scratch files it
    shares (OSError), outputs and reports the judge cannot read (TypeError, ValueError, ...).
    Not a CUDA error of this process other than out of memory: that is the machine's."""
    text = str(exc).lower()
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "alloc_failed" in text:
        return True
    return not any(marker in text for marker in _MACHINE)


def _remove(path: Path) -> None:
    """Delete a transfer file; the candidate can reach the transfer dir, so whatever it left there
    (a directory, no permission) is no failure of ours: the dir is removed whole at the end."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _nbytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _finite(tensors: list) -> bool:
    return all(not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in tensors if isinstance(t, torch.Tensor))


def _profiled_reference(model: torch.nn.Module, inputs: list, device) -> tuple[list[KernelEvent], int | None]:
    """The GPU events of one reference forward, as the child profiles the candidate's: a marker
    kernel first, whose stream is this process's current stream. Read from the profiler in
    memory, not through a trace file in the transfer dir, which the candidate can reach."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(1000)
        with torch.no_grad():
            model(*inputs)
        torch.cuda.synchronize(device)
    return profiler_gpu_events(prof.events())


class Verification:
    """See the module docstring; `run()` returns the Verdict."""

    def __init__(self, request, work_dir: Path, transfer: Path, child, deadline: float | None,
                 phases: Phases | None = None) -> None:
        self.request, self.config = request, request.config
        self.work_dir, self.transfer, self.child, self.deadline = work_dir, transfer, child, deadline
        self.device = torch.device(request.device)
        # Trusted-side phases end with a synchronize of this process's own work (so GPU time is
        # charged to the phase that queued it); it orders nothing the candidate can observe.
        self.phases = phases or Phases()
        if self.device.type == "cuda":
            self.phases.sync = lambda: torch.cuda.synchronize(self.device)
        self.candidate_dir = (work_dir / request.candidate_dir).resolve()
        self.runs = 0
        self.model64: torch.nn.Module | None = None
        self.fp64_ok: bool | None = None
        self.reference_audited = False
        self.reference_profiled = False

    def run(self) -> Verdict:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("verify: device cuda requested but torch sees no GPU")
        with self.phases.phase("setup"):
            pin_precision()
            seed = self.request.seed if self.request.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            self.task = load_task(self.request.task_source)
            sources = self._sources()
            self.judge = Judge(self._settings(sources), self.phases)
            self.judge.details |= {"mode": self.request.mode, "device": str(self.device)}
        if not self._load(derive_seed(seed, "init")):
            return self._verdict(trials=0)
        plan = plan_trials(trials=self._trial_count(), pairs=self._pairs(), seed=seed,
                           poison=self.config.poison and self.device.type == "cuda",
                           profile=self.config.profile and self.device.type == "cuda")
        done, variants = 0, []
        try:
            for spec in plan:
                variant = self._trial(spec)
                if variant is None:
                    break
                done, variants = done + 1, variants + [variant]
            if done == len(plan) and self.judge.probe_wanted():
                self._mantissa_probe(plan[0], index=done)
        except Exception as exc:  # noqa: BLE001 - see candidate_caused
            if not candidate_caused(exc):
                raise
            logger.warning("verification failed after the candidate ran", exc_info=True)
            self.judge.runtime_error(self._failure(exc, trial=done))
        self.judge.details |= {"runs": self.runs, "variants": ",".join(variants)}
        return self._verdict(trials=done)

    def _failure(self, exc: Exception, trial: int) -> str:
        text = f"the verifier failed in trial {trial}, after the candidate ran: {type(exc).__name__}: {exc}"[:1500]
        if self.device.type == "cuda" and "out of memory" in str(exc).lower():
            free, total = torch.cuda.mem_get_info(self.device)
            held = torch.cuda.memory_reserved(self.device)
            text += (f"\n(device memory: {free / GIB:.1f} GiB free of {total / GIB:.1f}; the verifier holds "
                     f"{held / GIB:.1f} GiB, the candidate's process most of the rest)")
        return text

    def _verdict(self, trials: int) -> Verdict:
        with self.phases.phase("verdict"):
            return self.judge.verdict(trials=trials)

    # -- set-up --------------------------------------------------------------------------------

    def _trial_count(self) -> int:
        return self.config.final_trials if self.request.mode == "final" else self.config.quick_trials

    def _pairs(self) -> int:
        return self.config.final_pairs if self.request.mode == "final" else self.config.quick_pairs

    def _sources(self) -> dict[str, str]:
        kernels = self.candidate_dir / "kernels"
        if not kernels.is_dir():
            return {}
        return {
            p.relative_to(self.candidate_dir).as_posix(): p.read_text(errors="replace")
            for p in sorted(kernels.rglob("*")) if p.is_file()
        }

    def _settings(self, sources: dict[str, str]) -> JudgeSettings:
        c = self.config
        return JudgeSettings(
            allow_torch_compute=c.allow_torch_compute, allow_gemm_conv=c.allow_aten_gemm_conv, rules=c.rules,
            min_own_share=c.min_own_share, partial_min_own_share=c.partial_min_own_share,
            precision_factor=c.precision_factor, atol=c.atol, rtol=c.rtol,
            own_kernels=frozenset(kernel_names(sources)), vendor_allowed=task_allows_vendor(self.request.task_source),
            vendor_used=sources_call_vendor(sources),
        )

    def _load(self, init_seed: int) -> bool:
        with self.phases.phase("model", sync=True):  # reference Model, its state as a blob, to device
            init_inputs = list(self.task.get_init_inputs())
            text = repr(init_inputs)
            ast.literal_eval(text)  # the task's constructor arguments must be plain literals
            torch.manual_seed(init_seed)
            model = self.task.Model(*init_inputs)
            state = write_state(self.transfer, model.state_dict())
            self.model = model.to(self.device)
        load = Load(task_source=self.request.task_source, candidate_dir=str(self.candidate_dir),
                    so_path=self.request.so_path, device=str(self.device), init_inputs=text,
                    init_seed=init_seed, state=state, transfer_dir=str(self.transfer),
                    harness_stream=self.config.harness_stream)
        with self.phases.phase("load"):  # the child: start-up, CUDA warm-up, ModelNew (child.*)
            loaded = self._call(load, self.config.load_timeout_s)
        _remove(self.transfer / "state.bin")
        if loaded is None:
            return False
        self.phases.merge(getattr(loaded, "phases_ms", {}))
        if not isinstance(loaded, Loaded) or not loaded.ok:
            self.judge.runtime_error(f"ModelNew could not be built:\n{getattr(loaded, 'error', '')}")
            return False
        self.judge.loaded(loaded)
        self.judge.details["state"] = loaded.state  # a note for readers: the outputs decide
        return True

    def _call(self, message, timeout_s: float):
        if self.deadline is not None:
            timeout_s = min(timeout_s, self.deadline - time.monotonic())
        if timeout_s <= 0:
            self.judge.runtime_error("verification ran out of time", timeout=True)
            return None
        try:
            return self.child.call(message, timeout_s)
        except TimeoutError:
            self.judge.runtime_error(f"the candidate did not answer within {timeout_s:.0f} s", timeout=True)
        except ChildGone:
            self.judge.runtime_error(self.child.describe_death())
        self.child.kill()
        return None

    # -- trials --------------------------------------------------------------------------------

    def _trial(self, spec: TrialSpec) -> str | None:
        """Run one trial; its variant, or None when the candidate failed to run."""
        inputs, expected, refs, variant = self._draw(spec)
        digests = {fp: k for k, fp in zip((k for k, x in enumerate(inputs) if isinstance(x, torch.Tensor)), expected)}
        with self.phases.phase("trial.fp64", sync=True):
            exact, calibration = self._float64(spec, inputs, refs)
        for run, poison in enumerate(spec.poisons):
            last = run == len(spec.poisons) - 1
            msg = Trial(index=spec.index, run=self.runs, seed=spec.seed, variant=variant, scale=spec.scale,
                        reuse_buffers=spec.reuse_buffers or run > 0, poison=poison,
                        expected_nbytes=tuple(_nbytes([r]) for r in refs),
                        audit=not (spec.profile and last), profile=spec.profile and last,
                        share_cuda=self.device.type == "cuda" and self.config.share_cuda)
            self.runs += 1
            with self.phases.phase("trial.candidate"):  # the child's run (child.trial.*)
                report = self._call(msg, self.config.trial_timeout_s)
            self.phases.merge(getattr(report, "phases_ms", {}), prefix="child.trial.")
            with self.phases.phase("trial.observe"):
                self._library_streams(report, inputs)
                if not self._observed(report, expected, spec.index):
                    return None
            with self.phases.phase("trial.outputs", sync=True):  # CUDA IPC copy or blob read
                outs = self._outputs(report)
            if outs is None:
                return None
            with self.phases.phase(JUDGE_PHASE):
                self.judge.outputs(spec.index, run, report.outputs, outs, refs, digests,
                                   reused=spec.reuse_buffers, exact=exact, calibration=calibration,
                                   variant=variant)
            del outs
        if self.device.type == "cuda":
            del inputs, refs, exact
            with self.phases.phase("trial.release"):
                torch.cuda.empty_cache()  # the child needs the memory more than our cache does
        return variant

    def _mantissa_probe(self, spec: TrialSpec, index: int) -> None:
        """Run the candidate on `spec`'s inputs under each of `PROBES` (fresh tensors, no
        poison, audited like any run) and give the judge both runs' outputs and references."""
        runs = []
        for probe in PROBES:
            with self.phases.phase("probe.reference", sync=True), torch.no_grad():
                inputs = draw_inputs(self.task, seed=spec.seed, variant=spec.variant, scale=spec.scale,
                                     device=str(self.device))
                if not probed(inputs):
                    self.judge.details["probe"] = "no float32 input"
                    return
                probe_inputs(inputs, probe)
                expected = compare.fingerprints([x for x in inputs if isinstance(x, torch.Tensor)])
                refs = [r.detach() for r in _as_list(self.model(*inputs))]
                del inputs
            msg = Trial(index=index, run=self.runs, seed=spec.seed, variant=spec.variant, scale=spec.scale,
                        reuse_buffers=False, poison=None, expected_nbytes=tuple(_nbytes([r]) for r in refs),
                        audit=True, profile=False, share_cuda=self.device.type == "cuda" and self.config.share_cuda,
                        probe=probe)
            self.runs += 1
            with self.phases.phase("probe.candidate"):
                report = self._call(msg, self.config.trial_timeout_s)
            self.phases.merge(getattr(report, "phases_ms", {}), prefix="child.probe.")
            if not self._observed(report, expected, index):
                return
            with self.phases.phase("probe.outputs", sync=True):
                outs = self._outputs(report)
            if outs is None or not self.judge.probe_outputs(index, report.outputs, outs, refs):
                return
            runs.append((outs, refs))
        (cand_near, ref_near), (cand_rounded, ref_rounded) = runs
        with self.phases.phase("probe.judge"):
            self.judge.mantissa_probe(cand_near, cand_rounded, ref_near, ref_rounded)

    def _observed(self, report, expected: tuple[str, ...], index: int) -> bool:
        if not isinstance(report, TrialReport):
            if report is not None:
                self.judge.runtime_error("the candidate process answered out of protocol")
            return False
        if not report.ok and not report.input_fingerprints:  # failed before or without its inputs
            self.judge.runtime_error(f"trial {index}: {report.error}")
            return False
        self.judge.observe(report, expected, index)
        if not report.ok:
            self.judge.runtime_error(f"trial {index}: forward failed:\n{report.error}")
            return False
        return True

    def _library_streams(self, report, inputs: list) -> None:
        """The candidate's profiled forward ran kernels off the harness stream: profile the reference
        once on the same inputs, and let the judge excuse the kernels it, too, runs off its stream
        (cuDNN's RNNs and FFT convolutions fork to internal streams and join back to the caller's).
        Should the reference's profile fail, nothing is excused."""
        if self.reference_profiled or not isinstance(report, TrialReport) or report.marker_stream is None:
            return
        if all(k.stream == report.marker_stream for k in report.kernels):
            return
        self.reference_profiled = True
        try:
            events, marker = _profiled_reference(self.model, inputs, self.device)
        except RuntimeError:
            logger.warning("the reference's profile failed: no library stream is excused", exc_info=True)
            return
        self.judge.library_kernels = library_kernels(events, marker)
        self.judge.details["library_kernels"] = ",".join(sorted(self.judge.library_kernels))[:500]

    def _draw(self, spec: TrialSpec) -> tuple[list, tuple[str, ...], list, str]:
        """Inputs, their fingerprints (taken before the reference runs), reference, variant."""
        variants = (spec.variant, "task") if spec.variant != "task" else ("task",)
        for variant in variants:
            with self.phases.phase("trial.inputs"):  # the fingerprints' host sync ends the draw
                inputs = draw_inputs(self.task, seed=spec.seed, variant=variant, scale=spec.scale,
                                     device=str(self.device))
                digests = compare.fingerprints([x for x in inputs if isinstance(x, torch.Tensor)])
            with self.phases.phase("trial.reference", sync=True), torch.no_grad():
                refs = [r.detach() for r in _as_list(self._reference(inputs))]
                finite = _finite(refs)
            if finite:
                break
            self.judge.details["variant_fallbacks"] = int(self.judge.details.get("variant_fallbacks", 0)) + 1
        return inputs, digests, refs, variant

    def _reference(self, inputs: list):
        """The reference's outputs; under KernelBench's rules the first call is audited, so the
        judge knows which compute ops torch would have to run to do all of the task's work."""
        if self.config.rules != "kernelbench" or self.reference_audited:
            return self.model(*inputs)
        with OpAudit() as audit:
            out = self.model(*inputs)
        self.reference_audited = True
        self.judge.reference_ops = op_calls(audit.ops)
        return out

    def _float64(self, spec: TrialSpec, inputs: list, refs: list) -> tuple[list | None, list | None]:
        if spec.index >= self.config.fp64_trials or not self._fp64_affordable(inputs, refs):
            return None, None
        if self.model64 is None:
            self.model64 = copy.deepcopy(self.model).double()
        wide = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        with torch.no_grad():
            exact = [e.detach() for e in _as_list(self.model64(*wide))]
        exact = [e if r.is_floating_point() and e.shape == r.shape else None for e, r in zip(exact, refs)]
        calibration = [compare.precision_error(r, e) for r, e in zip(refs, exact) if e is not None]
        return exact, calibration

    def _fp64_affordable(self, inputs: list, refs: list) -> bool:
        if self.fp64_ok is None:
            params = _nbytes(self.model.parameters()) + _nbytes(self.model.buffers())
            self.fp64_ok = _nbytes(inputs) + _nbytes(refs) + params <= self.config.fp64_max_mib * MIB
            self.judge.details["fp64_reference"] = self.fp64_ok
        return self.fp64_ok

    def _output(self, info):
        if info.cuda is not None:
            return open_cuda(info.cuda, info.dtype, info.shape, self.device)
        return read_tensor(self.transfer, info.data).to(self.device) if info.data else None

    def _outputs(self, report: TrialReport) -> list | None:
        try:
            outs = [self._output(info) for info in report.outputs]
        except (ValueError, RuntimeError) as exc:
            self.judge.runtime_error(f"the candidate's outputs could not be read: {exc}")
            return None
        finally:
            _remove(self.transfer / f"out-{report.run}.bin")
        return outs
