"""The driver and a learner rank speak `rl/learner/protocol.py`: the real `LearnerGroup` commands
against a real `Rank`'s routes on a loopback HTTP server, with a fake torch side behind them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import anyio
import httpx
import pytest
import torch

from rl.config import apply_overrides
from rl.engine.http import HttpServer
from rl.learner.protocol import STEP, Empty, SaveRequest, encode
from rl.learner.rank import Rank
from rl.learner_client import LearnerError, LearnerGroup
from rl.recipes import smoke_cpu
from rl.samples import Sample


class FakeLearner:
    """The torch side of a rank (`rl/learner/actor_critic.py`), reduced to its answers."""

    version = 3
    optimizer_steps = 4

    def step(self, kind: str, samples: list[Sample], lr_scale: float) -> dict[str, float]:
        return {"samples": float(len(samples)), "lr_scale": lr_scale, "explained_variance": math.nan}

    def save(self, run_dir, step, extra, export_dir) -> dict[str, float]:
        raise OSError("disk full")


def _samples(n: int) -> list[Sample]:
    return [Sample(sample_id=f"s{i}", group_id="g", token_ids=[1, 2, 3], action_mask=[0, 1, 1],
                   behaviour_logprobs=[0.0, -1.0, -1.0], reward=1.0, weight_version=0) for i in range(n)]


async def _with_rank(tmp_path, commands) -> None:
    dist = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    rank = Rank(smoke_cpu(), tmp_path, dist, FakeLearner(), engine=None)
    server = HttpServer(rank.routes())
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        cfg = apply_overrides(smoke_cpu(), [f"run_dir={tmp_path}", f"layout.port_base={server.port}"])
        group = LearnerGroup(cfg, tmp_path)
        async with httpx.AsyncClient() as group._http:  # the ranks are up: no process to start
            await commands(group)
        tg.cancel_scope.cancel()


async def test_commands_carry_typed_requests_and_replies(tmp_path):
    async def commands(group: LearnerGroup) -> None:
        reply = await group.step("sft", _samples(2), step=7, lr_scale=0.5)
        assert reply.metrics == {"samples": 2.0, "lr_scale": 0.5, "explained_variance": None}  # NaN is null in JSON
        assert not (tmp_path / "batches" / "sft_000007.msgpack").exists()  # the batch file is gone after the step
        info = await group.info()
        assert (info.version, info.optimizer_steps, info.device) == (3, 4, "cpu")
        await group.release(weights=True)
        await group.resume()

    with anyio.fail_after(60):
        await _with_rank(tmp_path, commands)


async def test_a_failed_command_raises_learner_error_with_the_ranks_message(tmp_path):
    async def commands(group: LearnerGroup) -> None:
        with pytest.raises(LearnerError, match=r"/learner/save on .* failed \(500\): OSError\('disk full'\)"):
            await group.save(5, {"stage": "rft", "step": 5}, export=False)

    with anyio.fail_after(60):
        await _with_rank(tmp_path, commands)


async def test_a_malformed_request_is_refused_by_its_type(tmp_path):
    async def commands(group: LearnerGroup) -> None:
        body = encode(SaveRequest(step=1)).replace(b'"step":1', b'"step":"one"')
        r = await group._http.post(group.urls[0] + "/learner/save", content=body)
        assert r.status_code == 500 and "Expected `int`" in r.json()["message"]
        r = await group._http.post(group.urls[0] + STEP.path, content=encode(Empty()))
        assert r.status_code == 500 and "missing required field `kind`" in r.json()["message"]

    with anyio.fail_after(60):
        await _with_rank(tmp_path, commands)



def test_the_ranks_gpus_index_the_gpus_this_process_sees():
    from rl.learner_client import learner_devices

    assert learner_devices((0, 1), None) == "0,1"
    assert learner_devices((0,), "2") == "2"  # a benchmark's child pinned to physical GPU 2
    assert learner_devices((1, 0), "4, 6") == "6,4"


def test_learner_ports_start_at_random_and_the_search_wraps_around(monkeypatch):
    """Two runs started at once each look for free ports before their ranks bind: a random start
    keeps them apart (a fixed 31000 made a CI run and a local one collide)."""
    import rl.learner_client as lc

    monkeypatch.setattr(lc, "port_free", lambda host, port: not 59000 <= port < 60000)
    assert lc.free_port_run(2, start=59000) == 20000  # nothing free above: wrapped
    bases = {lc.free_port_run(2) for _ in range(20)}
    assert len(bases) > 1 and all(20000 <= b < 50000 for b in bases)
