"""`cuda-agent rollout` end to end: a real subprocess, real HTTP to a loopback SGLang fake that
plays a scripted agent, the real sandboxed tools, the trajectory store on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest

from agentcore.chat import ChatRenderer
from agentcore.store import read_trajectories
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import Compile, Finish, ReadFile, Status, Verify, WriteFile
from tests.fakes.sglang_server import FakeSGLangServer

SOURCE = (
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n\n"
    "def get_inputs():\n    return [torch.rand(16)]\n\ndef get_init_inputs():\n    return []\n"
)
SCRIPT = [
    (ReadFile(path="model.py"),),
    (WriteFile(path="kernels/relu.cu", content="// k\n"), WriteFile(path="model_new.py", content="class ModelNew: pass\n")),
    (Compile(),),
    (Verify(),),
    (Finish(),),
]


def scripted_policy(tokenizer_dir: Path):
    """Continuation for a prompt: the script's next turn, by counting assistant turns so far."""
    renderer = ChatRenderer(load_tokenizer(tokenizer_dir), tool_schemas(), "hermes")
    tok = renderer.tokenizer
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assistant = tok.encode("assistant", add_special_tokens=False)
    end = renderer.stop_token_ids[0]

    def policy(input_ids: list[int]) -> list[int]:
        turns = sum(
            1
            for i, t in enumerate(input_ids)
            if t == start and input_ids[i + 1 : i + 1 + len(assistant)] == assistant
        )
        turn = SCRIPT[min(turns - 1, len(SCRIPT) - 1)]
        return tok.encode(renderer.parser.render_turn("ok", turn), add_special_tokens=False) + [end]

    return policy


def write_tasks(path: Path, n: int) -> Path:
    rows = [{"task_id": f"t{i}", "source": SOURCE} for i in range(n)]
    rows.insert(1, {"task_id": "broken", "source": "def nope(:\n"})
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\nnot json\n")
    return path


def command(url: str, tasks: Path, out: Path, tokenizer_dir: Path, samples: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "agentcore.cli", "rollout", "--tasks", str(tasks), "--out", str(out),
        "--engine", "sglang", "--url", url, "--tokenizer", str(tokenizer_dir),
        "--samples", str(samples), "--workers", "4", "--max-turns", "10", "--retry-budget-s", "3",
    ]  # fmt: skip


async def test_rollout_command_stores_every_trajectory_over_http(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 3)
    out = workspace_root / "run"
    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir)) as fake:
        proc = await anyio.run_process(command(fake.url, tasks, out, tiny_tokenizer_dir), check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    trajs = list(read_trajectories(out / "trajectories.jsonl"))
    assert sorted((t.group_id, t.sample_index) for t in trajs) == [(f"t{i}", s) for i in range(3) for s in range(2)]
    assert {t.status for t in trajs} == {Status.COMPLETED}
    assert b"broken" in proc.stderr and b"not a JSON object" not in proc.stderr
    assert orjson.loads((out / "config.json").read_bytes())["samples"] == 2


async def test_rollout_sends_max_new_tokens_and_logprob_requests(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 1)
    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir)) as fake:
        await anyio.run_process(command(fake.url, tasks, workspace_root / "run", tiny_tokenizer_dir, 1))
        requests = fake.generate_requests
    assert requests and all(r["sampling_params"]["max_new_tokens"] > 0 for r in requests)
    assert all(r["return_logprob"] is True for r in requests)


def _sandbox_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


async def test_sigint_stops_cleanly_and_the_rerun_completes_without_duplicates(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 6)
    out = workspace_root / "run"
    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir), latency_s=0.3) as fake:
        proc = await anyio.open_process(command(fake.url, tasks, out, tiny_tokenizer_dir), stderr=subprocess.PIPE)
        store = out / "trajectories.jsonl"
        with anyio.fail_after(60):
            while not (store.exists() and store.stat().st_size > 0):
                await anyio.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            await proc.wait()
        await proc.aclose()
        assert _sandbox_processes(str(out)) == []
        first = [(t.group_id, t.sample_index) for t in read_trajectories(store, strict=True)]
        assert 0 < len(first) < 12
        rerun = await anyio.run_process(command(fake.url, tasks, out, tiny_tokenizer_dir), check=False)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    keys = [(t.group_id, t.sample_index) for t in read_trajectories(store, strict=True)]
    assert sorted(keys) == [(f"t{i}", s) for i in range(6) for s in range(2)]


async def test_dead_model_server_gives_engine_errors_not_a_crash(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 1)
    env = dict(os.environ)
    proc = await anyio.run_process(
        command("http://127.0.0.1:9", tasks, workspace_root / "run", tiny_tokenizer_dir, 1), check=False, env=env
    )
    trajs = list(read_trajectories(workspace_root / "run" / "trajectories.jsonl"))
    assert [t.status for t in trajs] == [Status.ENGINE_ERROR]
    assert "127.0.0.1:9" in trajs[0].error
    assert proc.returncode == 0


def test_help_lists_rollout():
    out = subprocess.run([sys.executable, "-m", "agentcore.cli", "--help"], capture_output=True, text=True)
    assert "rollout" in out.stdout


def test_missing_task_file_is_a_clear_error(tmp_path, tiny_tokenizer_dir):
    proc = subprocess.run(
        command("http://127.0.0.1:9", tmp_path / "nope.jsonl", tmp_path / "run", tiny_tokenizer_dir),
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "task file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
