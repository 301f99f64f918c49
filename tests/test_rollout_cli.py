"""`cuda-agent rollout` end to end: a real subprocess, real HTTP to a loopback SGLang fake that
plays a scripted agent, the real sandboxed tools, the trajectory store on disk."""

from __future__ import annotations

import importlib.metadata
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import anyio
import msgspec
import orjson
import pytest

from agentcore import cli
from agentcore.chat import ChatRenderer
from agentcore.engine import EngineError, SamplingParams
from agentcore.rollout_cmd import parse_args
from agentcore.sglang import SGLangClient
from agentcore.sglang import client as client_module
from agentcore.store import read_trajectories, redone_path
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import (
    INFRA_FAILURES,
    Compile,
    Finish,
    ReadFile,
    Status,
    Verify,
    WriteFile,
)
from tests.fakes.sglang_server import FakeSGLangServer

DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens there

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


def stderr_lines(proc) -> list[str]:
    """stderr without the log records (`time LEVEL name: message`) and progress lines."""
    text = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
    return [line for line in text.splitlines()
            if line.strip() and not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line) and not line.startswith("[")]


async def test_dead_model_server_is_a_one_line_error_with_its_cause(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 3)
    proc = await anyio.run_process(command(DEAD_URL, tasks, workspace_root / "run", tiny_tokenizer_dir, 1), check=False)
    assert proc.returncode == 1
    [line] = [x for x in stderr_lines(proc) if "waiting for the model server" not in x]
    assert line.startswith("cuda-agent rollout: cannot reach the model server: ")
    assert "127.0.0.1:9" in line and "ConnectError" in line
    assert list(read_trajectories(workspace_root / "run" / "trajectories.jsonl")) == []


async def test_every_trajectory_failing_on_the_engine_exits_1_with_the_cause(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 2)
    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir)) as fake:
        fake.reject_next(100)  # every /generate answers 400, the reachability probe's included
        proc = await anyio.run_process(command(fake.url, tasks, workspace_root / "run", tiny_tokenizer_dir),
                                       check=False)
    assert proc.returncode == 1
    [line] = stderr_lines(proc)
    says = "all 4 trajectories ended in an infrastructure failure (engine_error 4): "
    assert line.startswith(f"cuda-agent rollout: {says}")
    assert "refused the request" in line and line.endswith("the same command reruns them")


async def test_rerun_redoes_infrastructure_failures_and_keeps_the_model_s_endings(tiny_tokenizer_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 3)
    out = workspace_root / "run"
    store = out / "trajectories.jsonl"
    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir)) as fake:
        fake.reject_next(1 + 2)  # the probe, then two requests: two trajectories end in engine_error
        first = await anyio.run_process(command(fake.url, tasks, out, tiny_tokenizer_dir), check=False)
        kept = {(t.group_id, t.sample_index): t.trajectory_id for t in read_trajectories(store)
                if t.status not in INFRA_FAILURES}
        rerun = await anyio.run_process(command(fake.url, tasks, out, tiny_tokenizer_dir), check=False)
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert "2 of 6 trajectories ended in an infrastructure failure (engine_error 2)" in first.stderr.decode()
    assert len(kept) == 4
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    final = list(read_trajectories(store, strict=True))
    assert sorted((t.group_id, t.sample_index) for t in final) == [(f"t{i}", s) for i in range(3) for s in range(2)]
    assert {t.status for t in final} == {Status.COMPLETED}
    assert {k: t.trajectory_id for t in final if (k := (t.group_id, t.sample_index)) in kept} == kept
    assert [t.status for t in read_trajectories(redone_path(store))] == [Status.ENGINE_ERROR] * 2


class _Clock:
    """Virtual time for the client's retry loop: its backoff sleeps advance the clock at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await anyio.lowlevel.checkpoint()


async def test_retry_budget_alone_decides_when_a_dead_server_is_given_up(monkeypatch, tiny_tokenizer_dir, tmp_path):
    job = parse_args(["--tasks", "t.jsonl", "--out", str(tmp_path), "--url", DEAD_URL,
                      "--tokenizer", str(tiny_tokenizer_dir), "--retry-budget-s", "120"])
    clock = _Clock()
    monkeypatch.setattr(client_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(client_module, "anyio", SimpleNamespace(
        sleep=clock.sleep, CapacityLimiter=anyio.CapacityLimiter, CancelScope=anyio.CancelScope))
    async with SGLangClient(msgspec.structs.replace(job.client, base_url=DEAD_URL)) as client:
        with pytest.raises(EngineError, match=r"failed after (\d+) attempt\(s\) over 120\.0s: ConnectError") as failure:
            await client.generate([0], SamplingParams(max_new_tokens=1), session_id="s")
    attempts = int(re.search(r"after (\d+) attempt", str(failure.value)).group(1))
    assert attempts > client_module.SGLangClientConfig().max_retries + 1  # no retry count cut it short
    assert clock.now == pytest.approx(120.0)  # nor did a backoff sleep run past the budget


async def test_local_engine_rolls_out_without_a_server(tiny_hf_dir, workspace_root):
    tasks = write_tasks(workspace_root / "tasks.jsonl", 1)
    out = workspace_root / "run"
    proc = await anyio.run_process(
        [sys.executable, "-m", "agentcore.cli", "rollout", "--tasks", str(tasks), "--out", str(out),
         "--engine", "local", "--model", str(tiny_hf_dir), "--engine-device", "cpu", "--samples", "2",
         "--max-turns", "2", "--max-new-tokens", "8", "--max-context-tokens", "8192"],
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    trajs = list(read_trajectories(out / "trajectories.jsonl"))
    assert sorted(t.sample_index for t in trajs) == [0, 1]
    assert all(t.status not in INFRA_FAILURES and t.turns for t in trajs)
    assert orjson.loads(proc.stdout)["statuses"]


def test_help_lists_rollout():
    out = subprocess.run([sys.executable, "-m", "agentcore.cli", "--help"], capture_output=True, text=True)
    assert "rollout" in out.stdout


def test_version_is_the_package_s():
    cmd = [sys.executable, "-m", "agentcore.cli", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert out.returncode == 0
    assert out.stdout.strip() == f"cuda-agent {importlib.metadata.version('cuda-agent')}"


def test_version_of_an_uninstalled_tree_is_pyproject_s(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.importlib.metadata, "version", not_installed)
    pyproject = tomllib.loads((Path(cli.__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert cli.version() == pyproject["project"]["version"]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_help_answers_without_importing_torch(name):
    code = (
        "import sys\nfrom agentcore.cli import main\n"
        f"try:\n    main([{name!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "usage:" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "False"


def test_rollout_help_shows_every_default():
    cmd = [sys.executable, "-m", "agentcore.cli", "rollout", "--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    text = " ".join(out.stdout.split())
    for shown in ["(default: sglang)", "(default: fake)", "(default: 256)", "(default: 300.0)", "(default: 150)"]:
        assert shown in text


@pytest.mark.parametrize("flag, value, says", [
    ("--tokenizer", "/nonexistent/tokenizer", "--tokenizer /nonexistent/tokenizer: no such directory"),
    ("--url", "localhost:30000", "--url 'localhost:30000' is not a server URL"),
    ("--url", "http://127.0.0.1:port", "--url 'http://127.0.0.1:port' is not a server URL"),
])  # fmt: skip
def test_bad_tokenizer_or_url_is_a_one_line_error(tmp_path, tiny_tokenizer_dir, flag, value, says):
    given = {"--url": DEAD_URL, "--tokenizer": str(tiny_tokenizer_dir), flag: value}
    args = ["--tasks", str(write_tasks(tmp_path / "tasks.jsonl", 1)), "--out", str(tmp_path / "run")]
    args += [x for option in given.items() for x in option]
    proc = subprocess.run([sys.executable, "-m", "agentcore.cli", "rollout", *args],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"cuda-agent rollout: {says}")
    assert not (tmp_path / "run").exists()


def test_a_directory_that_holds_no_tokenizer_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "agentcore.cli", "rollout", "--tasks", str(write_tasks(tmp_path / "tasks.jsonl", 1)),
         "--out", str(tmp_path / "run"), "--url", DEAD_URL, "--tokenizer", str(tmp_path / "empty")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    says = f"--tokenizer {tmp_path / 'empty'}: not a tokenizer directory (transformers cannot load it: ValueError)"
    assert stderr_lines(proc) == [f"cuda-agent rollout: {says}"]


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
