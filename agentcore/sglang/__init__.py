"""The SGLang side of agentcore: a client per server, a launcher, and a router over servers.

What it is: everything that talks to SGLang's native HTTP API (`/generate`, the
control and weight-update routes of `python/sglang/srt/entrypoints/http_server.py`).
`offline.py` (not imported here) builds and installs an SGLang bundle for a GPU machine that
has no package index.
What it is not: chat rendering (done before the engine) or weight serialisation (the learner's
job, in `rl`); nothing here imports torch.

    async with SGLangServer(SGLangServerConfig(model_path=m, port=30000)) as server:
        async with SGLangClient(SGLangClientConfig(base_url=server.base_url)) as client:
            router = Router([client])
            gen = await router.generate(ids, SamplingParams(max_new_tokens=512), session_id="t")
"""

from agentcore.sglang.client import (
    ClientStatistics,
    RequestRejected,
    ServerInfo,
    SGLangClient,
    SGLangClientConfig,
    WeightUpdateError,
    WeightUpdateResult,
)
from agentcore.sglang.launcher import (
    ServerStatistics,
    SGLangLaunch,
    SGLangServer,
    SGLangServerConfig,
    SGLangServerError,
    free_port,
)
from agentcore.sglang.router import Router, RouterConfig, RouterStatistics
from agentcore.sglang.wire import parse_weight_version, rid_prefix

__all__ = [
    "ClientStatistics",
    "RequestRejected",
    "Router",
    "RouterConfig",
    "RouterStatistics",
    "SGLangClient",
    "SGLangClientConfig",
    "SGLangLaunch",
    "SGLangServer",
    "SGLangServerConfig",
    "SGLangServerError",
    "ServerInfo",
    "ServerStatistics",
    "WeightUpdateError",
    "WeightUpdateResult",
    "free_port",
    "parse_weight_version",
    "rid_prefix",
]
