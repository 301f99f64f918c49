"""The task-synthesis pipeline: candidates from seed indices, through static checks,
decontamination and the GPU filters, into a dataset file; resumable and parallel.

What it is: `Synth(config, out, queues, corpus, ...)`, run as `await synth.run()`. Candidate i is a
pure function of (config.seed, i): programmatic (`compose.compose`) or, for a `mix_llm` share of
indices, written by the policy engine (`llm_compose`). Each candidate goes through

    generate -> static (check_source) -> decontaminate (similarity to KernelBench L1-3 > threshold;
    exact operator-signature matches dropped only if asked) -> duplicate (same source seen) ->
    GPU filters (`rl.data.filters` on a GpuQueue lane: load ... compile)

and ends as one JSON line: accepted in `out` (the `loaders.load_dataset_jsonl` layout, provenance
in `metadata`), rejected in `out.rejects.jsonl` with its stage, reason and measurements; a re-run
skips every index already there (resuming: at `Synth`).

Topology, one task group: `in_flight_per_lane` consumers per queue (a queue is one GPU lane)
claim the next index, build the candidate, check it on the CPU (threads) and hold their lane
only for the filter job.

What it is not: the report (`rl.data.report`) or the command line (`rl.data.synth_cmd`).

Example:
    async with open_queues(gpus=(0,), lanes_per_gpu=2, filters=FilterConfig()) as lanes:
        synth = Synth(SynthConfig(n=500), Path("tasks.jsonl"), lanes, build_corpus(kb_tasks))
        summary = await synth.run()
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore.engine import Engine
from agentcore.tasks import check_source
from agentcore.types import Task
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
from rl.data import compose as composition
from rl.data.filters import HANDLER, KIND, FilterConfig, FilterResult, filter_on_queue
from rl.data.llm_compose import LlmComposeConfig, Prompter, llm_compose
from rl.data.seeds import seed_ops
from rl.data.similarity import Fingerprint, nearest, signature_matches

PIPELINE_STAGES = ("generate", "static", "decontaminate", "duplicate", "job")
"""Stages before the GPU filters' own (`filters.STAGES`); "job": the filter job itself completed."""


class SynthConfig(Struct, frozen=True, kw_only=True):
    """What to synthesize and how hard to filter it."""

    n: int = 6000
    """Accepted tasks wanted in the output file (counting earlier runs)."""
    max_candidates: int = 0
    """Candidate indices to spend at most, from `first_index`; 0: 20 x n."""
    first_index: int = 0
    """The first candidate index."""
    seed: int = 0
    """Candidate i uses rng seed `seed + i` (programmatic) or `seed + i` for the LLM prompt."""
    mix_llm: float = 0.0
    """Share of candidates the policy engine writes (the rest are programmatic)."""
    compose: composition.Config = composition.Config()
    """Programmatic composition (depth, size scale)."""
    llm: LlmComposeConfig = LlmComposeConfig()
    """LLM composition."""
    filters: FilterConfig = FilterConfig()
    """The GPU filters (window, memory, compile)."""
    threshold: float = 0.9
    """Drop candidates more similar than this to a KernelBench L1-3 problem (the paper's 0.9)."""
    drop_signature_matches: bool = False
    """Also drop exact operator-signature matches (always reported)."""
    in_flight_per_lane: int = 2
    """Candidates in flight per queue: one on the GPU while the next is built and checked."""
    job_deadline_s: float = 300.0
    """Watchdog deadline of one filter job (torch.compile of a big graph takes a while)."""


class SynthStats(Struct, frozen=True, kw_only=True):
    """This run so far (the files hold earlier runs too)."""

    processed: int
    accepted: int
    rejected: int
    filtered: int
    in_flight: int
    total_accepted: int
    elapsed_s: float


class Lane(Struct, frozen=True, kw_only=True):
    """One GPU queue and the filter config its jobs use (its GPU's lock file)."""

    queue: GpuQueue
    filters: FilterConfig


def rejects_path(out: Path) -> Path:
    return out.with_name(out.name + ".rejects.jsonl")


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a torn last line (a killed writer) is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    rows = []
    for line in data.splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def row_index(row: dict) -> int | None:
    index = row.get("index", (row.get("metadata") or {}).get("index"))
    return index if isinstance(index, int) else None


def source_digest(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


class _Appender:
    """Whole lines, appended and fsynced: a kill leaves at most one torn line (repaired on read)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab")

    def write(self, row: dict) -> None:
        self.file.write(orjson.dumps(row) + b"\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


class Synth:
    """The pipeline over a set of lanes (the stages and the topology: module docstring).

    Accepted and rejected rows both carry the candidate's `index`; a re-run reads them
    (repairing a torn last line), skips every index already there and goes on from the first
    unprocessed one until `n` tasks are accepted or `max_candidates` indices are spent. Rows are
    appended and fsynced one at a time. Claiming stops once accepted + in flight reach `n`, and
    resumes if one in flight is rejected, so the file ends with exactly `n` accepted rows unless
    candidates run out.
    """

    def __init__(self, config: SynthConfig, out: Path, lanes: Sequence[Lane], corpus: Sequence[Fingerprint], *,
                 engine: Engine | None = None, chat: Prompter | None = None) -> None:
        if config.mix_llm > 0 and (engine is None or chat is None):
            raise ValueError("mix_llm > 0 needs an engine and a chat renderer")
        self.config, self.out, self.lanes, self.corpus = config, Path(out), list(lanes), corpus
        self.engine, self.chat = engine, chat
        self.ops = seed_ops()
        accepted, rejected = read_rows(self.out), read_rows(rejects_path(self.out))
        self.done = {i for i in map(row_index, accepted + rejected) if i is not None}
        self.seen = {source_digest(r["source"]) for r in accepted if isinstance(r.get("source"), str)}
        self.seen |= {r["source_sha1"] for r in rejected if isinstance(r.get("source_sha1"), str)}
        self.total_accepted = len(accepted)
        self.next = config.first_index
        self.limit = config.first_index + (config.max_candidates or 20 * config.n)
        self.in_flight = self.processed = self.accepted = self.filtered = 0
        self.reasons: Counter[str] = Counter()
        self.started = time.monotonic()
        self._changed = anyio.Condition()

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> SynthStats:
        """Process candidates until n are accepted or the indices run out; the stats of this run."""
        self.started = time.monotonic()
        self._good, self._bad = _Appender(self.out), _Appender(rejects_path(self.out))
        try:
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    for _ in range(self.config.in_flight_per_lane):
                        tg.start_soon(self._consume, lane)
        finally:
            self._good.close()
            self._bad.close()
        return self.statistics()

    def statistics(self) -> SynthStats:
        return SynthStats(processed=self.processed, accepted=self.accepted, rejected=self.processed - self.accepted,
                          filtered=self.filtered, in_flight=self.in_flight, total_accepted=self.total_accepted,
                          elapsed_s=time.monotonic() - self.started)

    async def _claim(self) -> int | None:
        async with self._changed:
            while True:
                while self.next in self.done:
                    self.next += 1
                if self.total_accepted >= self.config.n or self.next >= self.limit:
                    return None
                if self.total_accepted + self.in_flight < self.config.n:
                    index, self.next = self.next, self.next + 1
                    self.in_flight += 1
                    return index
                await self._changed.wait()  # all still needed are in flight: one may be rejected

    async def _consume(self, lane: Lane) -> None:
        while (index := await self._claim()) is not None:
            written, accepted = False, False
            try:
                accepted = await self._process(index, lane)
                written = True
            finally:
                # Shielded: a cancel landing on the lock would drop the count of a row already written.
                with anyio.CancelScope(shield=True):
                    async with self._changed:
                        self.in_flight -= 1
                        self.processed += written
                        self.accepted += accepted
                        self.total_accepted += accepted
                        self._changed.notify_all()

    # -- one candidate --------------------------------------------------------------------------

    def kind(self, index: int) -> str:
        """"llm" or "compose", a pure function of (seed, index)."""
        draw = random.Random(f"kind:{self.config.seed}:{index}").random()
        return "llm" if draw < self.config.mix_llm else "compose"

    async def _generate(self, index: int) -> tuple[Task | None, str, str]:
        rng_seed = self.config.seed + index
        if self.kind(index) == "llm":
            c = await llm_compose(self.engine, self.chat, rng_seed, config=self.config.llm, ops=self.ops)
            return c.task, c.reason, c.message
        try:
            task = await anyio.to_thread.run_sync(lambda: composition.compose(rng_seed, config=self.config.compose, ops=self.ops))
        except RuntimeError as exc:
            return None, "no_composition", str(exc)
        return task, "", ""

    def _cpu_checks(self, task: Task) -> tuple[str, str, str, dict]:
        """(stage, reason, message, provenance) of static checks and decontamination."""
        why = check_source(task.source)
        if why:
            return "static", "malformed", why, {}
        near_id, score = nearest(task.source, self.corpus)
        matches = signature_matches(task.source, self.corpus)
        prov = {"nearest_kernelbench": near_id, "kernelbench_similarity": round(score, 4), "signature_match": ",".join(matches)}
        if score > self.config.threshold:
            return "decontaminate", "similar_to_kernelbench", f"{score:.3f} > {self.config.threshold:g} ({near_id})", prov
        if matches and self.config.drop_signature_matches:
            return "decontaminate", "signature_match", prov["signature_match"], prov
        return "", "", "", prov

    async def _process(self, index: int, lane: Lane) -> bool:
        kind = self.kind(index)
        task, reason, message = await self._generate(index)
        base = {"index": index, "kind": kind, "task_id": task.task_id if task else f"{kind}/{self.config.seed + index}"}
        if task is None:
            self._reject({**base, "stage": "generate", "reason": reason, "message": message[-500:]})
            return False
        base |= {"ops": task.metadata.get("ops", ""), "depth": task.metadata.get("depth"), "source_sha1": source_digest(task.source)}
        stage, reason, message, prov = await anyio.to_thread.run_sync(self._cpu_checks, task)
        if stage:
            self._reject({**base, **prov, "stage": stage, "reason": reason, "message": message})
            return False
        if base["source_sha1"] in self.seen:
            self._reject({**base, **prov, "stage": "duplicate", "reason": "duplicate", "message": "same source as an earlier candidate"})
            return False
        self.seen.add(base["source_sha1"])
        result = await filter_on_queue(lane.queue, task, lane.filters, deadline_s=self.config.job_deadline_s)
        self.filtered += 1
        measured = msgspec.structs.asdict(result.measurements)
        if not result.ok:
            self._reject({**base, **prov, **measured, "stage": result.stage, "reason": result.reason, "message": result.message[-1000:]})
            return False
        meta = {**task.metadata, **prov, **measured, "index": index, "kind": kind}
        self._good.write({"task_id": task.task_id, "source": task.source, "name": task.name, "level": None, "metadata": meta})
        return True

    def _reject(self, row: dict) -> None:
        self.reasons[row["reason"]] += 1
        self._bad.write(row)


@asynccontextmanager
async def open_queues(*, gpus: Sequence[int], lanes_per_gpu: int, filters: FilterConfig, sandbox: bool = False,
                      lock_dir: str | Path | None = None, worker_start_timeout_s: float = 180.0) -> AsyncIterator[list[Lane]]:
    """`lanes_per_gpu` one-lane GpuQueues per GPU, all entered; lanes of one GPU share a flock file."""
    own = None if lock_dir else tempfile.mkdtemp(prefix="synth-locks-")
    root = Path(lock_dir or own)
    root.mkdir(parents=True, exist_ok=True)
    try:
        async with AsyncExitStack() as stack:
            lanes = []
            for gpu in gpus:
                lock = root / f"gpu{gpu}.lock"
                lock.touch()
                config = GpuQueueConfig(gpus=(gpu,), sandbox=sandbox, handlers={KIND: HANDLER}, preload=("torch",),
                                        worker_start_timeout_s=worker_start_timeout_s)
                for _ in range(lanes_per_gpu):
                    queue = await stack.enter_async_context(GpuQueue(config))
                    lanes.append(Lane(queue=queue, filters=msgspec.structs.replace(filters, gpu_lock=str(lock))))
            yield lanes
    finally:
        if own:
            for p in root.glob("*.lock"):
                p.unlink(missing_ok=True)
            root.rmdir()


__all__ = [
    "PIPELINE_STAGES",
    "FilterResult",
    "Lane",
    "Synth",
    "SynthConfig",
    "SynthStats",
    "open_queues",
    "read_rows",
    "rejects_path",
    "row_index",
]
