"""Weight sync from the learner to the embedded engine: `python -m bench.system.weight_sync`.

Measures the production path of `/learner/sync` (`rl/learner/rank.py`): the FSDP2-wrapped actor's full
tensors are gathered bucket by bucket (`rl/fsdp.full_state_items`) and copied in place into the
colocated embedded engine's model, between `begin_update` and `end_update`. Prints seconds per
sync and the effective bandwidth for Qwen2-shaped random models, and writes JSON to `--out`.

    python -m bench.system.weight_sync --sizes 0.5b,1.5b --repeats 5 [--out FILE]
    python -m bench.system.weight_sync --sizes tiny          # a quick CPU check
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import orjson
import torch

from rl.config import TrainConfig
from rl.learner.actor_critic import Learner
from rl.learner.fsdp import init_distributed
from rl.learner.models import ModelConfig, count_params, qwen2_config, tiny_qwen2_config
from rl.learner.protocol import Empty
from rl.learner.rank import Rank, build_engine


def model_config(size: str) -> dict:
    return tiny_qwen2_config(512) if size == "tiny" else qwen2_config(size)


async def measure(size: str, repeats: int, dist) -> dict:
    cfg = TrainConfig(model=ModelConfig(hf_config=model_config(size), gradient_checkpointing=False))
    learner = Learner.build(cfg, dist)
    engine = build_engine(cfg, dist, learner)
    rank = Rank(cfg, Path(tempfile.mkdtemp()), dist, learner, engine)
    seconds, nbytes = [], 0.0
    async with anyio.create_task_group() as tg:
        await tg.start(engine.serve)
        await rank.sync(Empty())  # warm-up: first gather allocates
        for _ in range(repeats):
            if dist.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            metrics = (await rank.sync(Empty())).metrics
            if dist.device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
            nbytes = metrics["weight_sync_bytes"]
        tg.cancel_scope.cancel()
    median = statistics.median(seconds)
    return {"size": size, "params": count_params(learner.actor), "bytes": nbytes, "sync_s_median": median,
            "sync_s_all": seconds, "gb_per_s": nbytes / median / 1e9, "device": str(dist.device),
            "gpu": torch.cuda.get_device_name() if dist.device.type == "cuda" else "cpu"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system.weight_sync", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="0.5b,1.5b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    dist = init_distributed()
    results = []
    for size in a.sizes.split(","):
        r = anyio.run(measure, size, a.repeats, dist)
        results.append(r)
        print(f"{r['size']:>5} {r['params'] / 1e6:8.1f}M params  {r['bytes'] / 1e9:6.2f} GB  "
              f"sync {r['sync_s_median'] * 1e3:8.1f} ms  {r['gb_per_s']:6.1f} GB/s  ({r['gpu']})", flush=True)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if a.out:
        Path(a.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
