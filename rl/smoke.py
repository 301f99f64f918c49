"""`cuda-agent smoke`: the quick end-to-end training run (the README's main job).

A tiny random model (built from a config, with the built-in tiny tokenizer) learns the tool
format by rejection fine-tuning on demonstration trajectories - hand-written correct CUDA
solutions of bundled KernelBench tasks, driven through the real tools and scored by the real
environment - then the critic is pretrained and a few agentic PPO steps run with real compile,
verify and profile. Everything is the production path: learner rank process with FSDP2, the
embedded engine behind SGLang's HTTP API, the orchestrator, sandbox, compile pool, GPU queue,
checkpoints and the Hugging Face export. It prints the reward curve at the end.

On a machine without a GPU it says so and runs the CPU variant (`smoke_cpu` recipe: learner on
CPU, the fake kernel environment), which CI also runs.

    cuda-agent smoke [--out DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

import orjson

from agentcore import runtime
from rl.config import apply_overrides
from rl.recipes import smoke, smoke_cpu


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and shutil.which("nvcc") is not None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="cuda-agent smoke", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/smoke", help="run directory (cleared first)")
    p.add_argument("--cpu", action="store_true", help="run the CPU variant even where a GPU exists")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    gpu = has_gpu() and not a.cpu
    if not gpu:
        print("cuda-agent smoke: no GPU (or no nvcc) on this machine: running the CPU variant "
              "(learner on CPU, fake kernel environment)", file=sys.stderr)
    try:
        cfg = apply_overrides(smoke() if gpu else smoke_cpu(), [f"run_dir={a.out}", *a.set])
    except ValueError as exc:
        p.error(str(exc))
    shutil.rmtree(a.out, ignore_errors=True)
    from rl.plot import print_reward_curve
    from rl.train import run_training

    t0 = time.monotonic()
    rows = runtime.run(run_training, cfg)
    wall_s = time.monotonic() - t0
    print(f"\ncuda-agent smoke ({'GPU' if gpu else 'CPU variant'}): {len(rows)} steps in {wall_s:.0f} s, run in {a.out}")
    print_reward_curve(rows)
    summary = {"gpu": gpu, "wall_s": wall_s, "steps": len(rows), "recipe": cfg.recipe, "rows": rows}
    (Path(a.out) / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0
