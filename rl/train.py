"""`cuda-agent train`: one training run, from a recipe plus dotted overrides.

    cuda-agent train --recipe smoke
    cuda-agent train --recipe single_gpu --stage rft --set model.path=/models/qwen --set steps.rft=50
    cuda-agent train --recipe node_8gpu --run-dir runs/r1 --resume
    cuda-agent train --recipe single_gpu --set engine.kind=sglang --set weight_sync.mode=sglang_tensor
        --set 'engine.urls=["http://127.0.0.1:30000"]'          (one server per learner GPU)

With SGLang servers, `weight_sync.mode=sglang_tensor` has learner rank r push each update to
`engine.urls[r]` (colocated on its GPU: CUDA IPC handles, no copy through the host);
`sglang_disk` exports the actor to RUN/weights/vN and every server loads it from there.

The run directory gets `config.json` (the resolved config), `learner.log` (the ranks' output),
`rollouts/` (every trajectory, by stage and step), `ckpt/` (checkpoints, `latest`), `hf/` (the
actor exported as a Hugging Face model), `metrics.jsonl` and `tb/` (TensorBoard). `--resume`
continues from the latest checkpoint (after a crash or kill -9); without it an existing run
directory with checkpoints is refused.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import anyio
import msgspec

from agentcore import runtime
from rl.config import TrainConfig, apply_overrides
from rl.recipes import RECIPES

log = logging.getLogger("cuda-agent.train")


def parse_args(argv: list[str]) -> tuple[TrainConfig, bool]:
    p = argparse.ArgumentParser(prog="cuda-agent train", description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="single_gpu", choices=sorted(RECIPES))
    p.add_argument("--stage", choices=["single_turn", "rft", "value", "ppo", "smoke"])
    p.add_argument("--run-dir", help="run directory (default: the recipe's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override, repeatable")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    a = p.parse_args(argv)
    overrides = list(a.set)
    if a.stage:
        overrides.append(f"stage={a.stage}")
    if a.run_dir:
        overrides.append(f"run_dir={a.run_dir}")
    try:
        cfg = apply_overrides(RECIPES[a.recipe](), overrides)
    except ValueError as exc:
        p.error(str(exc))
    return cfg, a.resume


async def run_training(cfg: TrainConfig) -> list[dict]:
    from rl.run import open_run
    from rl.stages import train

    rows: list[dict] = []  # stays empty when a signal stops the run (its steps are on disk)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope)
        async with open_run(cfg) as run:
            rows = await train(run)
        tg.cancel_scope.cancel()
    return rows


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"\ncuda-agent train: {signal.Signals(signum).name}, stopping", file=sys.stderr)
            scope.cancel()
            return


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg, resume = parse_args(argv)
    ckpt = Path(cfg.run_dir) / "ckpt"
    if not resume and ckpt.exists() and any(ckpt.iterdir()):
        print(f"cuda-agent train: {cfg.run_dir} has checkpoints; pass --resume or another --run-dir", file=sys.stderr)
        return 2
    rows = runtime.run(run_training, cfg)
    print(f"cuda-agent train: {run_summary(Path(cfg.run_dir), len(rows))}")
    return 0


def run_summary(run_dir: Path, finished_rows: int) -> str:
    """What the run holds on disk: a signal leaves `rows` empty, the steps it did are in its files."""
    steps = _count_lines(run_dir / "metrics.jsonl")
    latest = run_dir / "ckpt" / "latest"
    ckpt = latest.read_text().strip() if latest.exists() else "none"
    ended = "finished" if finished_rows else "stopped"
    return f"{ended}; {steps} step(s) in {run_dir}/metrics.jsonl, latest checkpoint {ckpt}"


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


__all__ = ["main", "parse_args", "run_summary", "run_training", "msgspec"]
