"""Benchmark of one training checkpoint: where the seconds and bytes of `rl.learner.checkpoint.save` and
`export_hf` go, for a Qwen2-shaped actor + critic with AdamW, printed as one JSON object.

What it is: `python -m bench.system.checkpoint --size 0.5b` builds the random actor and critic the
learner trains (one process, FSDP2 over a one-rank group like the node recipes' learner), fills
both AdamW states (one step on zero gradients: the checkpoint holds fp32 weights + exp_avg +
exp_avg_sq), then saves `--saves` times into a fresh run directory (the second save also prunes
and replaces `latest`) and the last one exports the actor to HF, the way `/learner/save` with
`export` does. Per part: seconds of the last save (state_dict, dcp_write, rng, fsync, commit,
prune) with its export (export_gather, export_write, export_tokenizer, export_commit), and the
bytes on disk. `save_s` is what training waits for; with `--background` (checkpoint.background)
that is state_dict + stage (+ export_gather), and `background_s` is the rest, in a thread. `--layers N` keeps the 0.5B/1.5B widths and vocabulary with N decoder layers,
for machines without memory for the whole model (bytes scale linearly in the layers beyond
the embedding; `per_layer_bytes` helps extrapolate).
What it is not: a test (nothing is asserted) or a load benchmark.

How it is used:
    python -m bench.system.checkpoint --size 0.5b                       # CPU, or CUDA when visible
    python -m bench.system.checkpoint --size 0.5b --layers 6 --dir /tmp/ckpt-bench
    python -m bench.system.checkpoint --size 0.5b --layers 6 --background
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch


def build(size: str, layers_n: int | None, device: torch.device):
    """Sharded actor and critic of a random Qwen2 `size` with filled AdamW states."""
    from rl.learner.fsdp import init_distributed, shard
    from rl.learner.models import ModelConfig, build_actor, build_critic, layers, qwen2_config

    init_distributed()
    hf = qwen2_config(size)
    if layers_n is not None:
        hf["num_hidden_layers"] = layers_n
    cfg = ModelConfig(hf_config=hf)
    models = [build_actor(cfg, device), build_critic(cfg, device)]
    opts = []
    for m in models:
        shard(m, layers=layers(m), mixed_precision=device.type == "cuda")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        opts.append(opt)
    return (*models, *opts), hf


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="0.5b", choices=["0.5b", "1.5b"])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    p.add_argument("--saves", type=int, default=2, help="saves in a row (the last one is reported)")
    p.add_argument("--no-export", action="store_true", help="skip the HF export")
    p.add_argument("--tokenizer", default="", help="tokenizer dir (default: the tiny local one)")
    p.add_argument("--dir", default="", help="run directory (default: a temp dir, removed after)")
    p.add_argument("--background", action="store_true",
                   help="checkpoint.background: save_s is the blocking part, background_s the rest")
    args = p.parse_args()

    from rl.learner import checkpoint
    from rl.learner.fsdp import close_distributed

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    t0 = time.perf_counter()
    (actor, critic, a_opt, c_opt), hf = build(args.size, args.layers, device)
    out = {"size": args.size, "layers": hf["num_hidden_layers"], "device": str(device),
           "setup_s": round(time.perf_counter() - t0, 2), "io_threads": checkpoint._IO_THREADS}
    run_dir = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    try:
        saver = checkpoint.Saver(background=args.background)
        tokenizer = None if args.no_export else args.tokenizer or _tiny_tokenizer(run_dir)
        for step in range(1, args.saves + 1):
            parts: dict[str, float] = {}
            t0 = time.perf_counter()
            export_dir = run_dir / "hf" if step == args.saves and tokenizer else None  # the last save exports
            path = saver.save(run_dir, step, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt,
                              extra={"step": step}, keep=1, export_dir=export_dir, tokenizer=tokenizer,
                              timings=parts)
            total = time.perf_counter() - t0
            background = saver.wait()  # a background save: what training would not wait for
        parts |= background
        out |= {f"{k}_s": round(v, 3) for k, v in parts.items()} | {"save_s": round(total, 3)}
        out["ckpt_bytes"] = du(path)
        if tokenizer:
            out["hf_bytes"] = du(run_dir / "hf")
        saver.close()
        n = sum(v.numel() for v in actor.state_dict().values())
        out["actor_params"] = n
    finally:
        if not args.dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        close_distributed()
    print(json.dumps(out))


def _tiny_tokenizer(run_dir: Path) -> str:
    from agentcore.tiny_tokenizer import build_tiny_tokenizer

    return str(build_tiny_tokenizer(run_dir / "tokenizer"))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
