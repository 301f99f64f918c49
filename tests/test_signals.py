"""stop_on_signal: SIGINT or SIGTERM cancels the command's scope and says why on stderr."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from agentcore.signals import stop_on_signal


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_cancels_the_scope_and_says_which(signum, capsys):
    async def main() -> bool:
        async with anyio.create_task_group() as tg:
            await tg.start(stop_on_signal, tg.cancel_scope, "cuda-agent test", " (re-run to resume)")
            os.kill(os.getpid(), signum)
            await anyio.sleep(30)
        return tg.cancel_scope.cancel_called

    assert anyio.run(main)
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == f"\ncuda-agent test: {name}, stopping (re-run to resume)\n"

