"""Training against SGLang servers instead of the embedded engine: rollouts go to the server over
HTTP, and after each update the learner exports the actor and every server loads it with
`update_weights_from_disk` at the new weight version (fake SGLang server on loopback; learner
rank on CPU)."""

from __future__ import annotations

from pathlib import Path

import orjson

from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from rl.config import apply_overrides
from rl.recipes import smoke_cpu
from rl.train import run_training
from tests.fakes.sglang_server import FakeSGLangServer


async def test_sglang_servers_load_each_update_from_disk(tmp_path):
    tok = load_tokenizer(build_tiny_tokenizer(tmp_path / "tok"))
    reply = tok.encode("I will think about it.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    async with FakeSGLangServer(policy=lambda ids: reply) as fake:
        cfg = apply_overrides(smoke_cpu(), [
            f"run_dir={tmp_path / 'run'}", "stage=ppo", "steps.ppo=2", "checkpoint.export_hf=false",
            "engine.kind=sglang", f'engine.urls=["{fake.url}"]', "weight_sync.mode=sglang_disk",
        ])  # fmt: skip
        rows = await run_training(cfg)
        version = fake.weight_version
    assert [r["stage"] for r in rows] == ["ppo", "ppo"]
    assert version == "2"  # the initial sync loads version 0, then one per update
    exported = sorted(p.name for p in (tmp_path / "run" / "weights").iterdir())
    assert exported == ["v000001", "v000002"]  # older exports pruned
    assert (Path(tmp_path / "run" / "weights" / "v000002") / "config.json").exists()
    trajs = [orjson.loads(line) for line in (tmp_path / "run" / "rollouts" / "ppo_000001.jsonl").read_bytes().splitlines()]
    assert {t["weight_version_min"] for t in trajs} == {1}
