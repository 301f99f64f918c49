"""An Engine over several model servers: sticky sessions, least-loaded placement, failover.

What it is: `Router` keeps every session (one trajectory) on one server so that each turn reuses
the radix (prefix) cache of the turns before it; a new session goes to the server with the
fewest requests in flight, then the fewest sessions. A server that raises `EngineError` (after
its client's own retries) is marked unhealthy and the session moves to a healthy server, where
it only loses its prefix cache: the request carries the whole token history. Unhealthy servers
are probed with `/health_generate` and brought back.
What it is not: a client (the engines are `SGLangClient`s or any `Engine`), nor a way to send
control calls to all servers (call each client). `RequestRejected` (a bad request) passes
through without blaming the server.

    router = Router([client_a, client_b])
    async with anyio.create_task_group() as tg:
        tg.start_soon(router.run_prober)
        gen = await router.generate(ids, params, session_id=trajectory_id)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import anyio
from msgspec import Struct

from agentcore.engine import Engine, EngineError, Generation, SamplingParams
from agentcore.sglang.client import RequestRejected


class RouterConfig(Struct, frozen=True, kw_only=True):
    """How the router places sessions and watches servers."""

    probe_interval_s: float = 5.0
    """Pause between probes of unhealthy servers in `run_prober`."""
    probe_timeout_s: float = 30.0
    """Bound on one health probe."""
    max_sessions: int = 100_000
    """Sticky assignments remembered; the least recently used are forgotten first."""


class RouterStatistics(Struct, frozen=True, kw_only=True):
    """Counters since the router was made, and each server's state now."""

    requests: int
    failovers: int
    errors: int
    sessions: int
    healthy: tuple[bool, ...]
    in_flight: tuple[int, ...]
    sessions_per_server: tuple[int, ...]


class _Server:
    """Mutable bookkeeping for one engine (never leaves this module)."""

    __slots__ = ("down_since", "engine", "healthy", "in_flight", "last_error", "sessions")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.healthy = True
        self.in_flight = 0
        self.sessions = 0
        self.last_error = ""
        self.down_since = 0.0


class Router:
    """Sticky, failover-aware Engine over several engines.

    Example:
        router = Router([SGLangClient(cfg_a), SGLangClient(cfg_b)])
        g1 = await router.generate(prompt, params, session_id="traj-7")  # placed, say, on A
        g2 = await router.generate(prompt + more, params, session_id="traj-7")  # A again
        router.release_session("traj-7")  # trajectory done: forget the assignment
    """

    def __init__(self, engines: Sequence[Engine], config: RouterConfig = RouterConfig()) -> None:
        if not engines:
            raise ValueError("Router needs at least one engine")
        self.config = config
        self._servers = [_Server(e) for e in engines]
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._requests = self._failovers = self._errors = 0

    @property
    def engines(self) -> list[Engine]:
        return [s.engine for s in self._servers]

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            requests=self._requests,
            failovers=self._failovers,
            errors=self._errors,
            sessions=len(self._sessions),
            healthy=tuple(s.healthy for s in self._servers),
            in_flight=tuple(s.in_flight for s in self._servers),
            sessions_per_server=tuple(s.sessions for s in self._servers),
        )

    def server_of(self, session_id: str) -> int | None:
        """Index of the server a session is pinned to, if any."""
        return self._sessions.get(session_id)

    def release_session(self, session_id: str) -> None:
        """Forget a finished session's assignment."""
        index = self._sessions.pop(session_id, None)
        if index is not None:
            self._servers[index].sessions -= 1

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, session_id: str
    ) -> Generation:
        """Generate on the session's server, failing over to healthy ones on EngineError."""
        self._requests += 1
        tried: set[int] = set()
        while True:
            index = await self._place(session_id, exclude=tried)
            server = self._servers[index]
            server.in_flight += 1
            try:
                return await server.engine.generate(input_ids, params, session_id=session_id)
            except RequestRejected:
                raise
            except EngineError as exc:
                self._mark_down(index, exc)
                tried.add(index)
                self._failovers += 1
            finally:
                server.in_flight -= 1

    async def _place(self, session_id: str, *, exclude: set[int]) -> int:
        """The session's healthy server, or a new one; probes once before giving up."""
        current = self._sessions.get(session_id)
        if current is not None and self._servers[current].healthy and current not in exclude:
            self._sessions.move_to_end(session_id)
            return current
        choice = self._least_loaded(exclude)
        if choice is None:
            await self.probe_unhealthy()
            choice = self._least_loaded(exclude)
        if choice is None:
            self._errors += 1
            raise EngineError(self._none_healthy_message())
        self._assign(session_id, choice)
        return choice

    def _least_loaded(self, exclude: set[int]) -> int | None:
        candidates = [
            (s.in_flight, s.sessions, i)
            for i, s in enumerate(self._servers)
            if s.healthy and i not in exclude
        ]
        return min(candidates)[2] if candidates else None

    def _assign(self, session_id: str, index: int) -> None:
        self.release_session(session_id)
        self._sessions[session_id] = index
        self._servers[index].sessions += 1
        while len(self._sessions) > self.config.max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._servers[evicted].sessions -= 1

    def _mark_down(self, index: int, exc: EngineError) -> None:
        server = self._servers[index]
        if server.healthy:
            server.healthy = False
            server.down_since = time.monotonic()
        server.last_error = str(exc)

    def _none_healthy_message(self) -> str:
        errors = "; ".join(
            f"server {i}: {s.last_error or 'unhealthy'}" for i, s in enumerate(self._servers)
        )
        return f"no healthy model server among {len(self._servers)}: {errors}"

    async def probe_unhealthy(self) -> int:
        """Probe every unhealthy server once, concurrently; return how many came back.

        An engine without `health_generate` is given the benefit of the doubt: it is marked
        healthy again and the next request decides."""
        down = [i for i, s in enumerate(self._servers) if not s.healthy]
        revived: list[int] = []

        async def probe(index: int) -> None:
            health = getattr(self._servers[index].engine, "health_generate", None)
            ok = True
            if health is not None:
                ok = False
                with anyio.move_on_after(self.config.probe_timeout_s):
                    ok = await health()
            if ok:
                self._servers[index].healthy = True
                revived.append(index)

        async with anyio.create_task_group() as tg:
            for index in down:
                tg.start_soon(probe, index)
        return len(revived)

    async def run_prober(self) -> None:
        """Probe unhealthy servers every `probe_interval_s`, forever; run it in a task group."""
        while True:
            await anyio.sleep(self.config.probe_interval_s)
            await self.probe_unhealthy()
