"""`cuda-agent synth`: synthesize training tasks into a JSON-lines dataset, resumably.

What it is: the command line around `rl.data.synth.Synth`: GPU lanes (`--gpus`, `--lanes-per-gpu`;
`--gpus none`: one lane on the CPU), the KernelBench L1-3 corpus for decontamination, optionally an engine for
LLM compositions (`--mix`, `--engine sglang --url U --model TOKENIZER_DIR` or `--engine embedded
--model MODEL_DIR`), a progress line on stderr, Ctrl-C / SIGTERM stop cleanly (the next run
resumes), then a final JSON summary on stdout (throughput, acceptance per filter, similarity)
and with `--report DIR` the Markdown/PNG report of the whole file.

    cuda-agent synth --n 6000 --out data/synth.jsonl --report data/synth_report
    cuda-agent synth --n 500 --max-candidates 500 --out s.jsonl --mix 0.2 --engine sglang \\
        --url http://127.0.0.1:30000 --model /models/qwen

What it is not: the pipeline itself (`synth.py`), the filters (`filters.py`), the report (`report.py`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import orjson

from agentcore import runtime
from agentcore.cli import HelpFormatter, checked_dir, checked_url
from agentcore.signals import stop_on_signal
from rl.data.filters import FilterConfig
from rl.data.kernelbench import default_problems_path
from rl.data.loaders import load_kernelbench
from rl.data.similarity import build_corpus

if TYPE_CHECKING:  # the pipeline imports torch: loaded after parsing, so --help stays light
    from rl.data.synth import Synth, SynthConfig, SynthStats


def gpu_list(text: str) -> tuple[int, ...]:
    """--gpus: "0,1" -> (0, 1); "none" -> () (the CPU)."""
    if text.strip().lower() == "none":
        return ()
    try:
        gpus = tuple(int(g) for g in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not GPU indices like 0,1 or none") from None
    if any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"{text!r}: GPU indices are 0 or more")
    return gpus


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cuda-agent synth", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--n", type=int, default=6000, help="accepted tasks wanted in --out (earlier runs count)")
    p.add_argument("--out", required=True, type=Path, help="dataset file (JSON lines); rejects go to OUT.rejects.jsonl")
    p.add_argument("--max-candidates", type=int, default=0, help="candidate indices to spend at most (0: 20 x n)")
    p.add_argument("--seed", type=int, default=0, help="candidate i uses rng seed SEED + i")
    p.add_argument("--gpus", type=gpu_list,
                   help="GPU indices, e.g. 0,1; none: one lane on the CPU (default: every GPU, the CPU without one)")
    p.add_argument("--lanes-per-gpu", type=int, default=2, help="worker processes per GPU (compile overlaps GPU work)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="where the filters run the tasks")
    p.add_argument("--mix", type=float, default=0.0, help="share of candidates written by the LLM engine")
    p.add_argument("--engine", choices=["sglang", "embedded"], help="engine for LLM compositions")
    p.add_argument("--url", action="append", default=[], help="SGLang server URL (repeatable)")
    p.add_argument("--model", help="tokenizer dir (sglang) or model dir (embedded)")
    p.add_argument("--min-ms", type=float, default=1.0, help="eager runtime floor")
    p.add_argument("--max-ms", type=float, default=100.0, help="eager runtime ceiling")
    p.add_argument("--memory-gib", type=float, default=16.0, help="peak memory budget of one task")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile filter")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compile filter")
    p.add_argument("--scale", type=float, default=1.0, help="size multiplier of programmatic compositions")
    p.add_argument("--max-depth", type=int, default=5, help="most operators in one composition")
    p.add_argument("--threshold", type=float, default=0.9, help="drop candidates more similar to KernelBench than this")
    p.add_argument("--drop-signature-matches", action="store_true", help="also drop exact operator-signature matches")
    p.add_argument("--kernelbench",
                   help="KernelBench problems.jsonl or directory to decontaminate against "
                        "(default: $KERNELBENCH_PROBLEMS, else the copy shipped with the package)")
    p.add_argument("--report", type=Path, help="write report.md and PNG plots of the whole file here")
    p.add_argument("--sandbox", action="store_true", help="run the filter workers inside bubblewrap")
    p.add_argument("--time-limit-s", type=float, default=0.0, help="stop after this long, print the summary (0: none)")
    p.add_argument("--job-deadline-s", type=float, default=300.0, help="watchdog deadline of one filter job")
    a = p.parse_args(argv)
    a.kernelbench = a.kernelbench or str(default_problems_path())
    if a.gpus == ():
        if a.device == "cuda":
            p.error("--gpus none runs the filters on the CPU; drop --device cuda")
        a.device, a.lanes_per_gpu = "cpu", 1
    if not Path(a.kernelbench).exists():
        p.error(f"--kernelbench {a.kernelbench}: no such file or directory")
    if a.mix > 0 and not (a.engine and a.model):
        p.error("--mix > 0 needs --engine and --model")
    if a.engine == "sglang" and a.mix > 0 and not a.url:
        p.error("--engine sglang needs --url")
    for url in a.url:
        checked_url(url)
    if a.model:
        checked_dir(a.model, "--model")
    return a


def synth_config(a: argparse.Namespace) -> SynthConfig:
    from rl.data import compose as composition
    from rl.data.llm_compose import LlmComposeConfig
    from rl.data.synth import SynthConfig

    filters = FilterConfig(device=a.device, min_ms=a.min_ms, max_ms=a.max_ms, memory_gib=a.memory_gib,
                           compile=not a.no_compile, compile_backend=a.compile_backend)
    return SynthConfig(n=a.n, max_candidates=a.max_candidates, seed=a.seed, mix_llm=a.mix,
                       compose=composition.Config(scale=a.scale, max_depth=a.max_depth),
                       llm=LlmComposeConfig(max_depth=a.max_depth), filters=filters, threshold=a.threshold,
                       drop_signature_matches=a.drop_signature_matches, job_deadline_s=a.job_deadline_s)


async def _gpus(a: argparse.Namespace) -> tuple[int, ...]:
    """The lanes' devices: the GPUs asked for, else every GPU; the CPU counts as one (0)."""
    if a.gpus:
        return a.gpus
    if a.device == "cpu":  # --gpus none sets it
        return (0,)
    from rewards.env import EnvConfig, detect_gpus

    return await detect_gpus(EnvConfig()) or (0,)  # no GPU: one lane whose worker runs on the CPU


async def _engine(a: argparse.Namespace, stack: AsyncExitStack):
    """(engine, chat renderer) for LLM compositions, or (None, None)."""
    if a.mix <= 0:
        return None, None
    from agentcore.chat import ChatRenderer
    from agentcore.tiny_tokenizer import load_tokenizer

    chat = ChatRenderer(load_tokenizer(a.model), [], "hermes")
    if a.engine == "embedded":
        from rl.engine.embedded import EmbeddedEngine

        engine = EmbeddedEngine.from_pretrained(a.model)
        return await stack.enter_async_context(engine.running()), chat
    from agentcore.sglang import Router, SGLangClient, SGLangClientConfig

    clients = [await stack.enter_async_context(SGLangClient(SGLangClientConfig(base_url=u))) for u in a.url]
    return (clients[0] if len(clients) == 1 else Router(clients)), chat


def progress_line(s: SynthStats, n: int) -> str:
    rate = 60 * s.filtered / s.elapsed_s if s.elapsed_s > 0 else 0.0
    return (f"synth [{s.total_accepted}/{n} accepted] this run: {s.processed} candidates, {s.accepted} accepted, "
            f"{s.rejected} rejected, {s.filtered} filtered on GPU ({rate:.1f}/min), {s.in_flight} in flight, {s.elapsed_s:.0f}s")


async def _progress(synth: Synth, n: int, interval_s: float = 1.0) -> None:
    tty = sys.stderr.isatty()
    last_print = 0.0
    while True:
        await anyio.sleep(interval_s)
        line = progress_line(synth.statistics(), n)
        if tty:
            sys.stderr.write("\r\x1b[2K" + line)
        elif time.monotonic() - last_print >= 30.0:
            sys.stderr.write(line + "\n")
            last_print = time.monotonic()
        sys.stderr.flush()


async def run(a: argparse.Namespace) -> dict:
    """The whole command; returns the final summary."""
    from rl.data.synth import Synth, open_queues

    config = synth_config(a)
    kb = await anyio.to_thread.run_sync(lambda: load_kernelbench(a.kernelbench, levels={1, 2, 3}))
    corpus = await anyio.to_thread.run_sync(build_corpus, kb.tasks)
    gpus = await _gpus(a)
    lock_dir = a.out.resolve().parent / f".{a.out.name}.locks"
    async with AsyncExitStack() as stack:
        engine, chat = await _engine(a, stack)
        lanes = await stack.enter_async_context(open_queues(gpus=gpus, lanes_per_gpu=a.lanes_per_gpu, filters=config.filters,
                                                            sandbox=a.sandbox, lock_dir=lock_dir))
        synth = Synth(config, a.out, lanes, corpus, engine=engine, chat=chat)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_progress, synth, config.n)
            tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent synth", " (re-run to resume)")
            with anyio.move_on_after(a.time_limit_s or math.inf):
                await synth.run()  # stopped early: in-flight candidates are redone by the next run
            tg.cancel_scope.cancel()
        stats = synth.statistics()
        queues = [msgspec.to_builtins(lane.queue.statistics()) for lane in lanes]
    sys.stderr.write("\n" + progress_line(stats, config.n) + "\n")
    return final_summary(a, stats, queues, len(kb.tasks))


def final_summary(a: argparse.Namespace, stats: SynthStats, queues: list, corpus_size: int) -> dict:
    from rl.data.report import summarize, write_report
    from rl.data.synth import read_rows, rejects_path

    accepted, rejected = read_rows(a.out), read_rows(rejects_path(a.out))
    whole = summarize(accepted, rejected)
    minutes = max(stats.elapsed_s, 1e-9) / 60
    this_run = {"candidates": stats.processed, "accepted": stats.accepted, "filtered_on_gpu": stats.filtered,
                "elapsed_s": round(stats.elapsed_s, 1), "filtered_per_min": round(stats.filtered / minutes, 2),
                "candidates_per_min": round(stats.processed / minutes, 2), "gpus": _gpus_text(a.gpus),
                "lanes_per_gpu": a.lanes_per_gpu, "kernelbench_problems": corpus_size,
                "queue_busy_fraction": [round(q["busy_fraction"], 3) for q in queues]}
    summary = {"out": str(a.out), "this_run": this_run, **whole}
    if a.report:
        paths = write_report(a.report, whole, accepted, rejected, extra=this_run)
        summary["report"] = [str(p) for p in paths]
    return summary


def _gpus_text(gpus: tuple[int, ...] | None) -> str:
    if gpus is None:
        return "auto"
    return ",".join(map(str, gpus)) if gpus else "none"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    summary = runtime.run(run, a)
    sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
