"""rl.data.synth end to end on CPU: compositions and scripted-LLM candidates through decontamination
and the real filter handler on a real GpuQueue CPU lane; interrupted, then resumed; and the CLI."""

from __future__ import annotations

import contextlib
import io

import anyio
import orjson
import pytest

from agentcore.chat import ChatRenderer
from agentcore.scripted import ScriptedEngine
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.types import Task
from rl.data import compose as composition
from rl.data.filters import FilterConfig
from rl.data.llm_compose import LlmComposeConfig
from rl.data.loaders import load_dataset_jsonl
from rl.data.similarity import build_corpus
from rl.data.synth import Synth, SynthConfig, open_queues, read_rows, rejects_path
from rl.data.synth_cmd import main, parse_args

SCALE = 0.02
TARGET = 3  # the candidate index planted in the stand-in KernelBench corpus
FILTERS = FilterConfig(device="cpu", min_ms=1e-4, max_ms=1e4, compile=False)  # compile: see test_data_filters
CONFIG = SynthConfig(n=100, max_candidates=6, seed=0, mix_llm=0.35, compose=composition.Config(scale=SCALE),
                     llm=LlmComposeConfig(max_new_tokens=1024), filters=FILTERS, job_deadline_s=120.0)

LLM_REPLY = """Sure.
```python
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)) * {k}.0


features = {features}


def get_inputs():
    return [torch.rand(8, features)]


def get_init_inputs():
    return [features]
```"""


def reply(session: str, turn: int) -> str:
    seed = int(session.split("/")[-1])
    return LLM_REPLY.format(k=seed + 2, features=8 * (1 + seed % 4))


@pytest.fixture(scope="module")
def chat(tiny_tokenizer_dir):
    return ChatRenderer(load_tokenizer(tiny_tokenizer_dir), [], "hermes")


def engine(chat):
    return ScriptedEngine(script=reply, encode=lambda t: chat.tokenizer.encode(t, add_special_tokens=False),
                          end_ids=chat.stop_token_ids[:1])


def corpus_with(task: Task):
    """A stand-in KernelBench: one problem that is candidate TARGET's own source (so it must be dropped)."""
    return build_corpus([Task(task_id="L1/fake", source=task.source)])


def make_synth(config, out, lanes, chat):
    probe = Synth(config, out, lanes, [], engine=engine(chat), chat=chat)
    assert [probe.kind(i) for i in range(6)].count("llm") >= 1
    assert probe.kind(TARGET) == "compose"  # the decontamination target below is a composition
    target = composition.compose(config.seed + TARGET, config=config.compose)
    return Synth(config, out, lanes, corpus_with(target), engine=engine(chat), chat=chat)


async def run_until(config, out, chat, stop_after: int | None):
    async with open_queues(gpus=(0,), lanes_per_gpu=1, filters=config.filters, lock_dir=out.parent / "locks") as lanes:
        synth = make_synth(config, out, lanes, chat)
        async with anyio.create_task_group() as tg:
            if stop_after is not None:
                async def interrupt():
                    while synth.statistics().processed < stop_after:
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()  # as Ctrl-C does: in-flight candidates are abandoned
                tg.start_soon(interrupt)
            await synth.run()
            tg.cancel_scope.cancel()
        return synth.statistics()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, chat):
    out = tmp_path_factory.mktemp("synth") / "tasks.jsonl"
    first = anyio.run(run_until, CONFIG, out, chat, 2)
    after_first = {r["index"] for r in read_rows(rejects_path(out))} | {r["metadata"]["index"] for r in read_rows(out)}
    with open(out, "ab") as f:
        f.write(b'{"task_id": "torn')  # a writer killed mid-line
    second = anyio.run(run_until, CONFIG, out, chat, None)
    return out, first, after_first, second


def test_the_interrupted_run_stopped_early(resumed):
    _, first, after_first, _ = resumed
    assert 2 <= first.processed < 6
    assert len(after_first) == first.processed


def test_resume_processes_each_index_once(resumed):
    out, _, after_first, second = resumed
    good, bad = read_rows(out), read_rows(rejects_path(out))
    indices = [r["metadata"]["index"] for r in good] + [r["index"] for r in bad]
    assert sorted(indices) == list(range(6))
    assert second.processed == 6 - len(after_first)


def test_accepted_rows_load_and_are_deterministic_from_their_index(resumed):
    out = resumed[0]
    result = load_dataset_jsonl(out)
    assert not result.problems and result.tasks
    kinds = set()
    for task in result.tasks:
        meta = task.metadata
        kinds.add(meta["kind"])
        assert meta["eager_ms"] > 0 and meta["device"] == "cpu" and "nearest_kernelbench" in meta
        assert 0 <= meta["kernelbench_similarity"] <= 0.9
        if meta["kind"] == "compose":
            assert task.source == composition.compose(meta["index"], config=CONFIG.compose).source
        else:
            assert task.task_id == f"llm/{meta['index']}" and "torch.sigmoid" in task.source
    assert kinds == {"compose", "llm"}


def test_a_kernelbench_copy_is_rejected_by_decontamination(resumed):
    bad = {r["index"]: r for r in read_rows(rejects_path(resumed[0]))}
    assert bad[TARGET]["stage"] == "decontaminate" and bad[TARGET]["reason"] == "similar_to_kernelbench"
    assert bad[TARGET]["kernelbench_similarity"] == 1.0 and bad[TARGET]["nearest_kernelbench"] == "L1/fake"


def test_the_cli_prints_a_summary_and_writes_the_report(tmp_path):
    kb = tmp_path / "problems.jsonl"
    kb.write_bytes(orjson.dumps({"level": 1, "problem_id": 1, "name": "1_fake", "code": composition.compose(1, config=composition.Config(scale=SCALE)).source}) + b"\n")
    out, report = tmp_path / "d.jsonl", tmp_path / "report"
    argv = ["--n", "2", "--max-candidates", "4", "--out", str(out), "--gpus", "none",
            "--scale", str(SCALE), "--min-ms", "0.0001", "--max-ms", "10000", "--no-compile",
            "--kernelbench", str(kb), "--report", str(report)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    summary = orjson.loads(stdout.getvalue())
    assert summary["accepted"] == 2 and summary["this_run"]["accepted"] == 2
    assert summary["this_run"]["filtered_per_min"] > 0
    assert summary["this_run"]["gpus"] == "none" and summary["this_run"]["lanes_per_gpu"] == 1
    assert summary["per_filter"]["generate"]["entered"] == summary["candidates"]
    assert summary["similarity"]["n"] >= 1
    assert (report / "report.md").exists() and (report / "similarity.png").stat().st_size > 1000
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0  # nothing missing: the re-run appends nothing
    assert len(read_rows(out)) == 2


def test_gpus_none_is_one_lane_on_the_cpu(tmp_path):
    a = parse_args(["--out", str(tmp_path / "d.jsonl"), "--gpus", "none"])
    assert a.gpus == () and a.device == "cpu" and a.lanes_per_gpu == 1
    assert parse_args(["--out", str(tmp_path / "d.jsonl"), "--gpus", "0,2"]).gpus == (0, 2)


@pytest.mark.parametrize("argv, says", [
    (["--gpus", "first"], "'first' is not GPU indices like 0,1 or none"),
    (["--gpus", "none", "--device", "cuda"], "--gpus none runs the filters on the CPU"),
])  # fmt: skip
def test_bad_gpus_are_a_usage_error(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--out", str(tmp_path / "d.jsonl"), *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


async def test_a_row_written_as_the_run_is_cancelled_is_counted_once(tmp_path):
    """The cancel lands while the candidate's consumer waits for the lock to count the row it
    just wrote: the count must still happen (the re-run skips that index), exactly once."""
    out = tmp_path / "tasks.jsonl"
    synth = Synth(SynthConfig(n=1, max_candidates=1, mix_llm=0.0, filters=FILTERS), out, [None], [])
    wrote, locked = anyio.Event(), anyio.Event()

    async def process(index, lane):  # the candidate's row, written before its consumer counts it
        synth._good.write({"task_id": f"t{index}", "source": "", "metadata": {"index": index}})
        wrote.set()
        await locked.wait()
        return True

    synth._process = process
    async with anyio.create_task_group() as tg:
        tg.start_soon(synth.run)
        await wrote.wait()
        await synth._changed.acquire()
        locked.set()
        await anyio.wait_all_tasks_blocked()  # the consumer now waits for the lock, its row written
        tg.cancel_scope.cancel()
        synth._changed.release()
    assert synth.statistics().processed == synth.statistics().accepted == 1
    assert [r["metadata"]["index"] for r in read_rows(out)] == [0]
