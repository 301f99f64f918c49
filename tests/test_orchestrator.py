"""The rollout loop and orchestrator, with the real renderer, parser, workspace and tools.

Only the edges are fake: the policy is a ScriptedEngine (scripted assistant messages tokenized
with the real tokenizer) and the kernel environment is FakeKernelEnv (no GPU).
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from agentcore.engine import EngineError
from agentcore.kernel_env import FakeKernelEnv, FakeKernelEnvConfig
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, WorkItem, collect
from agentcore.rollout import RolloutConfig, RolloutRunner, first_messages
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.scripted import ScriptedEngine
from agentcore.session import WorkspaceTools
from agentcore.store import TrajectoryStore, read_trajectories
from agentcore.types import (
    INFRA_FAILURES,
    Compile,
    Finish,
    Message,
    ReadFile,
    Status,
    Task,
    ToolError,
    Verify,
    WriteFile,
)

SOURCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(16)]

def get_init_inputs():
    return []
"""

MODEL_NEW = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"


def task(i: int = 0) -> Task:
    return Task(task_id=f"t{i}", source=SOURCE, name=f"t{i}")


def solving_script(renderer):
    """A good agent: read, write a kernel and model_new.py, compile, verify, finish."""
    turns = [
        (ReadFile(path="model.py"),),
        (
            WriteFile(path="kernels/relu.cu", content="// kernel\n"),
            WriteFile(path="model_new.py", content=MODEL_NEW),
        ),
        (Compile(),),
        (Verify(),),
        (Finish(summary="done"),),
    ]
    parser = renderer.parser

    def script(session: str, turn: int) -> str:
        return parser.render_turn(f"Step {turn}.", turns[min(turn, len(turns) - 1)])

    return script


def make_engine(renderer, script, **kw) -> ScriptedEngine:
    return ScriptedEngine(
        script=script,
        encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
        end_ids=renderer.stop_token_ids[:1],
        logprob=-0.25,
        **kw,
    )


def make_orch(renderer, engine, workspace_root, *, config=RolloutConfig(max_turns=20), store=None, tools=None, workers=8,
              scorer=None):
    runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=config)
    tools = tools or WorkspaceTools(
        root=workspace_root,
        sandbox=Sandbox(SandboxConfig(timeout_s=10)),
        kernel_env=FakeKernelEnv(FakeKernelEnvConfig(latency_s=0.001)),
    )
    return Orchestrator(runner=runner, tools=tools, store=store, config=OrchestratorConfig(workers=workers),
                        scorer=scorer)


class _WarmingScorer:
    """A scorer that notes when each task's warm-up and scores come; `warm_s` long warm-ups, `fail` ones that raise."""

    def __init__(self, warm_s: float = 0.0, fail: bool = False) -> None:
        self.warm_s, self.fail, self.events = warm_s, fail, []

    async def warm(self, task):
        self.events.append(("warm", task.task_id))
        if self.fail:
            raise RuntimeError("no GPU queue")
        await anyio.sleep(self.warm_s)
        self.events.append(("warmed", task.task_id))

    async def score(self, trajectory, tools, task):
        self.events.append(("score", task.task_id))
        return msgspec.structs.replace(trajectory, reward=1.0)


async def test_the_scorer_warms_each_task_once_as_its_group_starts(renderer, workspace_root):
    scorer = _WarmingScorer()
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root, scorer=scorer)
    groups = await collect(orch, [WorkItem(task=task(i), group_id=f"g{i}", samples=3) for i in range(2)])
    assert all(t.reward == 1.0 for g in groups for t in g.trajectories)
    warms = [e for e in scorer.events if e[0] == "warm"]
    assert sorted(warms) == [("warm", task(0).task_id), ("warm", task(1).task_id)]
    for i in range(2):  # before any score of its task
        first_score = scorer.events.index(("score", task(i).task_id))
        assert scorer.events.index(("warm", task(i).task_id)) < first_score


@pytest.mark.parametrize("how", ["fails", "never ends"])
async def test_a_failing_or_endless_warm_up_neither_fails_nor_holds_up_the_run(renderer, workspace_root, how):
    scorer = _WarmingScorer(warm_s=3600.0, fail=how == "fails")
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root, scorer=scorer)
    with anyio.fail_after(60):
        [group] = await collect(orch, [WorkItem(task=task(), group_id="g", samples=2)])
    assert [t.reward for t in group.trajectories] == [1.0, 1.0]
    assert ("warmed", task().task_id) not in scorer.events


async def test_every_sample_of_every_task_arrives_in_its_group(renderer, workspace_root):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root)
    groups = await collect(orch, [WorkItem(task=task(i), group_id=f"g{i}", samples=3) for i in range(4)])
    assert sorted(g.group_id for g in groups) == ["g0", "g1", "g2", "g3"]
    assert all([t.sample_index for t in g.trajectories] == [0, 1, 2] for g in groups)


async def test_scripted_solver_completes_through_real_tools(renderer, workspace_root):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root)
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g", samples=1)])
    traj = group.trajectories[0]
    assert traj.status is Status.COMPLETED
    assert [type(r).__name__ for t in traj.turns for r in t.results] == [
        "ToolOutput", "ToolOutput", "ToolOutput", "CompileResult", "VerifyResult", "ToolOutput",
    ]  # fmt: skip


async def test_loss_mask_covers_exactly_the_generated_tokens(renderer, workspace_root):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root)
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    traj = group.trajectories[0]
    generated = [i for t in traj.turns for i in range(t.gen_start, t.gen_end)]
    assert [i for i, m in enumerate(traj.loss_mask) if m] == generated
    assert all(traj.logprobs[i] == -0.25 for i in generated)
    assert len(traj.response_ids) == len(traj.logprobs) == len(traj.loss_mask)


async def test_stored_token_ids_equal_a_full_render_of_the_conversation(renderer, workspace_root):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root)
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    traj = group.trajectories[0]
    messages = list(first_messages(task()))
    for turn in traj.turns[:-1]:  # the finish turn has no observation after it
        messages.append(Message(role="assistant", content=turn.text))
        for call, result in zip(turn.calls, turn.results):
            messages.append(Message(role="tool", name=call.__struct_config__.tag, content=_render(result)))
    ids = traj.prompt_ids + traj.response_ids[: traj.turns[-2].obs_end]
    renderer.check_drift(messages, ids)


def _render(result):
    from agentcore.tools import render_result

    return render_result(result)


async def test_malformed_calls_reach_the_model_and_end_as_parse_error(renderer, workspace_root):
    engine = make_engine(renderer, lambda s, t: '<tool_call>{"name": "bash", "arguments": {oops</tool_call>')
    orch = make_orch(renderer, engine, workspace_root)
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    traj = group.trajectories[0]
    assert traj.status is Status.PARSE_ERROR
    assert len(traj.turns) == 3
    assert all(t.parse_error for t in traj.turns)


async def test_turn_limit_truncates(renderer, workspace_root):
    engine = make_engine(renderer, lambda s, t: renderer.parser.render_call(ReadFile(path="model.py")))
    orch = make_orch(renderer, engine, workspace_root, config=RolloutConfig(max_turns=4))
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    assert group.trajectories[0].status is Status.TRUNCATED_TURNS
    assert len(group.trajectories[0].turns) == 4


async def test_context_budget_truncates_by_length(renderer, workspace_root):
    engine = make_engine(renderer, lambda s, t: renderer.parser.render_call(ReadFile(path="model.py")))
    budget = len(renderer.prompt_ids(first_messages(task()))) + 400
    orch = make_orch(renderer, engine, workspace_root, config=RolloutConfig(max_context_tokens=budget))
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    traj = group.trajectories[0]
    assert traj.status is Status.TRUNCATED_LENGTH
    assert len(traj.prompt_ids) + sum(traj.loss_mask) <= budget


async def test_wall_budget_times_out(renderer, workspace_root):
    engine = make_engine(renderer, solving_script(renderer), latency_s=0.2)
    orch = make_orch(renderer, engine, workspace_root, config=RolloutConfig(wall_budget_s=0.5))
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    assert group.trajectories[0].status is Status.TIMEOUT


class _FlakyEngine:
    """Fails for one session, works for the others."""

    def __init__(self, inner, bad: str):
        self.inner, self.bad = inner, bad

    async def generate(self, input_ids, params, *, session_id):
        if session_id.startswith(self.bad):
            raise EngineError("server at http://127.0.0.1:1 is gone")
        return await self.inner.generate(input_ids, params, session_id=session_id)


async def test_engine_failure_of_one_trajectory_spares_its_siblings(renderer, workspace_root):
    engine = _FlakyEngine(make_engine(renderer, solving_script(renderer)), bad="g1/")
    orch = make_orch(renderer, engine, workspace_root)
    groups = await collect(orch, [WorkItem(task=task(i), group_id=f"g{i}") for i in range(3)])
    status = {g.group_id: g.trajectories[0].status for g in groups}
    assert status == {"g0": Status.COMPLETED, "g1": Status.ENGINE_ERROR, "g2": Status.COMPLETED}


class _BrokenTools:
    def open(self, task, trajectory_id):
        raise RuntimeError("workspace disk is full")


async def test_infrastructure_failure_becomes_a_failed_trajectory(renderer, workspace_root):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root, tools=_BrokenTools())
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    assert group.trajectories[0].status is Status.FAILED
    assert "disk is full" in group.trajectories[0].error


async def test_aborted_trajectory_is_returned_but_not_stored(renderer, workspace_root):
    engine = make_engine(renderer, solving_script(renderer), latency_s=0.05)
    async with TrajectoryStore(workspace_root / "t.jsonl") as store:
        orch = make_orch(renderer, engine, workspace_root, store=store)

        async def abort_soon():
            await anyio.sleep(0.12)
            assert orch.abort_all() == 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(abort_soon)
            [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    assert group.trajectories[0].status is Status.ABORTED
    assert group.trajectories[0].turns  # what it did so far is kept
    assert list(read_trajectories(workspace_root / "t.jsonl")) == []


async def test_resumed_run_neither_loses_nor_repeats_trajectories(renderer, workspace_root):
    path = workspace_root / "t.jsonl"
    items = [WorkItem(task=task(i), group_id=f"g{i}", samples=2) for i in range(6)]
    engine = make_engine(renderer, solving_script(renderer), latency_s=0.02)
    async with TrajectoryStore(path) as store:
        orch = make_orch(renderer, engine, workspace_root, store=store, workers=2)
        async with anyio.create_task_group() as tg:  # the run is stopped partway

            async def stop_after_three():
                while store.statistics().appended < 3:
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()

            tg.start_soon(stop_after_three)
            await collect(orch, items)
    first = {(t.group_id, t.sample_index) for t in read_trajectories(path)}
    assert 3 <= len(first) < 12
    async with TrajectoryStore(path) as store:
        groups = await collect(make_orch(renderer, engine, workspace_root, store=store), items)
    keys = [(t.group_id, t.sample_index) for t in read_trajectories(path)]
    assert sorted(keys) == sorted({(f"g{i}", s) for i in range(6) for s in range(2)})
    assert all(len(g.trajectories) == 2 for g in groups)


async def test_resume_with_redo_reruns_engine_errors_and_keeps_the_model_s_endings(renderer, workspace_root):
    path = workspace_root / "t.jsonl"
    items = [WorkItem(task=task(i), group_id=f"g{i}", samples=2) for i in range(3)]
    flaky = _FlakyEngine(make_engine(renderer, solving_script(renderer)), bad="g1/")
    async with TrajectoryStore(path) as store:
        await collect(make_orch(renderer, flaky, workspace_root, store=store), items)
    first = {(t.group_id, t.sample_index): t for t in read_trajectories(path)}
    assert {k for k, t in first.items() if t.status is Status.ENGINE_ERROR} == {("g1", 0), ("g1", 1)}
    engine = make_engine(renderer, solving_script(renderer))
    async with TrajectoryStore(path, redo=INFRA_FAILURES) as store:
        groups = await collect(make_orch(renderer, engine, workspace_root, store=store), items)
    assert engine.requests == 2 * 5  # only g1's two samples ran again, five turns each
    assert sorted(g.group_id for g in groups) == ["g1"]
    assert [t.status for t in groups[0].trajectories] == [Status.COMPLETED, Status.COMPLETED]
    final = {(t.group_id, t.sample_index): t for t in read_trajectories(path, strict=True)}
    assert sorted(final) == sorted(first)
    assert {t.status for t in final.values()} == {Status.COMPLETED}
    assert all(final[k].trajectory_id == t.trajectory_id for k, t in first.items() if k[0] != "g1")


async def test_tool_errors_are_shown_to_the_model_not_raised(renderer, workspace_root):
    calls = [WriteFile(path="model.py", content="x"), Finish()]
    engine = make_engine(renderer, lambda s, t: renderer.parser.render_call(calls[min(t, 1)]))
    orch = make_orch(renderer, engine, workspace_root)
    [group] = await collect(orch, [WorkItem(task=task(), group_id="g")])
    first = group.trajectories[0].turns[0].results[0]
    assert isinstance(first, ToolError) and "protected" in first.message.lower()


@pytest.mark.parametrize("samples", [1, 5])
async def test_statistics_count_finished_trajectories(renderer, workspace_root, samples):
    orch = make_orch(renderer, make_engine(renderer, solving_script(renderer)), workspace_root)
    await collect(orch, [WorkItem(task=task(), group_id="g", samples=samples)])
    stats = orch.statistics()
    assert stats.finished == samples and stats.in_flight == 0
    assert stats.by_status == {"completed": samples}
    assert stats.turns == 5 * samples
