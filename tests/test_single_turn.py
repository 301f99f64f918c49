"""The single-turn warm-up stage: the reply's <file> blocks become writes then finish, a reply
without files is a parse error, and `--stage single_turn` trains through the shared machinery."""

from __future__ import annotations

import subprocess
import sys

import orjson

from agentcore.types import Finish, Task, WriteFile
from rl.single_turn import SingleTurnParser, single_turn_messages

REPLY = '''Here is the solution.
<file path="kernels/relu.cu">
__global__ void k() {}
</file>
<file path="model_new.py">class ModelNew: pass
</file>'''


def test_files_become_writes_then_finish():
    parsed = SingleTurnParser().parse(REPLY)
    assert parsed.calls[:2] == (
        WriteFile(path="kernels/relu.cu", content="__global__ void k() {}\n"),
        WriteFile(path="model_new.py", content="class ModelNew: pass\n"),
    )
    assert isinstance(parsed.calls[-1], Finish) and not parsed.errors
    assert parsed.content == "Here is the solution."


def test_reply_without_files_is_an_error():
    parsed = SingleTurnParser().parse("I would write a kernel.")
    assert not parsed.calls and parsed.errors


def test_render_then_parse_round_trips():
    parser = SingleTurnParser()
    calls = parser.parse(REPLY).calls
    assert parser.parse(parser.render_turn("x", calls)).calls == calls


def test_prompt_carries_the_task_and_the_format():
    messages = single_turn_messages(Task(task_id="t1", source="class Model: pass"))
    assert "class Model: pass" in messages[-1].content and '<file path="' in messages[-1].content


def test_single_turn_stage_runs_one_turn_trajectories(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--recipe", "smoke_cpu", "--stage", "single_turn", "--run-dir", str(run_dir),
            "--set", "steps.single_turn=1", "--set", "checkpoint.export_hf=false"]
    proc = subprocess.run([sys.executable, "-m", "agentcore.cli", "train", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajs = [orjson.loads(line) for line in (run_dir / "rollouts" / "single_turn_000000.jsonl").read_bytes().splitlines()]
    assert trajs and all(len(t["turns"]) == 1 and t["reward"] is not None for t in trajs)
    rows = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert rows[0]["samples"] == len(trajs) and "train/policy_loss" in rows[0]
