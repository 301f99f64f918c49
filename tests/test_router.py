"""Router over real SGLangClients talking to fake SGLang servers on loopback; the contract test
(taking `sglang_backend`) also runs over two real SGLang servers, one per GPU, under the `sglang`
marker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

from agentcore.engine import EngineError, SamplingParams
from agentcore.sglang import (
    RequestRejected,
    Router,
    RouterConfig,
    SGLangClient,
    SGLangClientConfig,
)
from tests.fakes.sglang_server import FakeSGLangServer, expected_tokens

PROMPT = [5, 6, 7]
PARAMS = SamplingParams(max_new_tokens=4)
BOUND_S = 30


@asynccontextmanager
async def cluster(
    n: int = 2, config: RouterConfig | None = None, **fake_kw: Any
) -> AsyncIterator[tuple[list[FakeSGLangServer], Router]]:
    async with AsyncExitStack() as stack:
        fakes = [await stack.enter_async_context(FakeSGLangServer(**fake_kw)) for _ in range(n)]
        quick = [
            SGLangClientConfig(base_url=f.url, max_retries=1, backoff_base_s=0.01) for f in fakes
        ]
        clients = [await stack.enter_async_context(SGLangClient(c)) for c in quick]
        config = config or RouterConfig(probe_interval_s=0.05, probe_timeout_s=5.0)
        yield fakes, Router(clients, config)


def sessions_seen(fake: FakeSGLangServer) -> set[str]:
    return {r["rid"].split("/")[0] for r in fake.generate_requests}


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND_S):
        while not predicate():
            await anyio.sleep(0.01)


async def test_router_keeps_each_session_on_one_server(sglang_backend):
    config = RouterConfig(probe_interval_s=0.05, probe_timeout_s=5.0)
    async with sglang_backend.cluster(config, max_retries=1) as (clients, router):
        homes: dict[str, set[int | None]] = {}
        for turn in range(3):
            for s in range(6):
                await router.generate(PROMPT + [turn], PARAMS, session_id=f"t{s}")
                homes.setdefault(f"t{s}", set()).add(router.server_of(f"t{s}"))
        sent = [c.statistics().requests for c in clients]
    assert all(len(h) == 1 and None not in h for h in homes.values())
    assert sent == [9, 9] and router.statistics().sessions_per_server == (3, 3)


async def test_router_spreads_concurrent_new_sessions_evenly():
    async with cluster(latency_s=0.2) as (fakes, router):
        async with anyio.create_task_group() as tg:
            for s in range(8):
                tg.start_soon(lambda s=s: router.generate(PROMPT, PARAMS, session_id=f"t{s}"))
    assert [len(sessions_seen(f)) for f in fakes] == [4, 4]


async def test_router_sends_a_new_session_to_the_least_loaded_server():
    async with cluster(latency_s=0.5) as (fakes, router):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: router.generate(PROMPT, PARAMS, session_id="busy"))
            await wait_until(lambda: sum(f.in_flight for f in fakes) == 1)
            router.release_session("busy")  # in flight on one server, pinned to none
            busy = 0 if fakes[0].in_flight else 1
            await router.generate(PROMPT, PARAMS, session_id="new")
        assert router.server_of("new") == 1 - busy


async def test_router_fails_over_when_the_sessions_server_dies():
    async with cluster() as (fakes, router):
        await router.generate(PROMPT, PARAMS, session_id="t")
        home = router.server_of("t")
        await fakes[home].die()
        gen = await router.generate(PROMPT, PARAMS, session_id="t")
        stats = router.statistics()
    assert gen.token_ids == expected_tokens(PROMPT, 4)
    assert router.server_of("t") == 1 - home
    assert stats.failovers == 1 and stats.healthy[home] is False


async def test_router_brings_back_a_recovered_server():
    async with cluster() as (fakes, router):
        await router.generate(PROMPT, PARAMS, session_id="t")
        home = router.server_of("t")
        await fakes[home].die()
        await router.generate(PROMPT, PARAMS, session_id="t")
        await fakes[home].revive()
        async with anyio.create_task_group() as tg:
            tg.start_soon(router.run_prober)
            await wait_until(lambda: all(router.statistics().healthy))
            tg.cancel_scope.cancel()


async def test_router_raises_engine_error_when_no_server_is_healthy():
    async with cluster() as (fakes, router):
        for fake in fakes:
            await fake.die()
        with anyio.fail_after(BOUND_S), pytest.raises(EngineError, match="no healthy model server"):
            await router.generate(PROMPT, PARAMS, session_id="t")


async def test_router_does_not_blame_a_server_for_a_rejected_request():
    async with cluster() as (fakes, router):
        await router.generate(PROMPT, PARAMS, session_id="t")
        fakes[router.server_of("t")].reject_next(1)
        with pytest.raises(RequestRejected):
            await router.generate(PROMPT, PARAMS, session_id="t")
        assert all(router.statistics().healthy) and router.statistics().failovers == 0


async def test_router_forgets_least_recent_sessions_beyond_its_bound():
    async with cluster(config=RouterConfig(max_sessions=2)) as (_, router):
        for s in range(3):
            await router.generate(PROMPT, PARAMS, session_id=f"t{s}")
        stats = router.statistics()
    assert router.server_of("t0") is None and stats.sessions == 2
    assert sum(stats.sessions_per_server) == 2
