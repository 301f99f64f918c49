"""Generation inside the learner's process: an embedded transformers engine and its HTTP front.

What it is: `EmbeddedEngine` (batched generation with a KV cache, weight updates in place,
`agentcore.engine.Engine`), `EngineServer` (SGLang's native JSON in front of it, so the SGLang
client and router work unchanged) and `HttpServer` (the small JSON server under it).
What it is not: SGLang; use it for small models, tests and single-host runs without SGLang.

    engine = EmbeddedEngine.from_pretrained(path, EmbeddedEngineConfig())
    server = EngineServer(engine, EngineServerConfig(port=30000))
    async with anyio.create_task_group() as tg:
        await tg.start(engine.serve)
        await tg.start(server.serve)
"""

from rl.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig, EngineStats
from rl.engine.http import Handler, HttpServer, HttpServerConfig
from rl.engine.server import EngineServer, EngineServerConfig

__all__ = [
    "EmbeddedEngine",
    "EmbeddedEngineConfig",
    "EngineServer",
    "EngineServerConfig",
    "EngineStats",
    "Handler",
    "HttpServer",
    "HttpServerConfig",
]
