"""The individual runtime filter checks on one candidate task, in one process, on one device.

What it is: `CandidateRun(request, device)`, whose methods run the checks of the table at
`rl.data.filters.run_filters` in order (`load`, `eager`, `check_values` for finite / memory /
deterministic / non_constant / input_sensitive, `runtime`, `compiled`) and record what they saw
in `run.m` (the fields of `FilterMeasurements`); a failing check raises `Reject(reason, message)`.
The tensor helpers below compare outputs with the reward's allclose rule.
What it is not: the job (`rl.data.filters.run_filters` calls these in order, holds the GPU lock,
turns `Reject` into a `FilterResult` and frees memory afterwards) or the Structs
(`rl.data.filter_types`).

Example:
    run = CandidateRun(request, "cpu")
    run.load(); out = run.eager(); run.check_values(out); run.runtime()
    run.m["eager_ms"]
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import time
from collections.abc import Iterator
from typing import Any

from rl.data.filter_types import FilterRequest


class Reject(Exception):
    """A check failed: `reason` is a key of `filter_types.REASONS`, `message` says what was seen."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


# ---------------------------------------------------------------------------------------------
# Tensors: outputs as lists, comparisons.


def _tensors(out: Any) -> list:
    import torch

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise Reject("eager_error", f"forward returned {type(out).__name__}, not tensors")
    return [o.detach() for o in outs]


def _excess(a: list, b: list, atol: float, rtol: float) -> float:
    """max over elements of |a - b| - rtol * |b|, minus atol: <= 0 means allclose."""
    worst = -math.inf
    for x, y in zip(a, b, strict=True):
        x, y = x.float(), y.float()
        worst = max(worst, float(((x - y).abs() - rtol * y.abs()).max()) - atol)
    return worst


def _max_diff(a: list, b: list) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _finite(outs: list) -> bool:
    import torch

    return all(bool(torch.isfinite(o.float()).all()) for o in outs)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


# ---------------------------------------------------------------------------------------------
# The run.


class CandidateRun:
    """One candidate on one device: the model, its input draws, and the checks."""

    def __init__(self, request: FilterRequest, device: str) -> None:
        self.request, self.config, self.device = request, request.config, device
        self.m: dict[str, Any] = {"device": device}
        self.lock: Any = None  # the flock'd file while the job holds the GPU

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def forward(self, model, inputs: list, seed: int) -> list:
        import torch

        torch.manual_seed(seed)
        with torch.no_grad():
            return _tensors(model(*inputs))

    def load(self) -> None:
        import torch

        from rewards.verify.inputs import draw_inputs, load_task

        c = self.config
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            self.task = load_task(self.request.source)
            torch.manual_seed(c.init_seed)
            with torch.device(self.device):
                self.model = self.task.Model(*self.task.get_init_inputs())
            self.model = self.model.to(self.device) if isinstance(self.model, torch.nn.Module) else self.model
            self.inputs = draw_inputs(self.task, seed=c.input_seed, variant="task", scale=1.0, device=self.device)
        except torch.OutOfMemoryError as exc:
            raise Reject("memory", f"out of memory building the model or inputs: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001 - task code: any failure is the task's
            raise Reject("load_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        params = self.model.parameters() if isinstance(self.model, torch.nn.Module) else []
        self.m["param_count"] = sum(p.numel() for p in params)

    def eager(self) -> list:
        import torch

        start = time.perf_counter()
        try:
            out = self.forward(self.model, self.inputs, seed=1000)
            self.sync()
        except Reject:
            raise
        except torch.OutOfMemoryError as exc:
            raise Reject("memory", f"out of memory in forward: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001
            raise Reject("eager_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        self.m["first_call_ms"] = 1e3 * (time.perf_counter() - start)
        self.m["output_shape"] = ";".join("x".join(map(str, o.shape)) for o in out)
        return out

    def check_values(self, out: list) -> None:
        """finite, memory, deterministic, non_constant, input_sensitive."""
        import torch

        c = self.config
        if not _finite(out):
            raise Reject("nonfinite", "the output on the task's own inputs has NaN or inf")
        self.m["output_std"] = float(torch.cat([o.float().flatten() for o in out]).std()) if sum(o.numel() for o in out) > 1 else 0.0
        self._check_memory(out)
        again = self.forward(self.model, self.inputs, seed=2000)
        self.m["repeat_max_diff"] = _max_diff(out, again)
        if _excess(again, out, c.repeat_atol, c.repeat_rtol) > 0:
            raise Reject("stochastic", f"two runs on the same inputs differ by up to {self.m['repeat_max_diff']:.3g}")
        constant = [torch.full_like(o, float(o.float().mean())) for o in out]
        if _excess(out, constant, c.atol, c.rtol) <= 0:
            raise Reject("constant_output", f"the output is one value within atol={c.atol:g} rtol={c.rtol:g}")
        self._check_sensitivity(out)

    def _check_memory(self, out: list) -> None:
        import torch

        if self.device == "cuda":
            peak = torch.cuda.max_memory_allocated()
        else:  # no allocator statistics on CPU: what must exist at once, at least
            params = self.model.parameters() if isinstance(self.model, torch.nn.Module) else []
            peak = _nbytes(list(params)) + _nbytes(self.inputs) + _nbytes(out)
        self.m["peak_mem_mib"] = peak / 2**20
        if peak > self.config.memory_gib * 2**30:
            raise Reject("memory", f"peak memory {peak / 2**30:.2f} GiB > {self.config.memory_gib:g} GiB")

    def _check_sensitivity(self, out: list) -> None:
        """Outputs for the task's inputs, a second seed, signed and scaled draws differ pairwise."""
        from rewards.verify.inputs import derive_seed, draw_inputs, trial_scale

        c = self.config
        outs = [out]
        for k, variant in enumerate(("task", "signed", "scaled"), start=1):
            seed = derive_seed(c.input_seed, "filter", k)
            inputs = draw_inputs(self.task, seed=seed, variant=variant, scale=trial_scale(seed), device=self.device)
            other = self.forward(self.model, inputs, seed=1000)
            if _finite(other):  # a log of a negative draw: that distribution says nothing
                outs.append(other)
        closest = math.inf
        for i in range(len(outs)):
            for j in range(i + 1, len(outs)):
                closest = min(closest, _max_diff(outs[i], outs[j]))
                if _excess(outs[i], outs[j], c.atol, c.rtol) <= 0:
                    self.m["min_pair_diff"] = closest
                    raise Reject("input_independent", f"outputs for two different input draws agree within atol={c.atol:g} rtol={c.rtol:g}")
        self.m["min_pair_diff"] = closest

    def runtime(self) -> None:
        c = self.config
        first = self.m["first_call_ms"]
        if first > c.slow_factor * c.max_ms:
            self.m["eager_ms"], self.m["timer"] = first, "first_call"
            raise Reject("too_slow", f"one eager call took {first:.1f} ms > {c.slow_factor:g} x {c.max_ms:g} ms")
        self._time_cuda() if self.device == "cuda" else self._time_host()
        ms = self.m["eager_ms"]
        if ms < c.min_ms:
            raise Reject("too_fast", f"eager {ms:.4g} ms < {c.min_ms:g} ms")
        if ms > c.max_ms:
            raise Reject("too_slow", f"eager {ms:.4g} ms > {c.max_ms:g} ms")

    def _time_cuda(self) -> None:
        from rewards.timing.baselines import measure_model

        try:
            m = measure_model(self.model, lambda i: tuple(self.inputs), self.config.timing)
        except ImportError:  # no CuPy in this environment: torch's own events, no L2 flush
            self._time_torch_events()
            return
        self.m |= {"eager_ms": m.timing.median_ms, "eager_rel_stderr": m.rel_stderr_median, "timer": m.timing.method}

    def _time_torch_events(self) -> None:
        import statistics

        import torch

        samples = []
        for i in range(3 + max(5, self.config.host_repeats)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.forward(self.model, self.inputs, seed=1000)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:  # warm-up calls not counted
                samples.append(start.elapsed_time(end))
        self.m |= {"eager_ms": statistics.median(samples), "timer": "torch_event"}

    def _time_host(self) -> None:
        import statistics

        samples = []
        for _ in range(max(1, self.config.host_repeats)):
            start = time.perf_counter()
            self.forward(self.model, self.inputs, seed=1000)
            samples.append(1e3 * (time.perf_counter() - start))
        self.m |= {"eager_ms": statistics.median(samples), "timer": "host"}

    def compiled(self, out: list) -> None:
        import torch

        c = self.config
        start = time.perf_counter()
        try:
            compiled = torch.compile(self.model, backend=c.compile_backend, mode=c.compile_mode)
            with self._unlocked():
                fused = self.forward(compiled, self.inputs, seed=1000)
                self.sync()
        except torch.OutOfMemoryError as exc:
            raise Reject("memory", f"out of memory under torch.compile: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001 - dynamo/inductor refuse some task code
            raise Reject("compile_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        self.m["compile_s"] = time.perf_counter() - start
        self.m["compile_max_diff"] = _max_diff(fused, out)
        if _excess(fused, out, c.atol, c.rtol) > 0:
            raise Reject("compile_mismatch", f"torch.compile differs from eager by up to {self.m['compile_max_diff']:.3g}")

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        if self.lock is None:
            yield
            return
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_EX)
