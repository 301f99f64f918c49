"""Host reads and seconds of the judge's comparisons in one final verification, printed as JSON.

What it is: `python -m bench.system.judge_reads` runs `rewards.verify.judge.Judge.outputs` the
way a final verification does (the trial plan's forward calls, 14 for 12 trials) on an output of
`--elements` float32 values against its reference, and counts the host reads it makes
(`bench.system.host_reads`: each is a GPU synchronisation on CUDA) and its wall time. The
smoke's family tasks' outputs hold ~2**25 values (128 MiB; 2**29 at the 3 ms sizing), which the
comparisons walk in chunks of `rewards.verify.compare.CHUNK`; `--chunk` shrinks the chunk to count
a large output's reads cheaply on a CPU.

On CUDA the comparisons of a large output run as single-pass kernels (`rewards.verify.fused`);
`--torch` also times the same calls with the torch versions, side by side in one run, with the ratio.

What it is not: the verifier. No child, no candidate, no reference model: two tensors a little
apart, so every comparison passes and every check that a passing output gets runs.

    python -m bench.system.judge_reads --elements 1048576 --chunk 32768     # CPU: the reads of 32 chunks
    python -m bench.system.judge_reads --device cuda --elements 33554432 --torch    # a smoke task's output
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import torch

from bench.system.host_reads import HostReads
from rewards.verify import compare, fused, probes
from rewards.verify.inputs import plan_trials
from rewards.verify.judge import JUDGE_PHASE, Judge, JudgeSettings
from rewards.verify.phases import Phases
from rewards.verify.wire import OutputInfo


def _info(t: torch.Tensor) -> OutputInfo:
    return OutputInfo(type_name="Tensor", plain=True, device=str(t.device), dtype=str(t.dtype).removeprefix("torch."),
                      shape=tuple(t.shape), has_storage=True, aliases_input=False)


def run(elements: int, device: str, trials: int, pairs: int, kernels: bool = True) -> dict:
    """One final verification's comparisons; `kernels` False keeps `rewards.verify.fused` out."""
    saved = fused.MIN_ELEMENTS
    if not kernels:
        fused.MIN_ELEMENTS = 1 << 62
    try:
        return _run(elements, device, trials, pairs) | {"way": "fused" if kernels else "torch"}
    finally:
        fused.MIN_ELEMENTS = saved


def _run(elements: int, device: str, trials: int, pairs: int) -> dict:
    plan = plan_trials(trials=trials, pairs=pairs, seed=1, poison=True, profile=True)
    phases = Phases()
    judge = Judge(JudgeSettings(), phases)
    gen = torch.Generator(device=device).manual_seed(0)
    # First calls load the kernels (and compile the fused ones), untimed.
    warm = torch.randn(elements, device=device)
    compare.check_output(warm, warm)
    compare.precision_error(warm, warm)
    compare.fingerprint(warm)
    compare.is_constant(warm)
    del warm
    reads, seconds, calls = HostReads(device_only=device != "cpu"), 0.0, 0
    cpu_start = time.process_time()
    for spec in plan:
        ref = torch.randn(elements, generator=gen, device=device)
        out = ref + 1e-7 * torch.randn(elements, generator=gen, device=device)
        for run_index, _ in enumerate(spec.poisons):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            with reads:
                ok = judge.outputs(spec.index, run_index, (_info(out),), [out], [ref], {}, reused=spec.reuse_buffers,
                                   exact=None, calibration=None, variant=spec.variant)
            seconds += time.perf_counter() - start
            calls += 1
            if not ok:
                raise SystemExit(f"judge_reads: trial {spec.index} failed: {judge.evidence[-1].message}")
    cpu_seconds = time.process_time() - cpu_start  # the untimed draws' launches included: a bound
    split = {name.removeprefix(f"{JUDGE_PHASE}."): round(ms / calls, 2) for name, ms in phases.ms.items()}
    return {"device": device, "elements": elements, "chunk": compare.CHUNK, "chunks": -(-elements // compare.CHUNK),
            "calls": calls, "host_reads": reads.total, "host_reads_per_call": round(reads.total / calls, 1),
            "by_name": dict(reads.by_name), "seconds": round(seconds, 3), "ms_per_call": round(1e3 * seconds / calls, 2),
            "ms_per_call_by_part": split, "process_cpu_s": round(cpu_seconds, 3)}


def blocking_sync(device: int) -> None:
    """Before this process's first CUDA call: a host thread waiting for the GPU sleeps on a
    semaphore instead of spinning on a core (the primary context's CU_CTX_SCHED_BLOCKING_SYNC,
    which torch's context then has)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise SystemExit(f"judge_reads: --blocking-sync needs the CUDA driver: {exc}") from None
    handle = ctypes.c_int()
    set_flags = getattr(libcuda, "cuDevicePrimaryCtxSetFlags_v2", None) or libcuda.cuDevicePrimaryCtxSetFlags
    for step, rc in (("cuInit", libcuda.cuInit(0)), ("cuDeviceGet", libcuda.cuDeviceGet(ctypes.byref(handle), device)),
                     ("cuDevicePrimaryCtxSetFlags", set_flags(handle, 4))):  # 4: CU_CTX_SCHED_BLOCKING_SYNC
        if rc:
            raise SystemExit(f"judge_reads: {step} failed with CUDA error {rc}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.system.judge_reads", description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 20, help="float32 values per output")
    parser.add_argument("--chunk", type=int, default=0, help="elements per comparison step (default: the verifier's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--torch", action="store_true", help="also time the torch versions of the comparisons")
    parser.add_argument("--blocking-sync", action="store_true",
                        help="make this process sleep in the driver while it waits for the GPU, not spin")
    args = parser.parse_args(argv)
    if args.elements < 2 or args.chunk < 0:
        parser.error("--elements must be at least 2 and --chunk positive")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    if args.chunk:
        compare.CHUNK = probes._CHUNK = args.chunk
    if args.blocking_sync and not args.device.startswith("cuda"):
        parser.error("--blocking-sync: only with --device cuda")
    if args.blocking_sync:
        blocking_sync(torch.device(args.device).index or 0)
    result = run(args.elements, args.device, args.trials, args.pairs)
    if args.torch:
        slow = run(args.elements, args.device, args.trials, args.pairs, kernels=False)
        result = {"fused": result, "torch": slow, "torch_over_fused": round(slow["seconds"] / max(result["seconds"], 1e-9), 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
