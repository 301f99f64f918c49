"""SGLangClient against a real HTTP server on loopback that speaks SGLang's protocol (the fake).

The contract tests (those taking `sglang_backend`) also run against a real SGLang server under
the `sglang` marker and check only what the HTTP API shows; the rest script the fake's faults or
read what it received."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from agentcore.engine import Engine, EngineError, SamplingParams
from agentcore.sglang import (
    RequestRejected,
    SGLangClient,
    SGLangClientConfig,
    WeightUpdateError,
)
from tests.fakes.sglang_server import FakeSGLangServer, expected_tokens, token_logprob
from tests.sglang_backends import greedy, wait_idle_flush, wait_running

PROMPT = [11, 12, 13]
BOUND_S = 30  # generous: a hang fails the test instead of the suite


@asynccontextmanager
async def serving(
    fake_kw: dict[str, Any] | None = None, **client_kw: Any
) -> AsyncIterator[tuple[FakeSGLangServer, SGLangClient]]:
    client_kw.setdefault("backoff_base_s", 0.01)
    async with FakeSGLangServer(**(fake_kw or {})) as fake:
        async with SGLangClient(SGLangClientConfig(base_url=fake.url, **client_kw)) as client:
            yield fake, client


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND_S):
        while not predicate():
            await anyio.sleep(0.01)


def params(n: int = 16, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, **kw)


async def test_client_is_an_engine():
    async with serving() as (_, client):
        assert isinstance(client, Engine)


async def test_generate_round_trips_tokens_and_logprobs():
    async with serving() as (_, client):
        gen = await client.generate(PROMPT, params(16), session_id="s")
    assert gen.token_ids == expected_tokens(PROMPT, 16)
    assert gen.logprobs == [token_logprob(t) for t in gen.token_ids]
    assert gen.finish_reason == "length"
    assert gen.prompt_tokens == len(PROMPT)


async def test_generate_gives_one_logprob_per_token_up_to_the_budget(sglang_backend):
    async with sglang_backend.serving() as client:
        gen = await client.generate(PROMPT, params(16), session_id="s")
        version = await client.get_weight_version()
    assert len(gen.token_ids) == len(gen.logprobs) == 16 and gen.finish_reason == "length"
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.prompt_tokens == len(PROMPT) and gen.weight_version == version


async def test_same_seed_gives_the_same_tokens(sglang_backend):
    async with sglang_backend.serving() as client:
        runs = []
        for seed in (1234, 1234, 99):  # temperature 1: only the seed fixes the draw
            await wait_idle_flush(client)
            runs.append((await client.generate(PROMPT, params(16, seed=seed), session_id="s")).token_ids)
    assert runs[0] == runs[1]
    assert (runs[2] != runs[0]) == sglang_backend.is_model  # the fake's chain ignores seeds


async def test_request_always_sends_max_new_tokens():
    async with serving() as (fake, client):
        await client.generate(PROMPT, params(7), session_id="s")
    assert fake.generate_requests[-1]["sampling_params"]["max_new_tokens"] == 7


async def test_request_is_token_in_token_out_with_output_logprobs():
    async with serving() as (fake, client):
        await client.generate(PROMPT, params(4, stop_token_ids=(5,)), session_id="s")
    sent = fake.generate_requests[-1]
    assert sent["input_ids"] == PROMPT and "text" not in sent
    assert sent["return_logprob"] is True and sent["logprob_start_len"] == -1
    sampling = sent["sampling_params"]
    assert sampling["skip_special_tokens"] is False and sampling["no_stop_trim"] is True
    assert sampling["stop_token_ids"] == [5]
    assert sent["rid"].startswith("s/")


async def test_seed_is_sent_as_sampling_seed():
    async with serving() as (fake, client):
        await client.generate(PROMPT, params(4, seed=1234), session_id="s")
    assert fake.generate_requests[-1]["sampling_params"]["sampling_seed"] == 1234


async def test_an_unseeded_request_gets_a_seed_of_its_own():
    # a server with --enable-deterministic-inference would give every unseeded request seed 42
    async with serving() as (fake, client):
        for _ in range(4):
            await client.generate(PROMPT, params(4), session_id="s")
    seeds = [q["sampling_params"]["sampling_seed"] for q in fake.generate_requests]
    assert len(set(seeds)) == 4 and all(isinstance(x, int) and 0 <= x < 2**31 for x in seeds)


async def test_stop_token_ends_generation_with_stop(sglang_backend):
    async with sglang_backend.serving() as client:
        await wait_idle_flush(client)
        free = await client.generate(PROMPT, params(5, temperature=0.0), session_id="s")
        stop = free.token_ids[2]
        await wait_idle_flush(client)
        gen = await client.generate(PROMPT, params(16, temperature=0.0, stop_token_ids=(stop,)), session_id="s")
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]


async def test_aborted_generation_is_resumed_into_one_generation():
    async with serving() as (fake, client):
        fake.abort_next(after_tokens=3)
        gen = await client.generate(PROMPT, params(10), session_id="s")
        assert client.statistics().resumes == 1
    assert gen.token_ids == expected_tokens(PROMPT, 10)
    assert gen.logprobs == [token_logprob(t) for t in gen.token_ids]
    assert gen.finish_reason == "length"


async def test_resumed_request_carries_partial_output_and_remaining_budget():
    async with serving() as (fake, client):
        fake.abort_next(after_tokens=3)
        await client.generate(PROMPT, params(10), session_id="s")
    first, second = fake.generate_requests
    assert second["input_ids"] == PROMPT + expected_tokens(PROMPT, 3)
    assert second["sampling_params"]["max_new_tokens"] == 7
    assert second["rid"] != first["rid"]


async def test_resumes_are_bounded_and_return_partial_output_as_abort():
    async with serving(max_resumes=2) as (fake, client):
        fake.abort_next(after_tokens=1, count=100)
        gen = await client.generate(PROMPT, params(10), session_id="s")
    assert gen.finish_reason == "abort"
    assert gen.token_ids == expected_tokens(PROMPT, 3)
    assert len(fake.generate_requests) == 3


async def test_flush_cache_is_refused_while_busy_and_accepted_when_idle(sglang_backend):
    async with sglang_backend.serving() as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.generate(PROMPT, params(sglang_backend.long_budget), session_id="s"))
            await wait_running(client)  # returns at the first refused flush
        assert await client.flush_cache() is True


async def test_5xx_are_retried_then_succeed():
    async with serving() as (fake, client):
        fake.fail_next(2, status=503)
        gen = await client.generate(PROMPT, params(4), session_id="s")
        assert client.statistics().retries == 2
    assert gen.token_ids == expected_tokens(PROMPT, 4)


async def test_rejected_request_raises_request_rejected_without_retry():
    async with serving() as (fake, client):
        fake.reject_next(1)
        with pytest.raises(RequestRejected, match="longer than the context"):
            await client.generate(PROMPT, params(4), session_id="s")
        assert client.statistics().retries == 0


async def test_server_gone_raises_engine_error_naming_the_url():
    async with FakeSGLangServer() as fake:
        url = fake.url
        await fake.die()
        config = SGLangClientConfig(base_url=url, max_retries=3, backoff_base_s=0.01)
        async with SGLangClient(config) as client:
            with anyio.fail_after(BOUND_S), pytest.raises(EngineError) as info:
                await client.generate(PROMPT, params(4), session_id="s")
            assert client.statistics().errors == 1
    assert f"{url}/generate" in str(info.value) and "4 attempt(s)" in str(info.value)


async def test_retry_budget_counts_from_the_first_failure_not_the_first_attempt():
    slow = {"latency_s": 5.0}
    async with serving(slow, request_timeout_s=0.3, retry_budget_s=0.2, max_retries=1) as (_, c):
        with anyio.fail_after(BOUND_S), pytest.raises(EngineError, match=r"2 attempt.*ReadTimeout"):
            await c.generate(PROMPT, params(4), session_id="s")


async def test_trajectory_continues_when_server_dies_and_comes_back():
    async with serving({"token_latency_s": 0.02}, max_retries=50) as (fake, client):
        first = await client.generate(PROMPT, params(8), session_id="traj")
        history = PROMPT + first.token_ids + [7, 8]  # a tool observation appended

        async def crash_and_recover() -> None:
            await wait_until(lambda: fake.in_flight == 1)
            await fake.die()
            await anyio.sleep(0.3)
            await fake.revive()

        async with anyio.create_task_group() as tg:
            tg.start_soon(crash_and_recover)
            second = await client.generate(history, params(8), session_id="traj")
        assert client.statistics().retries >= 1
    assert second.token_ids == expected_tokens(history, 8)


async def test_slow_response_within_timeout_succeeds():
    async with serving({"latency_s": 0.5}, request_timeout_s=20.0) as (_, client):
        gen = await client.generate(PROMPT, params(4), session_id="s")
        assert client.statistics().retries == 0
    assert gen.token_ids == expected_tokens(PROMPT, 4)


async def test_logprobs_shorter_than_output_ids_raise_engine_error():
    async with serving() as (fake, client):
        fake.corrupt_next(1)
        with pytest.raises(EngineError, match="protocol"):
            await client.generate(PROMPT, params(4), session_id="s")


async def test_weight_version_string_becomes_int(sglang_backend):
    async with sglang_backend.serving() as client:
        before = await client.generate(PROMPT, params(2), session_id="s")
        version = await client.get_weight_version() + 7
        await client.update_weights_from_disk(sglang_backend.checkpoints.a, weight_version=version)
        after = await client.generate(PROMPT, params(2), session_id="s")
        assert (before.weight_version, after.weight_version) == (version - 7, version)
        assert await client.get_weight_version() == version


async def test_update_from_a_missing_directory_raises_and_keeps_serving(sglang_backend, tmp_path):
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        with pytest.raises(WeightUpdateError, match="HTTP 400"):
            await client.update_weights_from_disk(str(tmp_path / "missing"), weight_version=version + 1)
        gen = await client.generate(PROMPT, params(4), session_id="s")
        assert await client.get_weight_version() == version
    assert len(gen.token_ids) == 4 and gen.weight_version == version


async def test_weight_version_falls_back_to_model_info():
    class ModelInfoOnly(FakeSGLangServer):
        """As SGLang 0.5.17: 404 on /get_weight_version, the version in /model_info."""

        async def _dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
            if path == "/get_weight_version":
                return 404, {"detail": "Endpoint '/get_weight_version' is deprecated."}
            return await super()._dispatch(method, path, body)

    async with ModelInfoOnly() as fake, SGLangClient(SGLangClientConfig(base_url=fake.url)) as client:
        fake.weight_version = "12"
        assert await client.get_weight_version() == 12


async def test_failed_weight_update_raises_weight_update_error():
    async with serving() as (fake, client):
        fake.fail_weight_updates = True
        with pytest.raises(WeightUpdateError, match="injected"):
            await client.update_weights_from_tensor(["payload"], weight_version=3)


async def test_weight_update_payloads_use_sglang_field_names():
    async with serving() as (fake, client):
        await client.init_weights_update_group("10.0.0.1", 29500, 1, 2, "g", "nccl")
        await client.update_weights_from_distributed(
            ["w"], ["bfloat16"], [[2, 3]], group_name="g", weight_version=4
        )
    (_, init), (_, update) = fake.control_requests
    assert init == {
        "master_address": "10.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
        "backend": "nccl",
    }
    assert update == {
        "names": ["w"],
        "dtypes": ["bfloat16"],
        "shapes": [[2, 3]],
        "group_name": "g",
        "flush_cache": True,
        "weight_version": "4",
    }


def start_one(tg, client, n: int) -> list[Any]:
    """One generation of `n` tokens started in `tg`; its result lands in the returned list."""
    result: list[Any] = []

    async def one() -> None:
        result.append(await client.generate(PROMPT, params(n), session_id="s"))

    tg.start_soon(one)
    return result


async def test_pause_then_continue_completes_the_generation(sglang_backend):
    n = sglang_backend.long_budget
    async with sglang_backend.serving() as client:
        async with anyio.create_task_group() as tg:
            result = start_one(tg, client, n)
            await wait_running(client)
            await client.pause_generation()  # mode abort: in-flight requests come back aborted
            await wait_until(lambda: client.statistics().resumes >= 1)  # re-sent, held by the pause
            await wait_idle_flush(client)  # nothing runs while paused
            await client.continue_generation()
    gen = result[0]
    assert len(gen.token_ids) == len(gen.logprobs) == n and gen.finish_reason == "length"


async def test_abort_all_mid_generation_is_resumed_into_one_generation(sglang_backend):
    n = sglang_backend.long_budget
    async with sglang_backend.serving() as client:
        async with anyio.create_task_group() as tg:
            result = start_one(tg, client, n)
            await wait_running(client)
            await client.abort_request(abort_all=True)
        assert client.statistics().resumes >= 1
    gen = result[0]
    assert len(gen.token_ids) == len(gen.logprobs) == n and gen.finish_reason == "length"


async def test_released_memory_comes_back_with_the_weights_reloaded(sglang_backend):
    a = sglang_backend.checkpoints.a
    async with sglang_backend.serving() as client:
        version = await client.get_weight_version()
        await client.update_weights_from_disk(a, weight_version=version + 1)
        before = await greedy(client)
        await client.pause_generation()
        await wait_idle_flush(client)  # SGLang releases only an idle server
        await client.release_memory_occupation(["weights", "kv_cache", "cuda_graph"])
        await client.resume_memory_occupation(["weights"])  # its contents are lost: reload them
        await client.update_weights_from_disk(a, weight_version=version + 2)
        await client.resume_memory_occupation(["kv_cache", "cuda_graph"])
        await client.continue_generation()
        assert await greedy(client) == before
        assert await client.get_weight_version() == version + 2


async def test_memory_release_and_resume_send_tags():
    async with serving() as (fake, client):
        await client.release_memory_occupation(["kv_cache", "weights"])
        assert fake.released_tags == {"kv_cache", "weights"}
        await client.resume_memory_occupation(["weights"])
        assert fake.released_tags == {"kv_cache"}


async def test_server_info_reports_version():
    async with serving() as (fake, client):
        info = await client.get_server_info()
    assert info.version == "0.0.0-fake" and info.raw["tp_size"] == 1
    assert [path for path, _ in fake.control_requests] == ["/server_info"]  # the 0.5.17 route, not the deprecated one


async def test_server_info_falls_back_to_the_older_route(monkeypatch):
    from tests.fakes import sglang_server

    monkeypatch.delitem(sglang_server._ROUTES, "/server_info")  # a server older than 0.5.17
    async with serving() as (fake, client):
        assert (await client.get_server_info()).version == "0.0.0-fake"
    assert [path for path, _ in fake.control_requests] == ["/server_info", "/get_server_info"]


async def test_abort_request_needs_a_rid_or_abort_all():
    async with serving() as (_, client):
        with pytest.raises(ValueError):
            await client.abort_request()


async def test_statistics_count_in_flight_requests():
    async with serving({"latency_s": 0.5}) as (fake, client):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(lambda i=i: client.generate(PROMPT, params(2), session_id=f"s{i}"))
            await wait_until(lambda: fake.in_flight == 3)
            assert client.statistics().in_flight == 3
        assert client.statistics().in_flight == 0 and client.statistics().requests == 3


def test_sglang_package_does_not_import_torch():
    code = "import sys, agentcore.sglang; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
