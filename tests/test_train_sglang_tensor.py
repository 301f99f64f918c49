"""`cuda-agent train` with `weight_sync.mode=sglang_tensor`: after each update the learner rank
sends its SGLang server the actor as bf16 buckets through `/update_weights_from_tensor`, in the
slime/verl order (pause, flush, buckets, flush, continue), the weight version on the last bucket.

The learner rank runs on CPU, so the tensors travel by value (no CUDA IPC); the fake SGLang
server on loopback decodes every payload as SGLang's restricted unpickler would and checks the
names, shapes and dtypes against the model. A failing server stops the run with an error naming
it, and `--resume` (a second `run_training` on the same run directory) loses nothing. Strictly
on-policy the server is colocated, so each update runs release (pause, flush, free weights, KV
cache and CUDA graphs) -> train -> weights back -> buckets -> KV cache back -> continue; the fake
refuses a tensor update into freed weights and records any generation while memory is freed,
and a failed release or sync leaves the server whole for `--resume`. The CUDA
IPC path is the same run with the learner rank on the GPU (the `gpu` test at the end): this
test process then opens the rank's handles, by GPU UUID as SGLang does."""

from __future__ import annotations

import base64
import io
import pickle
import types
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import torch

from agentcore.sglang import SGLangClient, SGLangClientConfig
from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from rl.config import apply_overrides
from rl.learner.models import build_actor, hf_model
from rl.recipes import smoke_cpu
from rl.train import run_training
from rl.weight_sync import WeightSyncConfig, WeightSyncError, sync_tensor
from tests.fakes.sglang_server import FakeSGLangServer

BOUND_S = 300


class SGLangUnpickler(pickle.Unpickler):
    """SGLang's side of the wire: its restricted unpickler (torch and builtins globals only) and
    its `monkey_patch_torch_reductions`, under which a CUDA IPC payload names the GPU by UUID."""

    def find_class(self, module: str, name: str) -> Any:
        if not module.split(".")[0] in ("builtins", "collections", "copyreg", "functools", "torch"):
            raise pickle.UnpicklingError(f"blocked {module}.{name}")
        if (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
            return _rebuild_cuda_by_uuid
        return super().find_class(module, name)


def _rebuild_cuda_by_uuid(*args: Any) -> torch.Tensor:
    from torch.multiprocessing import reductions

    device = args[6]
    if isinstance(device, str):
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
        device = uuids.index(device)
    return reductions.rebuild_cuda_tensor(*args[:6], device, *args[7:])


def decode(entry: str) -> list[tuple[str, torch.Tensor]]:
    return SGLangUnpickler(io.BytesIO(base64.b64decode(entry, validate=True))).load()


class TensorServer(FakeSGLangServer):
    """The fake, plus a model's worth of checking on `/update_weights_from_tensor`: each payload
    is decoded; the bucket carrying `weight_version` closes a publication, which must have held
    exactly the `expected` names with their shapes and dtypes (else HTTP 400, as SGLang answers
    a failed load). `fail_from` makes every tensor update from that publication on answer 500,
    `fail_release_from` every memory release from that one on (counting from 0).
    Memory calls are recorded with their tags; an update into freed weights answers 400 and a
    generation request while memory is freed is recorded in `violations`."""

    def __init__(self, expected: dict[str, tuple[tuple[int, ...], torch.dtype]], **kw: Any) -> None:
        super().__init__(**kw)
        self.expected = expected
        self.pending: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.checksum = 0.0
        self.devices: set[str] = set()
        self.published: list[tuple[str, int, float]] = []  # (version, buckets, checksum)
        self.buckets = 0
        self.calls: list[str] = []
        self.fail_from: int | None = None
        self.fail_release_from: int | None = None
        self.releases = 0
        self.violations: list[str] = []

    async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if path in ("/release_memory_occupation", "/resume_memory_occupation"):
            return await self._memory(path, orjson.loads(body))
        self.calls.append(path)
        if path == "/generate" and self.released_tags:
            self.violations.append(f"generate with {sorted(self.released_tags)} released")
        if path != "/update_weights_from_tensor":
            return await super()._dispatch(method, path, body)
        if "weights" in self.released_tags:
            return 400, {"success": False, "message": "weights are released"}
        if self.fail_from is not None and len(self.published) >= self.fail_from:
            return 500, {"error": {"message": "CUDA error: out of memory (injected)"}}
        data = orjson.loads(body)
        problem = self._load(data)
        if problem:
            return 400, {"success": False, "message": problem}
        return await super()._dispatch(method, path, body)

    async def _memory(self, path: str, data: dict[str, Any]) -> tuple[int, Any]:
        self.calls.append(f"{path} {','.join(sorted(data.get('tags') or ['all']))}")
        if path == "/release_memory_occupation":
            self.releases += 1
            if self.fail_release_from is not None and self.releases > self.fail_release_from:
                return 500, {"error": {"message": "release failed (injected)"}}
        return await super()._dispatch("POST", path, orjson.dumps(data))

    def _load(self, data: dict[str, Any]) -> str | None:
        entries = data["serialized_named_tensors"]
        if len(entries) != self.tp_size:
            return f"expected one payload per TP rank, got {len(entries)}"
        decoded = [decode(entry) for entry in entries]  # each TP rank opens its own pickle
        if len({tuple((name, tuple(t.shape)) for name, t in d) for d in decoded}) != 1:
            return "the TP ranks' payloads name different tensors"
        for name, tensor in decoded[0]:  # a CUDA tensor is read now, as SGLang copies it
            self.pending[name] = (tuple(tensor.shape), tensor.dtype)
            self.checksum += tensor.double().sum().item()
            self.devices.add(tensor.device.type)
        self.buckets += 1
        if data.get("weight_version") is None:
            return None
        if self.pending != self.expected:
            return f"weights do not match the model: {sorted(set(self.pending) ^ set(self.expected))}"
        self.published.append((data["weight_version"], self.buckets, self.checksum))
        self.pending, self.buckets, self.checksum = {}, 0, 0.0
        return None


def tiny_reply(tmp_path: Path) -> list[int]:
    tok = load_tokenizer(build_tiny_tokenizer(tmp_path / "tok"))
    return tok.encode("I will think about it.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def config(tmp_path: Path, url: str, *extra: str):
    return apply_overrides(smoke_cpu(), [
        f"run_dir={tmp_path / 'run'}", "stage=ppo", "steps.ppo=2", "checkpoint.export_hf=false",
        "checkpoint.every_steps=1", "engine.kind=sglang", f'engine.urls=["{url}"]',
        "weight_sync.mode=sglang_tensor", "weight_sync.bucket_bytes=65536", "weight_sync.server_retry_s=2",
        *extra,
    ])  # fmt: skip


def model_tensors(cfg) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """What an SGLang server of this model loads: every HF name, its shape, in bf16."""
    state = hf_model(build_actor(cfg.model, "cpu")).state_dict()
    return {name: (tuple(t.shape), torch.bfloat16) for name, t in state.items()}


def publication_order(calls: list[str]) -> list[str]:
    out: list[str] = []
    for path in calls:
        if path not in ("/generate", "/server_info", "/get_server_info") and (not out or out[-1] != path):
            out.append(path)
    return out


RELEASED_UPDATE = [  # one update with the colocated server's memory released for training
    "/pause_generation", "/flush_cache", "/release_memory_occupation cuda_graph,kv_cache,weights",
    "/pause_generation", "/resume_memory_occupation weights", "/flush_cache", "/update_weights_from_tensor",
    "/flush_cache", "/resume_memory_occupation cuda_graph,kv_cache", "/continue_generation", "/get_weight_version",
]  # fmt: skip


def trajectories(run_dir: Path, tag: str) -> list[dict]:
    return [orjson.loads(line) for line in (run_dir / "rollouts" / f"{tag}.jsonl").read_bytes().splitlines()]


async def test_each_update_reaches_the_server_as_bf16_buckets_of_the_whole_model(tmp_path):
    fake, rows = await train_against_tensor_server(tmp_path)
    assert fake.devices == {"cpu"}  # by value: a CPU learner has no IPC handles
    check_publications(tmp_path, fake, rows)


async def train_against_tensor_server(tmp_path: Path, *extra: str) -> tuple[TensorServer, list[dict]]:
    reply = tiny_reply(tmp_path)
    expected = model_tensors(config(tmp_path, "http://x"))
    async with TensorServer(expected, policy=lambda ids: reply) as fake:
        with anyio.fail_after(BOUND_S):
            rows = await run_training(config(tmp_path, fake.url, *extra))
    return fake, rows


def check_publications(tmp_path: Path, fake: TensorServer, rows: list[dict]) -> None:
    expected = fake.expected
    assert [r["stage"] for r in rows] == ["ppo", "ppo"]
    versions = [v for v, _, _ in fake.published]
    assert versions == ["0", "1", "2"]  # the initial sync, then one per update
    assert all(buckets > 1 for _, buckets, _ in fake.published)
    assert fake.published[0][2] != fake.published[2][2]  # the updates moved the weights
    assert fake.weight_version == "2"
    one = ["/pause_generation", "/flush_cache", "/update_weights_from_tensor", "/flush_cache",
           "/continue_generation", "/get_weight_version"]  # fmt: skip
    assert publication_order(fake.calls) == one + RELEASED_UPDATE * 2  # initial sync: nothing freed
    assert fake.released_tags == set() and fake.violations == []
    assert all(r["time/release_s"] >= 0.0 and r["time/resume_s"] >= 0.0 for r in rows)
    assert {t["weight_version_min"] for t in trajectories(tmp_path / "run", "ppo_000001")} == {1}
    assert not (tmp_path / "run" / "weights").exists()  # nothing went through the disk
    assert rows[-1]["sync/weight_sync_bytes"] == sum(
        torch.Size(shape).numel() * 2 for shape, _ in expected.values()
    )


async def test_a_failing_server_stops_the_run_clearly_and_resume_loses_nothing(tmp_path):
    reply = tiny_reply(tmp_path)
    cfg = config(tmp_path, "http://x")
    async with TensorServer(model_tensors(cfg), policy=lambda ids: reply) as fake:
        cfg = config(tmp_path, fake.url)
        fake.fail_from = 2  # versions 0 and 1 land; the publication after step 1's update fails
        with anyio.fail_after(BOUND_S), pytest.raises(BaseException) as failed:
            await run_training(cfg)
        message = _leaf_message(failed.value)
        assert "weight sync of version 2" in message and fake.url in message and "500" in message
        assert "--resume" in message
        assert fake.calls[-2:] == ["/resume_memory_occupation cuda_graph,kv_cache,weights", "/continue_generation"]
        assert fake.released_tags == set()  # the server was left whole and not paused
        generated = len(fake.generate_requests)

        fake.fail_from = None
        with anyio.fail_after(BOUND_S):
            rows = await run_training(cfg)
        assert len(fake.generate_requests) == generated  # step 1 reused its stored trajectories
    assert [r["step"] for r in rows] == [1]
    steps = [orjson.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    assert steps == [0, 1]  # each step recorded once
    assert [v for v, _, _ in fake.published] == ["0", "1", "1", "2"]  # resume republishes the checkpoint


async def test_a_failed_release_names_rank_and_server_and_resume_loses_nothing(tmp_path):
    reply = tiny_reply(tmp_path)
    cfg = config(tmp_path, "http://x")
    async with TensorServer(model_tensors(cfg), policy=lambda ids: reply) as fake:
        cfg = config(tmp_path, fake.url)
        fake.fail_release_from = 1  # step 0 trains; the release before step 1's update fails
        with anyio.fail_after(BOUND_S), pytest.raises(BaseException) as failed:
            await run_training(cfg)
        message = _leaf_message(failed.value)
        assert "releasing the engines' memory before training failed" in message and "--resume" in message
        assert f"learner rank 0, SGLang server {fake.url}" in message and "injected" in message
        assert fake.released_tags == set() and fake.calls[-1] == "/continue_generation"
        generated = len(fake.generate_requests)

        fake.fail_release_from = None
        with anyio.fail_after(BOUND_S):
            rows = await run_training(cfg)
        assert len(fake.generate_requests) == generated  # step 1 reused its stored trajectories
        assert fake.released_tags == set() and fake.violations == []
    assert [r["step"] for r in rows] == [1]
    assert [v for v, _, _ in fake.published] == ["0", "1", "1", "2"]


def test_a_value_step_keeps_the_server_weights_and_resumes_the_rest():
    """No weight sync follows a value step, so the server keeps its weights (SGLang drops freed
    weights), and the driver's resume brings back the KV cache and continues generation."""
    from rl.learner.protocol import Empty, ReleaseRequest
    from rl.learner.rank import Rank

    class Server:
        base_url = "http://fake"

        def __init__(self) -> None:
            self.calls: list[tuple[str, Any]] = []

        def __getattr__(self, name: str):
            async def call(*args: Any) -> bool:
                self.calls.append((name, *args))
                return True
            return call

    cpu = types.SimpleNamespace(device=torch.device("cpu"))  # a rank's Dist: only its device is read here
    rank = Rank(config(Path("/nonexistent"), "http://fake"), Path("/nonexistent"), cpu, None, None)
    rank.server = server = Server()

    async def steps() -> None:
        await rank.release(ReleaseRequest(weights=False))
        await rank.resume(Empty())
        await rank.resume(Empty())  # nothing left to restore: no call

    anyio.run(steps)
    assert server.calls == [("pause_generation", "abort"), ("flush_cache",),
                            ("release_memory_occupation", ["kv_cache", "cuda_graph"]),
                            ("resume_memory_occupation", ["cuda_graph", "kv_cache"]), ("continue_generation",)]


def _leaf_message(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return str(exc)


async def test_a_dead_server_is_named_and_its_failed_continue_does_not_hide_why(tmp_path):
    bucket = [("model.norm.weight", torch.ones(4, dtype=torch.bfloat16))]
    async with FakeSGLangServer() as fake:
        url = fake.url
        await fake.die()
        client_cfg = SGLangClientConfig(base_url=url, retry_budget_s=0.5, backoff_base_s=0.05)
        async with SGLangClient(client_cfg) as client:
            with anyio.fail_after(60), pytest.raises(WeightSyncError) as failed:
                await sync_tensor(client, [bucket], 3, WeightSyncConfig(cleanup_timeout_s=5.0))
    message = str(failed.value)
    assert f"weight sync of version 3 to {url}" in message and "/pause_generation" in message


async def test_without_urls_the_run_starts_a_server_per_learner_gpu_and_stops_it(tmp_path):
    """The issue's command line: engine.kind=sglang and weight_sync.mode=sglang_tensor, no urls.
    The fake launcher stands in for `python -m sglang.launch_server` (a real subprocess)."""
    repo = str(Path(__file__).resolve().parents[1])
    cfg = apply_overrides(smoke_cpu(), [
        f"run_dir={tmp_path / 'run'}", "stage=ppo", "steps.ppo=1", "checkpoint.export_hf=false",
        "engine.kind=sglang", "weight_sync.mode=sglang_tensor", "engine.sglang.module=tests.fakes.fake_sglang_launch",
        f"engine.sglang.pythonpath={repo}", "engine.sglang.startup_timeout_s=60",
    ])  # fmt: skip
    with anyio.fail_after(BOUND_S):
        rows = await run_training(cfg)
    assert [r["stage"] for r in rows] == ["ppo"]
    saved = orjson.loads((tmp_path / "run" / "config.json").read_bytes())
    (url,) = saved["engine"]["urls"]  # the ranks found their server here
    log = (tmp_path / "run" / "sglang" / "server_gpu0.log").read_text()
    assert "'--load-format', 'dummy'" in log and "'--dtype', 'bfloat16'" in log, log[-2000:]
    assert (tmp_path / "run" / "sglang" / "model" / "config.json").is_file()  # random init: the config alone
    async with SGLangClient(SGLangClientConfig(base_url=url, max_retries=0)) as client:
        assert not await client.health_generate()  # stopped with the run


def test_tensor_sync_needs_exactly_one_colocated_server_per_learner_rank():
    from rl.run import _check_weight_sync

    two = 'engine.urls=["http://127.0.0.1:1", "http://127.0.0.1:2"]'
    cfg = apply_overrides(smoke_cpu(), ["engine.kind=sglang", two, "weight_sync.mode=sglang_tensor"])
    with pytest.raises(SystemExit, match="1 learner rank.* engine.urls has 2; use weight_sync.mode=sglang_disk"):
        _check_weight_sync(cfg)
    with pytest.raises(SystemExit, match="needs engine.kind=sglang"):
        _check_weight_sync(apply_overrides(smoke_cpu(), ["weight_sync.mode=sglang_tensor"]))


# -- CUDA IPC from a learner rank (GPU) --------------------------------------------------------


@pytest.mark.gpu
async def test_a_gpu_learner_rank_sends_cuda_ipc_handles_the_server_opens(tmp_path):
    """The same run with the learner rank (FSDP2, bf16 gather) on the GPU: every bucket reaches
    this process as CUDA IPC handles, which it opens by GPU UUID and reads before answering."""
    fake, rows = await train_against_tensor_server(
        tmp_path, "layout.cpu=false", "layout.learner_gpus=[0]", "layout.verify_gpus=[]"
    )
    assert fake.devices == {"cuda"}, publication_order(fake.calls)
    check_publications(tmp_path, fake, rows)
