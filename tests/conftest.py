"""Shared test setup: the `gpu` marker skips cleanly on machines without CUDA, the `sglang`
marker without a CUDA GPU or an SGLang install; `sglang_backend` runs a contract test against
the fake SGLang server and, under the marker, a real one (tests/sglang_backends.py)."""

from __future__ import annotations

import functools
import os
from contextlib import ExitStack

import pytest
from anyio.from_thread import start_blocking_portal

from tests.sglang_backends import (
    REAL,
    FakeBackend,
    RealBackend,
    RealServers,
    log_dir,
    sglang_missing,
    write_checkpoints,
)


@functools.cache
def cuda_available() -> bool:
    if not os.path.exists("/dev/nvidiactl"):  # no driver: skip without paying for `import torch`
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    real_sglang = [item for item in items if item.get_closest_marker("sglang")]
    if real_sglang:
        reason = sglang_missing(cuda_available())
        for item in real_sglang if reason else ():
            item.add_marker(pytest.mark.skip(reason=reason))
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sglang_checkpoints(tiny_tokenizer_dir, tmp_path_factory):
    """Checkpoints A and B of one random-init Qwen2, exported as the learner does, once per session."""
    return write_checkpoints(tmp_path_factory.mktemp("sglang_ckpt"), tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def real_sglang(sglang_checkpoints, tmp_path_factory):
    """The session's real SGLang servers, each started on first use through the project's launcher."""
    logs = log_dir(tmp_path_factory.mktemp("sglang_logs"))
    with start_blocking_portal() as portal, ExitStack() as stack:
        yield RealServers(portal, stack, sglang_checkpoints, logs)


@pytest.fixture(params=["fake", REAL])
def sglang_backend(request, sglang_checkpoints):
    """The SGLang server of a contract test: the fake, and under the `sglang` marker a real one."""
    if request.param == "fake":
        return FakeBackend(sglang_checkpoints)
    servers = request.getfixturevalue("real_sglang")
    servers.url(0)  # the first test's setup, not its body, waits for the start-up (minutes)
    return RealBackend(servers)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """The locally built tiny tokenizer (no downloads), once per test session."""
    from agentcore.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tiny_hf_dir(tiny_tokenizer_dir, tmp_path_factory):
    """A random 2-layer Qwen2 saved as a Hugging Face directory with the tiny tokenizer beside it."""
    import shutil
    from pathlib import Path

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentcore.tiny_tokenizer import load_tokenizer

    out = tmp_path_factory.mktemp("hf")
    config = Qwen2Config(vocab_size=len(load_tokenizer(tiny_tokenizer_dir)), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=16384)
    Qwen2ForCausalLM(config).save_pretrained(out)
    for f in Path(tiny_tokenizer_dir).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def renderer(tiny_tokenizer_dir):
    from agentcore.chat import ChatRenderer
    from agentcore.tiny_tokenizer import load_tokenizer
    from agentcore.toolparse import tool_schemas

    return ChatRenderer(load_tokenizer(tiny_tokenizer_dir), tool_schemas(), "hermes")


@pytest.fixture
def workspace_root():
    """A directory the sandbox's unprivileged uid can traverse (pytest's tmp_path is mode 700)."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="cuda-agent-ws-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """A verification child process (rewards.verify.verifier.CandidateProcess), shared by the
    tests of one module that verify candidates on the CPU."""
    from rewards.verify.verifier import CandidateProcess

    process = CandidateProcess(tmp_path_factory.mktemp("child"))
    process.start()
    yield process
    process.close()
