"""The driver starts its own learner ranks: a rank is ready when its `/health` names this start's
launch id; another run's learner on the port fails the start at once (and is left running), and a
rank whose port is taken exits with one line naming the port. The ranks are real processes, the
other run's learner a real `Rank`'s routes on loopback."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import pytest
import torch

from rl.config import apply_overrides, save_config
from rl.engine.http import HttpServer
from rl.learner.protocol import HEALTH
from rl.learner.rank import Rank
from rl.learner_client import LearnerError, LearnerGroup, free_port_run
from rl.recipes import smoke_cpu

BOUND_S = 120  # a hang guard only: the startup timeout is 30 min


class ClosingLearner:
    """The torch side of a rank, reduced to what `/learner/shutdown` calls."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _rank(run_dir: Path, launch_id: str) -> Rank:
    dist = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    return Rank(smoke_cpu(), run_dir, dist, ClosingLearner(), engine=None, launch_id=launch_id)


def _group(run_dir: Path, port_base: int, *overrides: str) -> LearnerGroup:
    cfg = apply_overrides(smoke_cpu(), [f"run_dir={run_dir}", f"layout.port_base={port_base}", *overrides])
    save_config(cfg, run_dir)  # what `cuda-agent train` does before starting the ranks
    return LearnerGroup(cfg, run_dir)


async def test_a_rank_answering_with_this_starts_launch_id_is_ready(tmp_path):
    rank = _rank(tmp_path, "")
    server = HttpServer(rank.routes())
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        group = _group(tmp_path, server.port)
        rank.launch_id = group.launch_id
        group._process = SimpleNamespace(returncode=None)  # the ranks' process group, still running
        async with httpx.AsyncClient() as group._http:
            with anyio.fail_after(BOUND_S):
                await group._wait_ready()
            health = HEALTH.decode_reply((await group._http.get(group.urls[0] + "/health")).content)
        tg.cancel_scope.cancel()
    assert group._ready and health.run_dir == str(tmp_path)


async def test_another_runs_learner_on_the_port_fails_the_start_at_once(tmp_path):
    other = _rank(tmp_path / "other", "a1b2")
    server = HttpServer(other.routes())
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        group = _group(tmp_path / "run", server.port)
        message = (rf"^learner rank 0's port {server.port} is served by another run's learner "
                   rf"\(run dir {tmp_path / 'other'}\): set layout\.port_base to a free range")
        with anyio.fail_after(BOUND_S), pytest.raises(LearnerError, match=message):
            async with group:
                pass
        tg.cancel_scope.cancel()
    assert not other.learner.closed  # the driver sent no shutdown to a learner not its own


def test_a_rank_that_cannot_bind_its_port_exits_naming_it(tmp_path):
    base = free_port_run(2)
    with socket.socket() as holder:  # rank 1's port, taken by a process that is no learner
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        group = _group(tmp_path, base, "layout.learner_gpus=[0,1]")
        (tmp_path / "learner.log").write_text("2026-01-01 00:00:00,000 ERROR rank: an earlier start's error\n")

        async def start() -> None:
            async with group:
                pass

        with pytest.raises(LearnerError) as failed:
            anyio.run(start)
    first_line = str(failed.value).splitlines()[0]  # above the log's tail, which torchrun's summary fills
    assert first_line == (f"learner ranks exited with 1: learner rank 1 cannot listen on port {base + 1} "
                          "(Address already in use): set layout.port_base to a free range (0 picks one)")
