"""SGLangServer managing a real subprocess: the fake launch module, which accepts SGLang's flags."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import anyio
import pytest

from agentcore.engine import SamplingParams
from agentcore.sglang import (
    SGLangClient,
    SGLangClientConfig,
    SGLangServer,
    SGLangServerConfig,
    SGLangServerError,
)

REPO = str(Path(__file__).resolve().parents[1])
BOUND_S = 60  # generous: a hang fails the test instead of the suite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_config(tmp_path: Path, *fake_args: str, **overrides) -> SGLangServerConfig:
    pythonpath = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    settings = dict(
        model_path="fake-model",
        port=free_port(),
        module="tests.fakes.fake_sglang_launch",
        env={"PYTHONPATH": pythonpath},
        log_path=str(tmp_path / "server.log"),
        health_poll_interval_s=0.05,
        health_timeout_s=5.0,
        startup_timeout_s=BOUND_S,
        shutdown_grace_s=5.0,
        extra_args=fake_args,
    )
    settings.update(overrides)
    return SGLangServerConfig(**settings)


def logged_pids(config: SGLangServerConfig, key: str) -> list[int]:
    return [int(p) for p in re.findall(rf"{key}=(\d+)", Path(config.log_path).read_text())]


def alive(pid: int) -> bool:
    """Running and not a zombie (a reaped-by-nobody zombie holds no resources)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_command_carries_sglang_flags():
    config = SGLangServerConfig(
        model_path="M",
        port=31000,
        tp_size=2,
        base_gpu_id=4,
        mem_fraction_static=0.6,
        extra_args=("--dtype", "bfloat16"),
    )
    cmd = SGLangServer(config).command
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for flag in (
        "--model-path M",
        "--port 31000",
        "--tp-size 2",
        "--base-gpu-id 4",
        "--mem-fraction-static 0.6",
        "--enable-memory-saver",
        "--skip-tokenizer-init",
        "--dtype bfloat16",
    ):
        assert flag in joined


def sgl_kernel_at(root: Path, *, fa3: bool) -> str:
    """A folder holding an `sgl_kernel` package as the server would import it (files only)."""
    package = root / "sgl_kernel"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if fa3:
        (package / "flash_ops.abi3.so").write_bytes(b"")
    return str(root)


async def test_the_attention_backend_is_triton_only_where_the_kernels_lack_fa3(tmp_path):
    def flags(**overrides) -> list[str]:
        cmd = SGLangServer(SGLangServerConfig(model_path="M", **overrides)).command
        return cmd[cmd.index("--attention-backend") + 1:][:1] if "--attention-backend" in cmd else []

    stripped = sgl_kernel_at(tmp_path / "stripped", fa3=False)
    full = sgl_kernel_at(tmp_path / "full", fa3=True)
    assert flags(env={"PYTHONPATH": stripped}) == ["triton"]  # the offline build: FA3 stripped
    assert flags(env={"PYTHONPATH": full}) == []  # SGLang's own choice (FA3 on Hopper)
    assert flags(env={"PYTHONPATH": stripped}, attention_backend="") == []
    assert flags(env={"PYTHONPATH": full}, attention_backend="flashinfer") == ["flashinfer"]
    given = SGLangServer(SGLangServerConfig(model_path="M", env={"PYTHONPATH": stripped},
                                            extra_args=("--attention-backend", "flashinfer"))).command
    assert given.count("--attention-backend") == 1 and given[-1] == "flashinfer"


async def test_start_returns_only_once_health_generate_answers(tmp_path):
    config = fake_config(tmp_path, "--fake-startup-delay-s", "0.5")
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config) as server:
            async with SGLangClient(SGLangClientConfig(base_url=server.base_url)) as client:
                assert await client.health_generate()
                gen = await client.generate([1], SamplingParams(max_new_tokens=3), session_id="s")
    assert len(gen.token_ids) == 3


async def test_environment_overrides_reach_the_server(tmp_path):
    config = fake_config(tmp_path, cuda_visible_devices="3,4")
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config):
            pass
    assert "CUDA_VISIBLE_DEVICES=3,4" in Path(config.log_path).read_text()


async def test_early_exit_is_reported_with_the_log_tail(tmp_path):
    config = fake_config(tmp_path, "--fake-exit-after-s", "0.2", "--fake-exit-code", "3")
    with anyio.fail_after(BOUND_S), pytest.raises(SGLangServerError) as info:
        async with SGLangServer(config):
            pass
    assert "exited with code 3" in str(info.value)
    assert "CUDA out of memory" in str(info.value)


async def test_a_port_already_in_use_is_refused(tmp_path):
    config = fake_config(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", config.port))
        squatter.listen()
        with pytest.raises(SGLangServerError, match="in use"):
            await SGLangServer(config).start()


async def test_startup_timeout_raises_and_kills_the_server(tmp_path):
    config = fake_config(tmp_path, "--fake-startup-delay-s", "600", startup_timeout_s=1.0)
    with anyio.fail_after(BOUND_S), pytest.raises(SGLangServerError, match="within 1s"):
        async with SGLangServer(config):
            pass
    assert not any(alive(pid) for pid in logged_pids(config, "FAKE_PID"))


async def test_exit_kills_the_whole_process_group(tmp_path):
    config = fake_config(tmp_path, "--fake-spawn-child")
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config):
            pids = logged_pids(config, "FAKE_PID") + logged_pids(config, "FAKE_CHILD_PID")
            assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids)


async def test_a_group_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    config = fake_config(
        tmp_path, "--fake-spawn-child", "--fake-ignore-sigterm", shutdown_grace_s=0.5
    )
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config):
            pids = logged_pids(config, "FAKE_PID") + logged_pids(config, "FAKE_CHILD_PID")
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


async def test_cancellation_still_stops_the_server(tmp_path):
    config = fake_config(tmp_path, "--fake-spawn-child")
    with anyio.fail_after(BOUND_S):
        with anyio.CancelScope() as scope:
            async with SGLangServer(config):
                scope.cancel()
                await anyio.sleep_forever()
    pids = logged_pids(config, "FAKE_PID") + logged_pids(config, "FAKE_CHILD_PID")
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


async def test_restart_replaces_the_process(tmp_path):
    config = fake_config(tmp_path)
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config) as server:
            first = server.pid
            await server.restart()
            assert server.pid != first and not alive(first)
            async with SGLangClient(SGLangClientConfig(base_url=server.base_url)) as client:
                assert await client.health_generate()
            assert server.statistics().restarts == 1


async def test_supervise_restarts_a_crashed_server(tmp_path):
    marker = str(tmp_path / "crashed-once")
    config = fake_config(tmp_path, "--fake-crash-after-s", "0.3", "--fake-crash-once-file", marker)
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config) as server:
            first = server.pid
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.supervise)
                while server.statistics().restarts == 0 or not server.statistics().running:
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
            stats = server.statistics()
    assert stats.crashes == 1 and stats.restarts == 1 and server.pid is None
    assert first is not None and not alive(first)


async def test_supervise_gives_up_after_max_restarts(tmp_path):
    config = fake_config(tmp_path, "--fake-crash-after-s", "0.2", max_restarts=2)
    with anyio.fail_after(BOUND_S):
        async with SGLangServer(config) as server:
            with pytest.raises(SGLangServerError, match="crashed 3 times") as info:
                await server.supervise()
    assert "fake crash" in str(info.value)
    assert server.statistics().starts == 3
    assert not any(alive(pid) for pid in logged_pids(config, "FAKE_PID"))
