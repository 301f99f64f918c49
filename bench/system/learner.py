"""How fast the learner trains: tokens/s and MFU of one PPO update, `python -m bench.system.learner`.

What it measures: `rl.learner.update.ppo_step` end to end - the critic's value pass, then actor AND
critic forward + backward over every micro-batch, gradient clipping and both AdamW steps - on
Qwen2-shaped random models (`rl.learner.models.qwen2_config`: 0.5B, 1.5B; `tiny` for a CPU check),
sharded with FSDP2 (bf16 compute, fp32 master weights), activation checkpointing on unless
`--no-ac`. Each rank packs synthetic samples of realistic shape (documents of 1k-8k random
tokens, a prompt then alternating model turns and tool outputs, about half action tokens) into
`--micro-batches` rows of about `--tokens` tokens. A few warm-up updates, then timed updates
between `torch.cuda.synchronize()` calls.

What it is not: a rollout or weight-sync benchmark, or a test (nothing is asserted).

MFU: the FLOPs accounting of `rl.learner.perf` (model FLOPs, not HFU: recomputation is not
counted), over the peak bf16 dense FLOP/s per GPU (989 TFLOP/s on H100 SXM and H200, detected
from the device name; `--peak-tflops` overrides). `--full-head` runs (and counts) the actor's LM
head over every token instead of the action positions only.

    python -m bench.system.learner --sizes 0.5b,1.5b --tokens 8192,16384,32768 --steps 5 --out learner.json
    torchrun --nproc-per-node 4 -m bench.system.learner --sizes 1.5b --tokens 16384
    python -m bench.system.learner --sizes tiny      # CPU: quick check that it runs
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import torch
import torch.distributed as dist

from rl.learner import perf
from rl.learner.fsdp import (
    Dist,
    apply_activation_checkpointing,
    close_distributed,
    compile_blocks,
    every_kth,
    init_distributed,
    shard,
)
from rl.learner.models import (
    ModelConfig,
    build_actor,
    build_critic,
    count_params,
    layers,
    qwen2_config,
    tiny_qwen2_config,
)
from rl.learner.update import PPOConfig, ppo_step
from rl.samples import Sample

TINY_VOCAB = 4096


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    """Peak bf16 dense FLOP/s of one device; None when unknown (CPU, unlisted GPU)."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    return perf.peak_flops(torch.cuda.get_device_name(device))


def model_config(size: str) -> dict:
    return tiny_qwen2_config(TINY_VOCAB, hidden=64, layers=2) if size == "tiny" else qwen2_config(size)


# ---------------------------------------------------------------------------------------------
# Synthetic samples


def synthetic_sample(rng: random.Random, n_tokens: int, vocab: int, name: str) -> Sample:
    """A trajectory-shaped sample: a prompt (about 10%), then model turns and tool outputs of
    64-512 tokens alternating, so about half of the tokens are actions; random token ids."""
    prompt = max(1, n_tokens // 10)
    mask = [0] * prompt
    action = True
    while len(mask) < n_tokens:
        mask += [int(action)] * min(rng.randint(64, 512), n_tokens - len(mask))
        action = not action
    logprobs = [-rng.expovariate(2.0) if m else 0.0 for m in mask]
    return Sample(
        sample_id=name,
        group_id=name,
        token_ids=[rng.randrange(vocab) for _ in range(n_tokens)],
        action_mask=mask,
        behaviour_logprobs=logprobs,
        reward=float(rng.choice([-1.0, 1.0, 2.0, 3.0])),
        weight_version=0,
    )


def synthetic_batch(
    rng: random.Random, tokens: int, micro_batches: int, doc_range: tuple[int, int], vocab: int
) -> list[Sample]:
    """Documents filling `micro_batches` rows of exactly `tokens` tokens each (the last document
    of a row takes the remainder); `rl.learner.packing.pack` gives back full rows (first-fit decreasing
    alone needed a third row for 3 of 5 such batches)."""
    samples = []
    lo, hi = doc_range[0], min(doc_range[1], tokens)
    for row in range(micro_batches):
        left = tokens
        while left > 0:
            n = left if left <= hi else min(rng.randint(lo, hi), left)
            samples.append(synthetic_sample(rng, n, vocab, f"r{row}-{len(samples)}"))
            left -= n
    return samples


def update_flops(hf_cfg: dict, samples: list[Sample], head_on_actions_only: bool = True) -> float:
    """Model FLOPs of one ppo_step on `samples` (`rl.learner.perf`, the accounting training reports)."""
    head = perf.action_positions([s.action_mask for s in samples]) if head_on_actions_only else None
    return perf.update_flops(hf_cfg, [len(s.token_ids) for s in samples], "ppo", head_tokens=head)


# ---------------------------------------------------------------------------------------------
# One configuration


def build(
    size: str, d: Dist, ac: bool, attn: str, compile_head: bool = True, reshard: bool = True, compile_layers: bool = False,
    ac_every: int = 1, fused_adam: bool = False, head_on_actions_only: bool = True,
) -> tuple:
    """Actor and critic, sharded, with AdamW; the models are created on the device directly."""
    cfg = ModelConfig(
        hf_config=model_config(size), attn_implementation=attn, gradient_checkpointing=ac, compile_head=compile_head,
        head_on_actions_only=head_on_actions_only,
    )
    with torch.device(d.device):
        actor, critic = build_actor(cfg, d.device), build_critic(cfg, d.device)
    params = count_params(actor), count_params(critic)
    for module in (actor, critic):
        if compile_layers:
            compile_blocks(layers(module))
        if ac:
            apply_activation_checkpointing(module, every_kth(layers(module), ac_every))
        shard(module, layers=layers(module), reshard_after_forward=reshard)
    fused = {"fused": True} if fused_adam else {}  # one kernel per step instead of foreach launches
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-6, betas=(0.9, 0.95), **fused) for m in (actor, critic)]
    return actor, critic, *opts, params


def run_one(size: str, tokens: int, args: argparse.Namespace, d: Dist) -> dict:
    """Warm up, then time `args.steps` PPO updates; one result row (global figures)."""
    hf_cfg = model_config(size)
    actor, critic, actor_opt, critic_opt, params = build(
        size, d, not args.no_ac, args.attn, not args.no_compile_head, not args.no_reshard, args.compile_blocks,
        args.ac_every, args.fused_adam, head_on_actions_only=not args.full_head,
    )
    rng = random.Random(args.seed * 1000 + d.rank)
    cfg = PPOConfig(token_budget=tokens)
    batches = [
        synthetic_batch(rng, tokens, args.micro_batches, args.doc_range, hf_cfg["vocab_size"])
        for _ in range(args.warmup + args.steps + bool(args.profile))
    ]
    times, flops, seen = [], [], []
    for i, samples in enumerate(batches):
        if i == args.warmup and d.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d.device)
        timed = args.warmup <= i < args.warmup + args.steps
        profile = args.profile and d.is_main and i == args.warmup + args.steps  # one more, untimed
        _sync(d)
        t0 = time.perf_counter()
        with _profiler(args.profile / f"profile_{size}_{tokens}.txt" if profile else None):
            metrics = ppo_step(actor, critic, actor_opt, critic_opt, samples, cfg, d.device)
            _sync(d)
        if args.verbose and d.is_main:
            print(f"  step {i} ({'timed' if timed else 'warm-up'}): {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
        if timed:
            times.append(time.perf_counter() - t0)
            flops.append(_global_sum(update_flops(hf_cfg, samples, not args.full_head), d))
            seen.append(metrics["tokens"])
    peak = peak_flops(d.device, args.peak_tflops)
    step_s = statistics.median(times)
    row = {
        "model": size,
        "params_actor": params[0],
        "params_critic": params[1],
        "tokens_per_micro_batch": tokens,
        "micro_batches": args.micro_batches,
        "world_size": d.world_size,
        "activation_checkpointing": not args.no_ac,
        "checkpoint_every": args.ac_every,
        "fused_adam": args.fused_adam,
        "attn": args.attn,
        "varlen_native_gqa": _native_gqa_or_none(),
        "compile_head": not args.no_compile_head,
        "head_on_actions_only": not args.full_head,
        "reshard_after_forward": not args.no_reshard,
        "compile_blocks": args.compile_blocks,
        "step_s": times,
        "step_s_median": step_s,
        "tokens_per_step": statistics.median(seen),
        "tokens_per_s_per_gpu": statistics.median(seen) / step_s / d.world_size,
        "model_flops_per_step": statistics.median(flops),
        "achieved_tflops_per_gpu": statistics.median(flops) / step_s / d.world_size / 1e12,
        "mfu": statistics.median(flops) / step_s / (peak * d.world_size) if peak else None,
        "peak_flops_per_gpu": peak,
        "peak_mem_gib": _peak_mem_gib(d),
        "last_metrics": metrics,
    }
    del actor, critic, actor_opt, critic_opt
    _free(d)
    return row


@contextlib.contextmanager
def _profiler(path: Path | None) -> Iterator[None]:
    """Profile the enclosed step into a table of the ops that took the most device time (the
    profiled step is slower; `--profile` runs are for the breakdown, not for the figures)."""
    if path is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        yield
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=80))


def _sync(d: Dist) -> None:
    if d.device.type == "cuda":
        torch.cuda.synchronize(d.device)


def _global_sum(x: float, d: Dist) -> float:
    t = torch.tensor(x, dtype=torch.float64, device=d.device if d.device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return float(t)


def _peak_mem_gib(d: Dist) -> float | None:
    """Largest peak allocated memory over the ranks (None on CPU)."""
    if d.device.type != "cuda":
        return None
    t = torch.tensor(torch.cuda.max_memory_allocated(d.device) / 2**30, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _free(d: Dist) -> None:
    gc.collect()
    if d.device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Command line


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.system.learner", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="0.5b,1.5b", help="comma list of 0.5b, 1.5b, tiny")
    p.add_argument("--tokens", help="tokens per micro-batch, comma list (default 8192,16384,32768; tiny: 2048)")
    p.add_argument("--micro-batches", type=int, default=2, help="micro-batches per update and rank")
    p.add_argument("--doc-tokens", help="min,max document length (default 1024,8192; tiny: 128,1024)")
    p.add_argument("--steps", type=int, default=3, help="timed updates per configuration")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates first (compilation, allocator)")
    p.add_argument("--no-ac", action="store_true", help="no activation checkpointing")
    p.add_argument("--ac-every", type=int, default=1, help="checkpoint every k-th decoder layer (1: all)")
    p.add_argument("--fused-adam", action="store_true", help="AdamW(fused=True) for actor and critic")
    p.add_argument("--no-compile-head", action="store_true", help="eager log-softmax/entropy over the LM head chunks")
    p.add_argument("--compile-blocks", action="store_true", help="torch.compile each decoder block's forward")
    p.add_argument("--full-head", action="store_true", help="LM head over every position, not only the action ones")
    p.add_argument("--no-reshard", action="store_true", help="keep gathered bf16 weights between forward and backward")
    p.add_argument("--attn", default="auto", help="attention implementation (auto: flex_attention on CUDA)")
    p.add_argument("--peak-tflops", type=float, help="peak bf16 dense TFLOP/s per GPU (overrides detection)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print every update's time (warm-up included) to stderr")
    p.add_argument("--out", type=Path, help="write the JSON report here")
    p.add_argument("--profile", type=Path, help="profile the last timed step of each run into this folder")
    args = p.parse_args(argv)
    args.sizes = args.sizes.split(",")
    tiny = args.sizes == ["tiny"]
    args.tokens = [int(t) for t in (args.tokens or ("2048" if tiny else "8192,16384,32768")).split(",")]
    lo, hi = (args.doc_tokens or ("128,1024" if tiny else "1024,8192")).split(",")
    args.doc_range = (int(lo), int(hi))
    return args


HEADER = (
    f"{'model':>6} {'tokens/mb':>9} {'gpus':>4} {'AC':>3} {'step s':>7} {'tokens/s/gpu':>12} "
    f"{'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8}"
)


def _line(r: dict) -> str:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
    mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "-"
    return (
        f"{r['model']:>6} {r['tokens_per_micro_batch']:>9} {r['world_size']:>4} "
        f"{_ac(r):>3} {r['step_s_median']:>7.3f} "
        f"{r['tokens_per_s_per_gpu']:>12.0f} {r['achieved_tflops_per_gpu']:>8.1f} {mfu:>6} {mem:>8}"
    )


def _ac(r: dict) -> str:
    """AC column: on (every layer), 1/k (every k-th layer) or off."""
    if not r["activation_checkpointing"]:
        return "off"
    return "on" if r.get("checkpoint_every", 1) == 1 else f"1/{r['checkpoint_every']}"


def _native_gqa_or_none() -> bool | None:
    """Whether the varlen kernel takes the KV heads as they are (None: no varlen kernel here)."""
    from rl.learner.attention import native_gqa, varlen_available

    return native_gqa() if varlen_available() else None


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    d = init_distributed()
    device = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
    if d.is_main:
        print(f"{device}, {d.world_size} rank(s), torch {torch.__version__}\n{HEADER}", flush=True)
    rows = []
    for size in args.sizes:
        for tokens in args.tokens:
            rows.append(run_one(size, tokens, args, d))
            if d.is_main:
                print(_line(rows[-1]), flush=True)
    if d.is_main and args.out:
        report = {"device": device, "torch": torch.__version__, "world_size": d.world_size, "rows": rows}
        args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    close_distributed(sync=True)


if __name__ == "__main__":
    sys.exit(main())
