"""Rollout engines side by side on one GPU, the same model: `python -m bench.system.engines`.

What it is: the model served two ways in turn, each next to a learner `Rank` on the same GPU as in
`cuda-agent train`:
- embedded: `rl.engine.EmbeddedEngine` in this process behind its SGLang-compatible HTTP server
  (`rl.learner.rank.serve`); weights arrive by the rank's in-place copy;
- embedded_static: the same with `static_decode` (fixed-shape decode steps replayed as CUDA graphs);
- sglang: `python -m sglang.launch_server` started through `agentcore.sglang.SGLangServer`; weights
  arrive as CUDA-IPC buckets (`weight_sync.mode=sglang_tensor`, the rank's colocated client).
Both are driven by the same `SGLangClient` over HTTP. Per engine:
- ttft_ms: median wall time of a request for one new token after a `prompt_tokens` prompt
  (a fresh random prompt each time, so no prefix cache helps);
- tokens_per_s_1 / tokens_per_s_64: generated tokens over wall time with 1 and 64 concurrent
  requests of `new_tokens` each (temperature 1, no stop tokens: the server's own EOS may still end one);
- weight_sync_s: median of the rank's `sync` (SGLang: pause, flush, buckets, flush, continue);
- released_gib: device memory that came free when the rank released the engine's memory for
  training (SGLang: weights, KV cache and CUDA graphs; embedded: its KV cache), read with
  cudaMemGetInfo; then the sync and resume that training does bring it back.
Output: OUT/engines.json and OUT/engines.md (the table, engines side by side).

What it is not: a test (nothing is asserted; `tests/test_bench_engines.py` runs the plumbing on a
CPU with a tiny model and the fake SGLang launcher) or a serving benchmark of SGLang's own
(`sglang.bench_serving`): it measures the paths training uses, through our client.

    python -m bench.system.engines --model smollm2-135m --out bench/results/engines
    python -m bench.system.engines --model random:0.5b          # a random-init Qwen2-0.5B, written to OUT
    python -m bench.system.engines --model DIR --engines sglang --sglang-pythonpath /tmp/sglang-site
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import orjson
import torch

from agentcore.engine import SamplingParams
from agentcore.sglang import SGLangClient, SGLangClientConfig, SGLangLaunch, SGLangServer, free_port
from rl.config import EngineSection, TrainConfig
from rl.engine.embedded import EmbeddedEngineConfig
from rl.learner.actor_critic import Learner
from rl.learner.fsdp import Dist, init_distributed
from rl.learner.models import ModelConfig
from rl.learner.protocol import Empty, ReleaseRequest
from rl.learner.rank import Rank, build_engine, serve
from rl.pretrained import resolve_model
from rl.weight_sync import WeightSyncConfig

SGLANG_ARGS = ("--dtype", "bfloat16", "--grammar-backend", "none", "--sampling-backend", "pytorch")
"""Server flags besides the launcher's own (its attention backend: triton where FA3 is missing)."""


class Load(msgspec.Struct, frozen=True, kw_only=True):
    """The requests of one measurement."""

    prompt_tokens: int = 512
    new_tokens: int = 256
    concurrency: tuple[int, ...] = (1, 64)
    ttft_requests: int = 10
    syncs: int = 3


def device_free_bytes() -> int | None:
    """Free memory of this process's GPU (all processes' allocations count), None on a CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


async def generation(url: str, vocab: int, load: Load) -> dict[str, Any]:
    """TTFT and throughput at each concurrency, through the client training uses."""
    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(10, vocab - 10) for _ in range(load.prompt_tokens)]

    config = SGLangClientConfig(base_url=url, max_connections=max(load.concurrency) + 8)
    out: dict[str, Any] = {}
    async with SGLangClient(config) as client:
        await client.generate(prompt(), SamplingParams(max_new_tokens=8), session_id="warm")
        first = []
        for i in range(load.ttft_requests):
            t0 = time.perf_counter()
            await client.generate(prompt(), SamplingParams(max_new_tokens=1), session_id=f"ttft{i}")
            first.append(time.perf_counter() - t0)
        out["ttft_ms"] = statistics.median(first) * 1e3
        for n in load.concurrency:
            tokens: list[int] = []

            async def one(i: int, n: int = n, tokens: list[int] = tokens) -> None:
                gen = await client.generate(prompt(), SamplingParams(max_new_tokens=load.new_tokens),
                                            session_id=f"c{n}-{i}")
                tokens.append(len(gen.token_ids))

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
            wall = time.perf_counter() - t0
            out[f"tokens_per_s_{n}"] = sum(tokens) / wall
            out[f"tokens_{n}"] = sum(tokens)
            out[f"wall_s_{n}"] = wall
    return out


async def weights_and_memory(rank: Rank, load: Load, sglang: bool) -> dict[str, Any]:
    """Median sync seconds, then the memory a release for training frees (restored after)."""
    seconds = []
    for _ in range(load.syncs):
        t0 = time.perf_counter()
        await rank.sync(Empty())
        seconds.append(time.perf_counter() - t0)
    before = device_free_bytes()
    await rank.release(ReleaseRequest(weights=sglang))
    after = device_free_bytes()
    if sglang:
        await rank.sync(Empty())  # training's order: the released weights come back with the new ones
    await rank.resume(Empty())
    released = None if before is None or after is None else (after - before) / 2**30
    return {"weight_sync_s": statistics.median(seconds), "weight_sync_all_s": seconds, "released_gib": released}


def train_config(model_dir: str, kind: str, url: str = "") -> TrainConfig:
    ws = WeightSyncConfig(mode="sglang_tensor" if kind == "sglang" else "embedded")
    engine = EngineSection(kind="sglang", urls=(url,)) if kind == "sglang" else EngineSection(
        embedded=EmbeddedEngineConfig(max_batch_size=64, static_decode=kind == "embedded_static"))
    model = ModelConfig(path=model_dir, gradient_checkpointing=False, attn_implementation="sdpa")
    return TrainConfig(model=model, engine=engine, weight_sync=ws)


async def with_rank(cfg: TrainConfig, dist: Dist, body) -> dict[str, Any]:
    """Build the learner and its engine as a rank does, serve them, run `body(rank, url)`."""
    learner = await anyio.to_thread.run_sync(lambda: Learner.build(cfg, dist))
    engine = build_engine(cfg, dist, learner)
    rank = Rank(cfg, Path(tempfile.mkdtemp(prefix="engines-")), dist, learner, engine)
    port = free_port()
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, rank, port)
        await wait_healthy(f"http://127.0.0.1:{port}")
        try:
            return await body(rank, f"http://127.0.0.1:{port}")
        finally:
            rank.stop.set()


async def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    """Until the rank's HTTP server answers `/health` (both kinds of rank serve it)."""
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        with anyio.fail_after(timeout_s):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:  # not listening yet
                    pass
                await anyio.sleep(0.2)


async def measure_embedded(model_dir: str, vocab: int, load: Load, dist: Dist,
                           kind: str = "embedded") -> dict[str, Any]:
    async def body(rank: Rank, url: str) -> dict[str, Any]:
        await rank.sync(Empty())  # the engine's weights arrive with the first sync
        gen = await generation(url, vocab, load)
        counts = rank.engine.runner.counts  # how the steps were decoded: a fallen-back static path is no measure of it
        steps = {"decode_steps": counts["steps"], "static_steps": counts["static_steps"],
                 "static_failures": counts["static_failures"]}
        if kind == "embedded_static" and (counts["static_failures"] or not counts["static_steps"]):
            raise RuntimeError(f"the static path did not hold: {steps}")
        return gen | steps | await weights_and_memory(rank, load, sglang=False)

    return await with_rank(train_config(model_dir, kind), dist, body)


async def measure_sglang(model_dir: str, vocab: int, load: Load, dist: Dist, args: argparse.Namespace) -> dict[str, Any]:
    launch = SGLangLaunch(mem_fraction_static=args.mem_fraction, pythonpath=args.sglang_pythonpath,
                          module=args.sglang_module,
                          extra_args=tuple(args.sglang_args.split()) if args.sglang_args else SGLANG_ARGS)
    server_cfg = launch.server(model_dir, 0, str(Path(args.out) / "sglang.log"))
    t0 = time.perf_counter()
    async with SGLangServer(server_cfg) as server:
        started = time.perf_counter() - t0

        async def body(rank: Rank, _url: str) -> dict[str, Any]:
            gen = await generation(server.base_url, vocab, load)
            return gen | await weights_and_memory(rank, load, sglang=True)

        out = await with_rank(train_config(model_dir, "sglang", server.base_url), dist, body)
    return out | {"server_start_s": started}


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = [("time to first token, ms", "ttft_ms", ".1f")]
    rows += [(f"tokens/s at {n} sequence{'s' if n > 1 else ''}", f"tokens_per_s_{n}", ".0f") for n in meta["concurrency"]]
    rows += [("weight sync, s per update", "weight_sync_s", ".3f"), ("memory released for training, GiB", "released_gib", ".2f"),
             ("server start, s", "server_start_s", ".1f")]
    names = list(results)
    lines = [(f"Model {meta['model']} on {meta['device']}; prompts of {meta['prompt_tokens']} tokens, "
              f"{meta['new_tokens']} new tokens per request."), "",
             "| measure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, fmt in rows:
        cells = []
        for name in names:
            r = results[name]
            v = r.get(key)
            cells.append(r["error"][:80] if "error" in r and key == "ttft_ms" else "-" if v is None else format(v, fmt))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def model_directory(name: str, out: Path) -> str:
    """A Hugging Face directory: `random:0.5b` / `random:1.5b` writes a random-init Qwen2 of that
    shape under `out` (once; the tiny tokenizer beside it: both engines take token ids), else
    `rl.pretrained`'s."""
    if not name.startswith("random:"):
        return str(resolve_model(name))
    from agentcore.tiny_tokenizer import build_tiny_tokenizer
    from rl.learner.hf_export import export_hf
    from rl.learner.models import build_actor, qwen2_config

    target = out / f"model-{name.split(':', 1)[1]}"
    if not (target / "config.json").is_file():
        actor = build_actor(ModelConfig(hf_config=qwen2_config(name.split(":", 1)[1]), attn_implementation="sdpa"),
                            "cpu")
        export_hf(actor, build_tiny_tokenizer(out / "tokenizer"), target)
    return str(target)


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_directory(args.model, Path(args.model_cache))
    vocab = int(orjson.loads((Path(model_dir) / "config.json").read_bytes())["vocab_size"])
    load = Load(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                concurrency=tuple(int(n) for n in args.concurrency.split(",")), syncs=args.syncs)
    dist = init_distributed()
    results: dict[str, dict[str, Any]] = {}
    for kind in args.engines.split(","):
        print(f"engines: {kind} ...", file=sys.stderr, flush=True)
        try:
            if kind in ("embedded", "embedded_static"):
                results[kind] = await measure_embedded(model_dir, vocab, load, dist, kind)
            elif kind == "sglang":
                results[kind] = await measure_sglang(model_dir, vocab, load, dist, args)
            else:
                raise SystemExit(f"--engines: unknown engine {kind!r} (embedded, embedded_static, sglang)")
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - one engine failing is a result; the other still runs
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # the task group's first cause
                exc = exc.exceptions[0]
            results[kind] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"engines: {kind}: {results[kind]}", file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    meta = {"model": args.model, "device": device, **msgspec.to_builtins(load)}
    (out / "engines.json").write_bytes(orjson.dumps({"meta": meta, "results": results}, option=orjson.OPT_INDENT_2))
    text = markdown(results, meta)
    (out / "engines.md").write_text(text)
    print(text)
    return 0 if all("error" not in r for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system.engines", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m",
                   help="a named model (rl.pretrained), a Hugging Face directory, or random:0.5b / random:1.5b")
    p.add_argument("--engines", default="embedded,embedded_static,sglang")
    p.add_argument("--out", default="engines-out")
    p.add_argument("--model-cache", default=os.path.join(tempfile.gettempdir(), "cuda-agent-engines"),
                   help="where random:SIZE models are written")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--syncs", type=int, default=3)
    p.add_argument("--mem-fraction", type=float, default=0.3, help="SGLang's --mem-fraction-static")
    p.add_argument("--sglang-pythonpath", default=os.environ.get("CUDA_AGENT_SGLANG_PYTHONPATH", ""),
                   help="where sglang is installed, for the server only")
    p.add_argument("--sglang-args", default="", help=f"server flags instead of {' '.join(SGLANG_ARGS)!r}")
    p.add_argument("--sglang-module", default="sglang.launch_server", help=argparse.SUPPRESS)
    return anyio.run(run, p.parse_args(argv), backend_options={"use_uvloop": True})


if __name__ == "__main__":
    sys.exit(main())
