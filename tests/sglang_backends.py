"""The SGLang servers the contract tests run against: the fake on loopback, or a real server.

What it is: two backends with one interface, handed to a test by the `sglang_backend` fixture
(tests/conftest.py) once per kind. `fake` is `tests.fakes.sglang_server`, always; `real` is
`python -m sglang.launch_server` started through `agentcore.sglang.SGLangServer` once per session
(GPU 0; a second on GPU 1 for the router), under the `sglang` marker. A contract test enters
`backend.serving()` for a client and checks only what SGLang's HTTP API shows, so one body holds
for both; tests that script faults or read what the fake received stay with the fake.
The real server serves a random-init Qwen2 written by the learner's export (`write_checkpoints`:
A, which it starts with, and B, another seed) with the flags of `SERVER_ARGS`, which the offline
build supports. Environment: CUDA_AGENT_SGLANG_PYTHONPATH, where sglang is installed (set by
bench/device/sglang_install.sh; on the server's PYTHONPATH only, so its transformers stays out of
the tests), CUDA_AGENT_SGLANG_ARGS (launch_server flags instead of SERVER_ARGS) and
CUDA_AGENT_SGLANG_LOG_DIR (server logs). What it is not: the launcher's own tests (those run the
fake launch module, tests/test_sglang_launcher.py).

    async with backend.serving() as client:
        gen = await client.generate(PROMPT, SamplingParams(max_new_tokens=16), session_id="s")
"""

from __future__ import annotations

import importlib.machinery
import os
import shlex
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import pytest
from anyio.from_thread import BlockingPortal

from agentcore.engine import SamplingParams
from agentcore.sglang import (
    Router,
    RouterConfig,
    SGLangClient,
    SGLangClientConfig,
    SGLangServer,
    SGLangServerConfig,
)
from tests.fakes.sglang_server import FakeSGLangServer

REPO = str(Path(__file__).resolve().parents[1])
PYTHONPATH_ENV = "CUDA_AGENT_SGLANG_PYTHONPATH"
ARGS_ENV = "CUDA_AGENT_SGLANG_ARGS"
LOG_DIR_ENV = "CUDA_AGENT_SGLANG_LOG_DIR"
SERVER_ARGS = (
    "--attention-backend", "triton",  # the offline build has no FA3, SGLang's default on Hopper
    "--enable-deterministic-inference",  # else sglang ignores sampling_seed (srt/sampling/sampling_batch_info.py)
    "--sampling-backend", "pytorch",  # the one that honours sampling_seed; no flashinfer JIT at start-up
    "--grammar-backend", "none",
    "--dtype", "bfloat16",
    "--cuda-graph-max-bs-decode", "8",  # fewer graphs to capture: the tests run one or two requests
    "--disable-prefill-cuda-graph",  # capturing 0.5.17's 58 prefill graphs took 41 s of a 100 s start (H100)
)  # fmt: skip
BOUND_S = 120  # one generation or control call; a hang fails the test instead of the suite
FAKE_TOKEN_LATENCY_S = 0.002
REAL = pytest.param("real", marks=pytest.mark.sglang, id="real")
REAL_ONLY = pytest.mark.parametrize("sglang_backend", [REAL], indirect=True)
"""For a test whose property only a real server has (freed GPU memory)."""


class Checkpoints(NamedTuple):
    """Two Hugging Face directories of one architecture with different weights."""

    a: str
    b: str


def server_pythonpath() -> list[str]:
    return [p for p in os.environ.get(PYTHONPATH_ENV, "").split(os.pathsep) if p]


def sglang_missing(cuda: bool) -> str | None:
    """Why no real SGLang server can run here (one line), or None when one can."""
    missing = [] if cuda else ["a CUDA GPU"]
    if importlib.machinery.PathFinder.find_spec("sglang", [*server_pythonpath(), *sys.path]) is None:
        where = os.environ.get(PYTHONPATH_ENV, "")
        missing.append(f"the sglang package (none on {PYTHONPATH_ENV}={where!r} or sys.path)")
    if not missing:
        return None
    return "needs " + " and ".join(missing) + "; bench/device/sglang_tests.sh provides both"


def write_checkpoints(out: Path, tokenizer_dir: str | os.PathLike[str]) -> Checkpoints:
    """Two random-init Qwen2 checkpoints (seeds 0 and 1), written as the learner exports its actor."""
    from agentcore.tiny_tokenizer import load_tokenizer
    from rl.learner.hf_export import export_hf
    from rl.learner.models import ModelConfig, build_actor, tiny_qwen2_config

    # head_dim 64 (256 / 4 heads): a size every attention backend has kernels for.
    hf = tiny_qwen2_config(len(load_tokenizer(tokenizer_dir)), hidden=256, intermediate=512, max_position=4096)
    paths = []
    for name, seed in (("a", 0), ("b", 1)):
        actor = build_actor(ModelConfig(hf_config=hf, seed=seed, attn_implementation="sdpa"), "cpu")
        paths.append(str(export_hf(actor, tokenizer_dir, out / name)))
    return Checkpoints(*paths)


def weight_buckets(path: str, device: str, bucket_bytes: int = 1 << 20) -> list[list[tuple[str, Any]]]:
    """A checkpoint's weights as a learner rank sends them: bf16 buckets on `device`, HF names."""
    import torch

    from rl.learner.fsdp import full_state_items
    from rl.learner.models import ModelConfig, build_actor

    actor = build_actor(ModelConfig(path=path, attn_implementation="sdpa"), device)
    return list(full_state_items(actor, bucket_bytes, dtype=torch.bfloat16))


async def greedy(client: SGLangClient, n: int = 16) -> list[int]:
    """Greedy tokens for a fixed prompt from an empty cache: the same weights give the same ones."""
    await wait_idle_flush(client)
    gen = await client.generate([11, 12, 13], SamplingParams(max_new_tokens=n, temperature=0.0), session_id="g")
    return gen.token_ids


async def wait_idle_flush(client: SGLangClient) -> None:
    """Flush the cache, retrying while the server still finishes requests (aborted ones included)."""
    with anyio.fail_after(BOUND_S):
        while not await client.flush_cache():
            await anyio.sleep(0.01)


async def wait_running(client: SGLangClient) -> None:
    """Return once a generation runs on the server, as its API shows it: a flush is refused."""
    with anyio.fail_after(BOUND_S):
        while await client.flush_cache():
            await anyio.sleep(0.005)


def _client_config(url: str, **kw: Any) -> SGLangClientConfig:
    kw.setdefault("backoff_base_s", 0.01)
    return SGLangClientConfig(base_url=url, **kw)


class FakeBackend:
    """A fresh fake SGLang server per `serving()`; it generates its token chain, not a model's."""

    name = "fake"
    is_model = False
    """Whether tokens come from a model, so that other weights or another seed change them."""
    device = "cpu"
    """Where a test puts the tensors it sends (CPU: by value, the fake only decodes them)."""
    long_budget = 400
    """max_new_tokens of a generation that runs long enough (> 0.8 s) to be caught running."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        self.checkpoints = checkpoints

    @asynccontextmanager
    async def serving(self, **client_kw: Any) -> AsyncIterator[SGLangClient]:
        async with FakeSGLangServer(token_latency_s=FAKE_TOKEN_LATENCY_S) as fake:
            async with SGLangClient(_client_config(fake.url, **client_kw)) as client:
                yield client

    @asynccontextmanager
    async def cluster(self, config: RouterConfig, **client_kw: Any) -> AsyncIterator[tuple[list[SGLangClient], Router]]:
        async with AsyncExitStack() as stack:
            fakes = [await stack.enter_async_context(FakeSGLangServer()) for _ in range(2)]
            clients = [await stack.enter_async_context(SGLangClient(_client_config(f.url, **client_kw))) for f in fakes]
            yield clients, Router(clients, config)


class RealBackend:
    """The session's real SGLang servers; each `serving()` leaves generation continued."""

    name = "real"
    is_model = True
    device = "cuda"  # the server's GPU: tensors travel as CUDA IPC handles
    long_budget = 1500

    def __init__(self, servers: RealServers) -> None:
        self.servers = servers
        self.checkpoints = servers.checkpoints

    @asynccontextmanager
    async def serving(self, **client_kw: Any) -> AsyncIterator[SGLangClient]:
        async with SGLangClient(_client_config(self.servers.url(0), **client_kw)) as client:
            try:
                yield client
            finally:  # a test that failed while paused must not hold up the next one
                with anyio.CancelScope(shield=True), anyio.move_on_after(BOUND_S):
                    await client.continue_generation()

    @asynccontextmanager
    async def cluster(self, config: RouterConfig, **client_kw: Any) -> AsyncIterator[tuple[list[SGLangClient], Router]]:
        import torch

        if torch.cuda.device_count() < 2:
            pytest.skip("needs 2 CUDA GPUs: one SGLang server on each")
        async with AsyncExitStack() as stack:
            urls = [self.servers.url(gpu) for gpu in range(2)]
            clients = [await stack.enter_async_context(SGLangClient(_client_config(u, **client_kw))) for u in urls]
            yield clients, Router(clients, config)


class RealServers:
    """SGLang servers started through the launcher, one per GPU on first use, stopped with the
    session. The launcher's process runs in `portal`'s event loop (a thread), so that it
    outlives each test's own loop.

    Example:
        with start_blocking_portal() as portal, ExitStack() as stack:
            servers = RealServers(portal, stack, checkpoints, log_dir)
            url = servers.url(0)          # starts the server on GPU 0 (minutes)
    """

    def __init__(self, portal: BlockingPortal, stack: ExitStack, checkpoints: Checkpoints, log_dir: Path) -> None:
        self.portal, self.stack, self.checkpoints, self.log_dir = portal, stack, checkpoints, log_dir
        self.servers: list[SGLangServer] = []
        self.failure: str | None = None

    def url(self, gpu: int) -> str:
        while len(self.servers) <= gpu:
            self._start(len(self.servers))
        return self.servers[gpu].base_url

    def _start(self, gpu: int) -> None:
        if self.failure is not None:  # one failed start-up costs minutes: do not repeat it per test
            pytest.fail(self.failure, pytrace=False)
        server = SGLangServer(server_config(self.checkpoints.a, gpu, self.log_dir))
        try:
            self.stack.enter_context(self.portal.wrap_async_context_manager(server))
        except Exception as exc:
            self.failure = f"SGLang on GPU {gpu} did not start: {exc}"
            raise
        self.servers.append(server)


def server_config(model_path: str, gpu: int, log_dir: Path) -> SGLangServerConfig:
    """One test server: GPU `gpu`, a free port, sglang from CUDA_AGENT_SGLANG_PYTHONPATH."""
    extra = shlex.split(os.environ[ARGS_ENV]) if ARGS_ENV in os.environ else list(SERVER_ARGS)
    return SGLangServerConfig(
        model_path=model_path,
        port=free_port(),
        base_gpu_id=gpu,
        mem_fraction_static=0.3,  # leaves room for the test process's CUDA context and tensors
        extra_args=tuple(extra),
        # REPO: agentcore.lifeline wraps the server; no hub: the weights are local, the machine offline
        env={"PYTHONPATH": os.pathsep.join([*server_pythonpath(), REPO]), "HF_HUB_OFFLINE": "1"},
        log_path=str(log_dir / f"sglang_gpu{gpu}.log"),
        startup_timeout_s=600.0,
        health_poll_interval_s=1.0,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_dir(default: Path) -> Path:
    path = Path(os.environ.get(LOG_DIR_ENV) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path
