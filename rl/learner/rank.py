"""A learner rank process: `python -m rl.learner.rank --run-dir RUN --port-base P --launch-id ID` (under
torchrun for several GPUs, started by `rl/learner_client.py`).

What it is: the process that owns one GPU's share of the learner (FSDP2 actor and critic) and,
colocated on the same GPU, an embedded engine replica. One HTTP server on port P + rank speaks
SGLang's native API for the engine (so the orchestrator reaches it with the same client as a
real SGLang server) and the learner commands under `/learner/` (bodies and answers are the
Structs of `rl/learner/protocol.py`):
  POST /learner/step     StepRequest -> StepReply    one update on this rank's share of the batch
  POST /learner/sync     -> SyncReply                actor weights -> this rank's engine, new version
                                                     (sglang_tensor: -> its colocated SGLang server)
  POST /learner/save     SaveRequest -> SaveReply    checkpoint (collective), HF export on rank 0;
                                                     with checkpoint.background, returns once staged
  POST /learner/wait     -> SaveReply                until the background save in flight is committed
  POST /learner/load     LoadRequest -> LoadReply    restore the latest checkpoint of run_dir
  POST /learner/release  ReleaseRequest              free the colocated engine's memory for training
  POST /learner/resume                               restore what release freed and the sync did not
  GET  /learner/info     -> InfoReply                rank, world size, device, version
  POST /learner/shutdown                             finish the save in flight, stop serving and exit
  GET  /health           -> HealthReply              the run directory and the driver's launch id
Commands are collectives: the driver sends each to every rank, and they run one at a time in a
worker thread, so generation requests and health checks are still answered meanwhile. A failed
command answers 500 with a `Failure` (the driver raises `LearnerError` with its message). A rank
whose port is taken exits with one line naming the port and `layout.port_base`.
With `engine.kind=sglang` there is no embedded engine: `weight_sync.mode=sglang_tensor` makes
rank r publish to `engine.urls[r]` (the server colocated on its GPU) through
`rl.weight_sync.sync_tensor` - the rank owns the gathered bf16 buckets, so the server opens their
CUDA IPC handles while the rank keeps them alive (on CPU the tensors go by value); any other mode
exports the actor to RUN/weights/vN for the driver's `update_weights_from_disk`.
Memory release (`engine.release_during_training`): the embedded engine frees its KV cache; the
colocated SGLang server is paused and frees KV cache and CUDA graphs, and with `weights` (a sync
follows) its weights, which the next `sync_tensor(..., released=True)` brings back before the
buckets, the rest after them. `resume` restores what is still released (after a value step, or
after a failure, so a `--resume`d run finds the server whole) and continues generation.
What it is not: the driver (`rl/learner_client.py`) or the update math (`rl/learner/update.py`).
"""

from __future__ import annotations

import argparse
import collections
import copy
import logging
import shutil
import traceback
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import msgspec
import torch

from agentcore.lifeline import die_with_parent
from agentcore.sglang import SGLangClient, SGLangClientConfig
from rl.config import TrainConfig, load_config
from rl.engine.embedded import EmbeddedEngine, resolve_dtype
from rl.engine.http import HttpServer, HttpServerConfig
from rl.engine.server import EngineServer, EngineServerConfig
from rl.learner.actor_critic import Learner
from rl.learner.fsdp import (
    Dist,
    close_distributed,
    end_rank_process,
    full_state_items,
    init_distributed,
)
from rl.learner.models import hf_model
from rl.learner.protocol import (
    HEALTH,
    INFO,
    LOAD,
    RELEASE,
    RESUME,
    SAVE,
    SHUTDOWN,
    STEP,
    SYNC,
    WAIT,
    Empty,
    Failure,
    HealthReply,
    InfoReply,
    LoadReply,
    LoadRequest,
    ReleaseRequest,
    Route,
    SaveReply,
    SaveRequest,
    StepReply,
    StepRequest,
    SyncReply,
    decode_samples,
)
from rl.weight_sync import release as release_server
from rl.weight_sync import resume as resume_server
from rl.weight_sync import return_device_memory, sync_tensor

log = logging.getLogger("cuda-agent.rank")


class PortTaken(RuntimeError):
    """This rank's HTTP port is bound by another process (often another run's learner)."""


class Rank:
    """The learner and engine of this process, and the command handlers over them."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: Dist, learner: Learner, engine: EmbeddedEngine | None,
                 *, launch_id: str = ""):
        self.cfg, self.run_dir, self.dist, self.learner, self.engine = cfg, run_dir, dist, learner, engine
        self.launch_id = launch_id  # the driver's token for this start, answered by /health
        self.commands = anyio.CapacityLimiter(1)  # collectives run one at a time, in order
        self.stop = anyio.Event()
        self.server: SGLangClient | None = None  # sglang_tensor: this rank's colocated server
        self.server_tp_size = 0  # its TP ranks, read from /server_info at the first sync
        self.server_released: set[str] = set()  # memory tags the server freed, not yet restored

    async def _in_thread(self, fn: Callable[[], Any]) -> Any:
        """`fn` in a worker thread, on this rank's GPU: the current CUDA device is per thread and a
        fresh thread's is cuda:0, where rank k's collectives would fail (seen on 6 H200 ranks:
        "Attempt to perform collective on tensor not on device passed to init_process_group")."""
        def on_device() -> Any:
            if self.dist.device.type == "cuda":
                torch.cuda.set_device(self.dist.device)
            return fn()

        return await anyio.to_thread.run_sync(on_device, limiter=self.commands)

    async def step(self, req: StepRequest) -> StepReply:
        samples = decode_samples(Path(req.batch_path).read_bytes())
        metrics = await self._in_thread(lambda: self.learner.step(req.kind, samples, req.lr_scale))
        return StepReply(metrics=metrics)

    @asynccontextmanager
    async def colocated_server(self):
        """Open the client of this rank's SGLang server when weights go there as tensors."""
        cfg = self.cfg
        if cfg.engine.kind != "sglang" or cfg.weight_sync.mode != "sglang_tensor":
            yield
            return
        retry_s = cfg.weight_sync.server_retry_s
        client_cfg = SGLangClientConfig(base_url=cfg.engine.urls[self.dist.rank], retry_budget_s=retry_s,
                                        backoff_base_s=min(0.5, retry_s / 8))
        async with SGLangClient(client_cfg) as self.server:
            yield

    async def sync_tensor(self) -> SyncReply:
        """Actor -> this rank's SGLang server as bf16 buckets (`update_weights_from_tensor`); the
        version is the number of actor updates, recorded by the server with the last bucket and
        returned in every generation's meta_info, so each trajectory carries it."""
        ws, version = self.cfg.weight_sync, self.learner.optimizer_steps
        buckets = full_state_items(self.learner.actor, ws.bucket_bytes, dtype=getattr(torch, ws.dtype))
        async with self.commands:  # a collective (all-gathers): after any command still running
            if not self.server_tp_size:
                try:
                    info = await self.server.get_server_info()
                except Exception:  # the other ranks are gathering: take part, then fail
                    await anyio.to_thread.run_sync(self._drain, buckets)
                    raise
                self.server_tp_size = max(1, int(info.raw.get("tp_size") or 1))
            released = "weights" in self.server_released
            report = await sync_tensor(self.server, buckets, version, ws, released=released,
                                       tp_size=self.server_tp_size)
            if released:  # restored by the sync: weights before the buckets, KV cache after
                self.server_released.clear()
        self.learner.version = version
        return SyncReply(version=version, metrics={"weight_sync_s": report.seconds, "weight_sync_bytes": float(report.bytes),
                                                   "weight_sync_buckets": report.buckets})

    def _drain(self, buckets) -> None:
        if self.dist.device.type == "cuda":  # a fresh worker thread would default to cuda:0
            torch.cuda.set_device(self.dist.device)
        collections.deque(buckets, maxlen=0)

    async def sync(self, req: Empty) -> SyncReply:
        if self.server is not None:
            return await self.sync_tensor()
        if self.engine is None:  # SGLang servers: export for update_weights_from_disk (driver side)
            version = self.learner.optimizer_steps
            out = self.run_dir / "weights" / f"v{version:06d}"
            t0 = anyio.current_time()
            await self._in_thread(lambda: self.learner.export(out, self.cfg.data.tokenizer))
            self.learner.version = version
            if self.dist.is_main:  # servers have loaded the previous one; keep two at most
                for old in sorted(out.parent.glob("v*"))[:-2]:
                    shutil.rmtree(old, ignore_errors=True)
            return SyncReply(version=version, metrics={"export_s": anyio.current_time() - t0}, path=str(out))
        engine = self.engine
        await engine.begin_update()
        ok = False
        try:
            load = lambda bucket: anyio.from_thread.run(engine.load_bucket, bucket)  # noqa: E731
            metrics = await self._in_thread(lambda: self.learner.publish_weights(load))
            ok = True
        finally:
            engine.end_update(self.learner.version if ok else None)
        return SyncReply(version=int(metrics.pop("version")), metrics=metrics)

    async def save(self, req: SaveRequest) -> SaveReply:
        out = self.run_dir / "hf" if req.export else None
        metrics = await self._in_thread(lambda: self.learner.save(self.run_dir, req.step, req.extra, out))
        return SaveReply(metrics=metrics)

    async def wait(self, req: Empty) -> SaveReply:
        """Until the background save in flight is committed (its failure answers 500)."""
        return SaveReply(metrics=await self._in_thread(self.learner.wait_saved))

    async def load(self, req: LoadRequest) -> LoadReply:
        found = await self._in_thread(lambda: self.learner.load(Path(req.run_dir)))
        if found is None:
            return LoadReply(found=False)
        return LoadReply(found=True, step=found[0], extra=found[1])

    async def release(self, req: ReleaseRequest) -> Empty:
        if self.engine is not None:
            await self.engine.release_memory(["kv_cache"])
        if self.server is None:
            return Empty()
        tags = ["weights"] * req.weights + ["kv_cache", "cuda_graph"]
        try:  # the tags count as released from the release request on: a half-done one is undone by resume
            await release_server(self.server, self.cfg.weight_sync, tags,
                                 releasing=lambda: self.server_released.update(tags))
        except Exception as exc:
            raise RuntimeError(f"{self._who()}: releasing memory {tags} failed: {exc}") from exc
        return Empty()

    async def resume(self, req: Empty) -> Empty:
        if self.engine is not None:
            await self.engine.resume_memory(["kv_cache"])
        if self.server is None or not self.server_released:
            return Empty()
        tags = sorted(self.server_released)
        await self._in_thread(return_device_memory)  # the server allocates what training freed
        try:
            await resume_server(self.server, tags)
            await self.server.continue_generation()  # release left it paused
        except Exception as exc:
            raise RuntimeError(f"{self._who()}: resuming memory {tags} failed: {exc}") from exc
        self.server_released.clear()
        return Empty()

    def _who(self) -> str:
        return f"learner rank {self.dist.rank}, SGLang server {self.server.base_url}"

    async def info(self, req: Empty) -> InfoReply:
        d = self.dist
        return InfoReply(rank=d.rank, world_size=d.world_size, device=str(d.device),
                         version=self.learner.version, optimizer_steps=self.learner.optimizer_steps)

    async def health(self, req: Empty) -> HealthReply:
        return HealthReply(run_dir=str(self.run_dir), launch_id=self.launch_id)

    async def shutdown(self, req: Empty) -> Empty:
        """Stop serving once the save in flight is committed: the driver ends (and SIGTERMs the
        ranks) when this answers, and the run's last checkpoint and RUN/hf must exist by then."""
        try:
            await self._in_thread(self.learner.close)
        finally:
            self.stop.set()
        return Empty()

    def routes(self) -> dict[tuple[str, str], Callable[[Any], Awaitable[tuple[int, Any]]]]:
        table: dict[Route, Callable[[Any], Awaitable[msgspec.Struct]]] = {
            STEP: self.step, SYNC: self.sync, SAVE: self.save, WAIT: self.wait, LOAD: self.load,
            RELEASE: self.release, RESUME: self.resume, INFO: self.info, SHUTDOWN: self.shutdown,
            HEALTH: self.health,  # with an embedded engine, in place of SGLang's empty /health
        }
        return {(route.method, route.path): _answering(route, fn) for route, fn in table.items()}


def _answering(route: Route, fn: Callable[[Any], Awaitable[msgspec.Struct]]) -> Callable[[Any], Awaitable[tuple[int, Any]]]:
    """The HTTP handler of `route`: the JSON body as its request, the reply as JSON; a failed
    command (or a malformed body) answers 500 with a `Failure` holding the traceback."""

    async def handler(body: Any) -> tuple[int, Any]:
        try:
            return 200, msgspec.to_builtins(await fn(route.request_from(body or {})))
        except Exception as exc:
            log.exception("%s failed", route.path)
            return 500, msgspec.to_builtins(Failure(message=f"{exc!r}\n{traceback.format_exc(limit=6)}"))

    return handler


def build_engine(cfg: TrainConfig, dist: Dist, learner: Learner) -> EmbeddedEngine | None:
    """This rank's engine replica: the actor's architecture in the engine's dtype on this
    rank's device; its weights arrive with the first sync."""
    if cfg.engine.kind != "embedded":
        return None
    from transformers import AutoModelForCausalLM

    ecfg = msgspec.structs.replace(cfg.engine.embedded, device=str(dist.device))
    with torch.device(dist.device):
        model = AutoModelForCausalLM.from_config(
            copy.deepcopy(hf_model(learner.actor).config),
            dtype=resolve_dtype(ecfg.dtype, dist.device),
            attn_implementation=ecfg.attn_implementation,
        )
    return EmbeddedEngine(model, ecfg)


async def serve(rank: Rank, port: int) -> None:
    """Serve the rank's routes on `port` until shutdown; raises `PortTaken` if it cannot bind."""
    async with rank.colocated_server(), anyio.create_task_group() as tg:
        if rank.engine is not None:
            server = EngineServer(rank.engine, EngineServerConfig(port=port, model_path=str(rank.run_dir)),
                                  routes=rank.routes())
            await tg.start(rank.engine.serve)
        else:
            server = HttpServer(rank.routes(), HttpServerConfig(port=port))
        try:
            await tg.start(server.serve)
        except OSError as exc:
            raise PortTaken(f"learner rank {rank.dist.rank} cannot listen on port {port} ({exc.strerror or exc}): "
                            "set layout.port_base to a free range (0 picks one)") from None
        log.info("rank %d serving on port %d", rank.dist.rank, port)
        await rank.stop.wait()
        tg.cancel_scope.cancel()


def limit_memory(device: torch.device, share: float) -> None:
    """Cap what this process may hold on `device` at `share` of its memory. An allocation past the
    cap first frees the allocator's cached blocks and retries, so a rank that shares its GPU with
    other runs keeps only what it uses; with share 1 nothing changes."""
    if device.type == "cuda" and share < 1:
        torch.cuda.set_per_process_memory_fraction(share, device)
        log.info("memory: at most %.0f%% of %s (%.1f GiB)", 100 * share, device,
                 share * torch.cuda.get_device_properties(device).total_memory / 2**30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rl.learner.rank")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--port-base", type=int, required=True)
    p.add_argument("--launch-id", required=True)
    a = p.parse_args(argv)
    die_with_parent()  # under torchrun the parent is its agent, which dies with the trainer (lifeline)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s rank: %(message)s")
    run_dir = Path(a.run_dir)
    cfg = load_config(run_dir)
    dist = init_distributed()
    limit_memory(dist.device, cfg.layout.learner_memory_share)
    if dist.device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads() // dist.world_size))
    learner = Learner.build(cfg, dist)
    rank = Rank(cfg, run_dir, dist, learner, build_engine(cfg, dist, learner), launch_id=a.launch_id)
    finished, code = False, 0
    try:
        anyio.run(serve, rank, a.port_base + dist.rank, backend_options={"use_uvloop": True})
        finished = True
    except* PortTaken as taken:  # one line for the driver's "learner ranks exited" error, no traceback
        log.error("%s", taken.exceptions[0])
        code = 1
    finally:
        close_distributed(sync=finished)
    return code


if __name__ == "__main__":
    end_rank_process(main())  # past a clean finish, a gloo rank's teardown can only abort
