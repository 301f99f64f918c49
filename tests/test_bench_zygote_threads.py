"""`python -m bench.system.zygote_threads`: the zygote's start-up replayed step by step, in a fresh
interpreter as the zygote has."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import torch

from rewards.queue import compile_warmup, zygote_server


def test_every_preload_import_and_warm_up_step_is_reported_in_order():
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    run = subprocess.run([sys.executable, "-m", "bench.system.zygote_threads"], capture_output=True, text=True,
                         env=env, timeout=600, check=True)
    lines = [orjson.loads(line) for line in run.stdout.splitlines()]
    step_lines = [line for line in lines if "step" in line]
    steps = [line["step"] for line in step_lines]
    assert steps[0] == "start" and steps[-1].startswith("NVML released")
    counted = f"{torch.cuda.device_count()} device(s) counted in a child"
    expected = (["preload torch", counted] + [f"preload {name}" for name in zygote_server.PRELOAD if name != "torch"]
                + [f"warm_up {m}" for m in compile_warmup.MODULES])
    assert steps[1:1 + len(expected)] == expected
    assert "warm_up first_call_modules" in steps
    assert all(set(line) == {"step", "new_threads", "libcuda_mapped", "nvml_initialised"} for line in step_lines)
    between = [line for line in lines if "step" not in line]  # a change between two imports within a step
    assert all({"after_import_began", "before_import"} < set(line) for line in between)
