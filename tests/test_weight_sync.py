"""rl.weight_sync against the fake SGLang server (real HTTP on loopback): the pause -> flush ->
buckets -> flush -> continue order, versions, failures with shielded cleanup, memory release,
the disk path, the embedded engine, and the wire format SGLang's restricted unpickler accepts.

The contract tests (those taking `sglang_backend`) also run against a real SGLang server under
the `sglang` marker: there the learner's bf16 buckets leave this process as CUDA IPC handles on
the server's GPU, and what the server then generates must be what the same checkpoint loaded
from disk generates."""

from __future__ import annotations

import base64
import io
import pickle
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import torch

from agentcore.engine import SamplingParams
from agentcore.sglang import SGLangClient, SGLangClientConfig
from rl.weight_sync import (
    SyncReport,
    WeightSyncConfig,
    WeightSyncError,
    release,
    serialize_named_tensors,
    sync_disk,
    sync_embedded,
    sync_tensor,
)
from tests.fakes.sglang_server import FakeSGLangServer
from tests.sglang_backends import REAL_ONLY, greedy, weight_buckets

BOUND_S = 30
FAST = WeightSyncConfig(mode="sglang_tensor", flush_timeout_s=5.0, flush_poll_s=0.01)
CONTROL = {
    "/pause_generation",
    "/flush_cache",
    "/update_weights_from_tensor",
    "/continue_generation",
    "/resume_memory_occupation",
    "/release_memory_occupation",
    "/get_weight_version",
    "/update_weights_from_disk",
}


class RecordingServer(FakeSGLangServer):
    """The fake, plus: every path in arrival order, scripted busy flushes, updates that succeed
    without moving the version."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[str] = []
        self.busy_flushes = 0
        self.ignore_versions = False

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        self.calls.append(path)
        if path == "/flush_cache" and self.busy_flushes:
            self.busy_flushes -= 1
            return 400, "Cache not flushed: requests are running.\n"
        if path.startswith("/update_weights") and self.ignore_versions:
            return 200, {"success": True, "message": "ok"}
        return await super()._dispatch(method, path, body)

    def updates(self) -> list[dict[str, Any]]:
        return [d for p, d in self.control_requests if p == "/update_weights_from_tensor"]


@asynccontextmanager
async def serving():
    async with RecordingServer() as fake:
        async with SGLangClient(
            SGLangClientConfig(base_url=fake.url, backoff_base_s=0.01)
        ) as client:
            yield fake, client


def buckets() -> list[list[tuple[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    return [
        [
            ("model.embed_tokens.weight", torch.randn(8, 4, generator=g)),
            ("model.norm.weight", torch.ones(4, dtype=torch.bfloat16)),
        ],
        [],  # an empty bucket is skipped, not posted
        [("lm_head.weight", torch.randn(8, 4, generator=g))],
    ]


def compressed(calls: list[str]) -> list[str]:
    """Paths in order with consecutive repeats folded (busy flushes, one POST per bucket)."""
    out: list[str] = []
    for path in calls:
        if path in CONTROL and (not out or out[-1] != path):
            out.append(path)
    return out


# -- the SGLang side of the wire, as SGLang's MultiprocessingSerializer.deserialize reads it ----

SGLANG_ALLOWED = ("builtins.", "collections.", "copyreg.", "functools.", "torch.")


class SGLangLikeUnpickler(pickle.Unpickler):
    """SGLang's restricted unpickler (allow-listed module prefixes, CVE-2025-10164), narrowed
    to the prefixes our payload may need."""

    def find_class(self, module: str, name: str) -> Any:
        if not any((module + ".").startswith(p) for p in SGLANG_ALLOWED):
            raise pickle.UnpicklingError(f"blocked {module}.{name}")
        return super().find_class(module, name)


def sglang_decode(entry: str) -> list[tuple[str, torch.Tensor]]:
    return SGLangLikeUnpickler(io.BytesIO(base64.b64decode(entry, validate=True))).load()


# -- wire format ---------------------------------------------------------------------------------


def test_payload_round_trips_through_sglangs_restricted_unpickler():
    named = buckets()[0] + [("ids", torch.arange(5))]
    decoded = sglang_decode(serialize_named_tensors(named))
    assert [n for n, _ in decoded] == [n for n, _ in named]
    for (_, got), (_, want) in zip(decoded, named):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_restricted_unpickler_refuses_foreign_globals():
    entry = base64.b64encode(pickle.dumps([("x", SyncReport)])).decode()
    with pytest.raises(pickle.UnpicklingError, match="blocked rl.weight_sync"):
        sglang_decode(entry)


# -- sync_tensor -------------------------------------------------------------------------------


async def test_order_is_pause_flush_buckets_flush_continue():
    async with serving() as (fake, client):
        with anyio.fail_after(BOUND_S):
            report = await sync_tensor(client, buckets(), 7, FAST)
    assert compressed(fake.calls) == [
        "/pause_generation",
        "/flush_cache",
        "/update_weights_from_tensor",
        "/flush_cache",
        "/continue_generation",
        "/get_weight_version",
    ]
    assert report.buckets == 2 and report.tensors == 3 and report.version == 7
    assert report.bytes == 8 * 4 * 4 + 4 * 2 + 8 * 4 * 4


async def test_buckets_carry_sglang_payloads_and_the_version_goes_last():
    async with serving() as (fake, client):
        await sync_tensor(client, buckets(), 7, FAST)
    first, last = fake.updates()
    assert "weight_version" not in first and last["weight_version"] == "7"
    assert first["flush_cache"] is False and first["load_format"] is None
    names = [n for n, _ in sglang_decode(first["serialized_named_tensors"][0])]
    assert names == ["model.embed_tokens.weight", "model.norm.weight"]
    ((name, tensor),) = sglang_decode(last["serialized_named_tensors"][0])
    assert name == "lm_head.weight" and torch.equal(tensor, buckets()[2][0][1])


async def test_new_version_is_visible_afterwards():
    async with serving() as (fake, client):
        await sync_tensor(client, buckets(), 3, FAST)
        assert await client.get_weight_version() == 3
        gen = await client.generate([1, 2], SamplingParams(max_new_tokens=2), session_id="s")
    assert gen.weight_version == 3


async def test_busy_flush_is_retried_until_idle():
    async with serving() as (fake, client):
        fake.busy_flushes = 3
        await sync_tensor(client, buckets(), 1, FAST)
    first_update = fake.calls.index("/update_weights_from_tensor")
    assert fake.calls[:first_update].count("/flush_cache") == 4


async def test_failed_update_raises_and_still_continues_generation():
    async with serving() as (fake, client):
        fake.fail_weight_updates = True
        with pytest.raises(WeightSyncError, match=r"version 5 .* bucket 0: .*injected"):
            await sync_tensor(client, buckets(), 5, FAST)
        assert fake.calls[-1] == "/continue_generation"
        with anyio.fail_after(BOUND_S):  # not left paused: generation still answers
            gen = await client.generate([1], SamplingParams(max_new_tokens=2), session_id="s")
    assert len(gen.token_ids) == 2


class Gathered:
    """A bucket iterator that counts how far it was run (full_state_items is a collective)."""

    def __init__(self, items) -> None:
        self.items, self.produced = list(items), 0

    def __iter__(self):
        for bucket in self.items:
            self.produced += 1
            yield bucket


async def test_after_a_failure_the_buckets_are_still_gathered_to_the_end():
    gathered = Gathered(buckets())
    async with serving() as (fake, client):
        fake.fail_weight_updates = True
        with pytest.raises(WeightSyncError):
            await sync_tensor(client, gathered, 5, FAST)
    assert len(fake.updates()) == 1 and gathered.produced == 3  # one POST tried, then drained


async def test_server_that_never_idles_times_out_and_continues():
    cfg = WeightSyncConfig(flush_timeout_s=0.3, flush_poll_s=0.01)
    async with serving() as (fake, client):
        fake.busy_flushes = 10**6
        with pytest.raises(WeightSyncError, match="stayed busy"):
            await sync_tensor(client, buckets(), 1, cfg)
        assert "/update_weights_from_tensor" not in fake.calls
        assert fake.calls[-1] == "/continue_generation"


async def test_each_tp_rank_gets_a_payload_of_its_own():
    async with serving() as (fake, client):
        await sync_tensor(client, buckets(), 4, FAST, tp_size=2)
    for update in fake.updates():
        ranks = [sglang_decode(entry) for entry in update["serialized_named_tensors"]]
        assert len(ranks) == 2 and [n for n, _ in ranks[0]] == [n for n, _ in ranks[1]]


async def test_tags_count_as_released_only_once_the_release_request_goes_out():
    released: list[list[str]] = []
    cfg = WeightSyncConfig(flush_timeout_s=0.3, flush_poll_s=0.01)
    async with serving() as (fake, client):
        fake.busy_flushes = 10**6  # never idle: nothing is released, so nothing may be resumed
        with pytest.raises(WeightSyncError, match="stayed busy"):
            await release(client, cfg, ["kv_cache"], releasing=lambda: released.append(list(fake.calls)))
        assert released == [] and "/release_memory_occupation" not in fake.calls
        fake.busy_flushes = 0
        await release(client, cfg, ["kv_cache"], releasing=lambda: released.append(list(fake.calls)))
    assert len(released) == 1 and "/release_memory_occupation" not in released[0]
    assert fake.released_tags == {"kv_cache"}


async def test_cancelled_sync_still_continues_generation():
    async with serving() as (fake, client):
        fake.busy_flushes = 10**6
        with anyio.move_on_after(0.3):
            await sync_tensor(client, buckets(), 1, FAST)
        assert fake.calls[-1] == "/continue_generation"


async def test_version_mismatch_after_update_is_an_error():
    async with serving() as (fake, client):
        fake.ignore_versions = True
        with pytest.raises(WeightSyncError, match="reports weight version 0 after loading 4"):
            await sync_tensor(client, buckets(), 4, FAST)


async def test_no_tensors_is_an_error_and_continues():
    async with serving() as (fake, client):
        with pytest.raises(WeightSyncError, match="no tensors"):
            await sync_tensor(client, [[], []], 2, FAST)
        assert fake.calls[-1] == "/continue_generation"


async def test_the_learner_hands_its_free_gpu_memory_back_before_the_server_resumes(monkeypatch):
    """The server resumes its weights and KV cache through the driver: the learner's caching
    allocator (training's activations, the gathered buckets) must have returned its free blocks
    first. The CUDA edge is faked: torch's cache calls are recorded beside the server's."""
    import rl.weight_sync as ws

    async with serving() as (fake, client):
        monkeypatch.setattr(ws, "_current_cuda_device", lambda: None)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: fake.calls.append("empty_cache"))
        await release(client, FAST)
        fake.calls.clear()
        await sync_tensor(client, buckets(), 2, FAST, released=True)
    order = [c for c in fake.calls if c in ("empty_cache", "/resume_memory_occupation")]
    assert order == ["empty_cache", "/resume_memory_occupation", "empty_cache", "/resume_memory_occupation"]


async def test_release_then_sync_restores_memory_in_slime_order():
    async with serving() as (fake, client):
        await release(client, FAST)
        assert fake.released_tags == {"weights", "kv_cache", "cuda_graph"}
        assert compressed(fake.calls) == [
            "/pause_generation",
            "/flush_cache",
            "/release_memory_occupation",
        ]
        fake.calls.clear()
        await sync_tensor(client, buckets(), 2, FAST, released=True)
        assert fake.released_tags == set()
    resumes = [d["tags"] for p, d in fake.control_requests if p == "/resume_memory_occupation"]
    assert resumes == [["weights"], ["kv_cache", "cuda_graph"]]
    assert compressed(fake.calls) == [
        "/pause_generation",
        "/resume_memory_occupation",
        "/flush_cache",
        "/update_weights_from_tensor",
        "/flush_cache",
        "/resume_memory_occupation",
        "/continue_generation",
        "/get_weight_version",
    ]


# -- the contract, against the fake and (marker `sglang`) a real server -------------------------


async def test_disk_sync_serves_the_checkpoint_at_its_version(sglang_backend):
    a, b = sglang_backend.checkpoints
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        await sync_disk([client], a, version + 1, FAST)
        on_a = await greedy(client)
        report = await sync_disk([client], b, version + 2, FAST)
        on_b = await greedy(client)
        await sync_disk([client], a, version + 3, FAST)
        assert await greedy(client) == on_a
        assert await client.get_weight_version() == version + 3
    assert report.version == version + 2
    assert (on_b != on_a) == sglang_backend.is_model  # the fake's chain ignores weights


async def test_tensor_sync_serves_what_the_checkpoint_on_disk_serves(sglang_backend):
    a, b = sglang_backend.checkpoints
    buckets_b = weight_buckets(b, sglang_backend.device)
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        await sync_disk([client], b, version + 1, FAST)
        on_b = await greedy(client)
        await sync_disk([client], a, version + 2, FAST)
        on_a = await greedy(client)
        report = await sync_tensor(client, iter(buckets_b), version + 3, FAST)
        assert await greedy(client) == on_b
        gen = await client.generate([1, 2], SamplingParams(max_new_tokens=2), session_id="s")
    assert report.version == gen.weight_version == version + 3
    assert report.tensors == sum(len(bucket) for bucket in buckets_b) and report.buckets > 1
    assert (on_b != on_a) == sglang_backend.is_model


async def test_release_then_tensor_sync_serves_the_weights_again(sglang_backend):
    a = sglang_backend.checkpoints.a
    buckets_a = weight_buckets(a, sglang_backend.device)
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        await sync_disk([client], a, version + 1, FAST)
        before = await greedy(client)
        await release(client, FAST)  # weights, KV cache and CUDA graphs freed
        await sync_tensor(client, iter(buckets_a), version + 2, FAST, released=True)
        assert await greedy(client) == before
        assert await client.get_weight_version() == version + 2


@REAL_ONLY
async def test_release_frees_the_servers_gpu_memory(sglang_backend):
    a = sglang_backend.checkpoints.a
    buckets_a = weight_buckets(a, "cuda")  # before measuring: they take GPU memory too
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        before = torch.cuda.mem_get_info(0)[0]  # the server's GPU (base_gpu_id 0)
        await release(client, FAST)
        freed = torch.cuda.mem_get_info(0)[0] - before
        await sync_tensor(client, iter(buckets_a), version + 1, FAST, released=True)
        still_free = torch.cuda.mem_get_info(0)[0] - before
    assert freed > 1 << 30, f"release freed {freed / 2**20:.0f} MiB"
    assert still_free < freed / 2, f"{still_free / 2**20:.0f} of {freed / 2**20:.0f} MiB stayed free after the sync"


# -- sync_disk ---------------------------------------------------------------------------------


async def test_disk_update_reaches_every_server_with_its_version(tmp_path):
    async with RecordingServer() as a, RecordingServer() as b:
        clients = [SGLangClient(SGLangClientConfig(base_url=s.url)) for s in (a, b)]
        report = await sync_disk(clients, str(tmp_path), 9)
        for c in clients:
            await c.aclose()
    assert report.version == 9
    for fake in (a, b):
        assert fake.weight_version == "9"
        body = next(d for p, d in fake.control_requests if p == "/update_weights_from_disk")
        assert body == {"model_path": str(tmp_path), "weight_version": "9"}
        assert fake.calls[-1] == "/get_weight_version"


async def test_failed_disk_update_names_the_server_and_others_still_load(tmp_path):
    async with RecordingServer() as good, RecordingServer() as bad:
        bad.fail_weight_updates = True
        clients = [SGLangClient(SGLangClientConfig(base_url=s.url)) for s in (good, bad)]
        with pytest.raises(
            WeightSyncError, match=f"1/2 server.* {tmp_path} as version 2: {bad.url}"
        ):
            await sync_disk(clients, str(tmp_path), 2)
        for c in clients:
            await c.aclose()
    assert good.weight_version == "2"


# -- embedded ----------------------------------------------------------------------------------


class Engine:
    """The embedded engine's update API (rl/engine/embedded.py), recording what it is given."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.events: list[Any] = []
        self.fail_at = fail_at

    async def begin_update(self) -> None:
        self.events.append("begin")

    async def load_bucket(self, named_tensors) -> None:
        await anyio.sleep(0)
        if len(self.events) - 1 == self.fail_at:
            raise ValueError("unknown parameter name")
        self.events.append([n for n, _ in named_tensors])

    def end_update(self, version: int | None) -> None:
        self.events.append(("end", version))


async def test_embedded_engine_gets_every_bucket_in_one_update():
    engine = Engine()
    report = await sync_embedded(engine, iter(buckets()), 4)
    assert engine.events == [
        "begin",
        ["model.embed_tokens.weight", "model.norm.weight"],
        ["lm_head.weight"],
        ("end", 4),
    ]
    assert (report.buckets, report.tensors, report.version) == (2, 3, 4)


async def test_embedded_failure_keeps_the_old_version_and_gathers_every_bucket():
    engine, gathered = Engine(fail_at=1), Gathered(buckets())
    with pytest.raises(ValueError, match="unknown parameter"):
        await sync_embedded(engine, gathered, 4)
    assert engine.events[-1] == ("end", None)
    assert gathered.produced == 3


# -- CUDA IPC (GPU) ----------------------------------------------------------------------------

RECEIVER = r"""
import base64, io, pickle, sys
import torch
from torch.multiprocessing import reductions

def rebuild_by_uuid(*args):
    # what SGLang's monkey_patch_torch_reductions does on the server: UUID -> local index
    device = args[6]
    if isinstance(device, str):
        device = next(i for i in range(torch.cuda.device_count())
                      if str(torch.cuda.get_device_properties(i).uuid) == device)
    return reductions.rebuild_cuda_tensor(*args[:6], device, *args[7:])

class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        assert module.startswith(("builtins", "collections", "copyreg", "torch")), module
        if (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
            return rebuild_by_uuid
        return super().find_class(module, name)

entry = sys.stdin.read()
try:
    from sglang.srt.utils import MultiprocessingSerializer
    named = MultiprocessingSerializer.deserialize(entry)
    print("via sglang", file=sys.stderr)
except ImportError:
    named = Unpickler(io.BytesIO(base64.b64decode(entry))).load()
for name, t in named:
    print(name, t.device.type, str(t.dtype), repr(t.double().sum().item()))
"""


@pytest.mark.gpu
def test_cuda_tensors_travel_as_ipc_handles_another_process_can_open():
    named = [
        ("a", torch.randn(256, 64, device="cuda")),
        ("b", torch.randn(64, device="cuda").bfloat16()),
    ]
    entry = serialize_named_tensors(named)
    assert len(entry) < 4096  # handles, not 64 KiB of data
    torch.cuda.synchronize()
    done = subprocess.run(
        [sys.executable, "-c", RECEIVER], input=entry, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = [line.split() for line in done.stdout.splitlines()]
    assert got == [[n, "cuda", str(t.dtype), repr(t.double().sum().item())] for n, t in named]


@pytest.mark.gpu
def test_sync_tensor_sends_cuda_buckets_as_handles():
    async def main() -> tuple[RecordingServer, SyncReport]:
        async with serving() as (fake, client):
            cuda_buckets = [
                [("w", torch.ones(1024, 256, device="cuda"))],
                [("b", torch.ones(8, device="cuda"))],
            ]
            return fake, await sync_tensor(client, iter(cuda_buckets), 1, FAST)

    fake, report = anyio.run(main)
    assert (report.buckets, report.bytes) == (2, 4 * (1024 * 256 + 8))
    assert all(len(u["serialized_named_tensors"][0]) < 4096 for u in fake.updates())


async def test_embedded_engine_serves_the_synced_weights_and_version():
    from rl.engine import EmbeddedEngine, EmbeddedEngineConfig
    from rl.learner.models import tiny_qwen2_config

    hf = tiny_qwen2_config(vocab_size=128, hidden=32, intermediate=64, max_position=256)
    engine = EmbeddedEngine.from_hf_config(hf, EmbeddedEngineConfig(device="cpu"), seed=0)
    learner = EmbeddedEngine.from_hf_config(hf, EmbeddedEngineConfig(device="cpu"), seed=1).model
    items = list(learner.state_dict().items())
    two_buckets = [items[: len(items) // 2], items[len(items) // 2 :]]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    with anyio.fail_after(BOUND_S):
        async with engine.running():
            report = await sync_embedded(engine, iter(two_buckets), 3)
            gen = await engine.generate([5, 6, 7], greedy, session_id="s")
    assert report.tensors == len(items) and gen.weight_version == 3
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, learner.state_dict()[name]), name
