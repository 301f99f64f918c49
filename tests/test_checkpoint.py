"""rl.learner.checkpoint: save/load restores the whole training state, a kill mid-save never costs the
previous checkpoint, FSDP2-sharded state saves and loads over 2 ranks, and the HF export loads
in transformers with the same logits.

This file is also the body of two subprocesses: `kill POINT RUN_DIR` (a save that pauses at
POINT and is SIGKILLed there) and the torchrun worker `fsdp OUT` (2 CPU ranks, gloo).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64


def _cfg(vocab: int = VOCAB, hidden: int = 32):
    """hidden 32 on CPU; 64 on CUDA, where flex attention needs heads of at least 16 dims."""
    from rl.learner.models import ModelConfig, tiny_qwen2_config

    hf = tiny_qwen2_config(vocab, hidden=hidden, layers=2, intermediate=2 * hidden)
    return ModelConfig(hf_config=hf, logprob_chunk_tokens=8)


def _setup(vocab: int = VOCAB):
    """A tiny actor and critic with their AdamW optimizers."""
    from rl.learner.models import build_actor, build_critic

    actor, critic = build_actor(_cfg(vocab), "cpu"), build_critic(_cfg(vocab), "cpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (actor, critic)]
    return actor, critic, *opts


def _train(actor, critic, actor_opt, critic_opt, seed: int) -> None:
    """One optimizer step of both models on a random row (draws from a private generator)."""
    g = torch.Generator().manual_seed(seed)
    device = next(actor.parameters()).device
    ids = torch.randint(1, VOCAB, (1, 12), generator=g).to(device)
    pos = torch.arange(12, device=device)[None]
    logprobs, entropy = actor(ids, pos, torch.roll(ids, -1, dims=1))
    values = critic(ids, pos)
    (-(logprobs.mean() + entropy.mean()) + ((values - 1.0) ** 2).mean()).backward()
    for opt in (actor_opt, critic_opt):
        opt.step()
        opt.zero_grad()


def _params(*modules) -> list[dict[str, torch.Tensor]]:
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _assert_states_equal(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for key in w:
            assert torch.equal(g[key], w[key]), key


def _opt_tensors(opt) -> list[torch.Tensor]:
    """Every tensor of an optimizer's state, in parameter order (exp_avg, exp_avg_sq, step)."""
    sd = opt.state_dict()["state"]
    return [t for i in sorted(sd) for _, t in sorted(sd[i].items())]


def test_load_restores_params_optimizer_state_rng_and_extra(tmp_path):
    from rl.learner import checkpoint

    models = _setup()
    _train(*models, seed=0)
    saved, saved_opts = _params(*models[:2]), [_opt_tensors(o) for o in models[2:]]
    extra = {"cursor": 17, "consumed": ["t-1", "t-2"]}
    kw = {"actor": models[0], "critic": models[1], "actor_opt": models[2], "critic_opt": models[3]}
    checkpoint.save(tmp_path, 3, **kw, extra=extra)
    expected_draws = _draws()
    _train(*models, seed=1)  # moves weights, optimizer state and (via _draws) the RNG streams
    _draws()

    found = checkpoint.load_latest(tmp_path, **kw)

    assert found == (3, extra)
    _assert_states_equal(_params(*models[:2]), saved)
    for opt, want in zip(models[2:], saved_opts):
        got = _opt_tensors(opt)
        assert len(got) == len(want) > 0
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert _draws() == expected_draws


def test_resumed_training_matches_uninterrupted_training(tmp_path):
    from rl.learner import checkpoint

    original = _setup()
    _train(*original, seed=0)
    checkpoint.save(tmp_path, 1, actor=original[0], critic=original[1], actor_opt=original[2], critic_opt=original[3])
    _train(*original, seed=1)

    resumed = _setup()
    checkpoint.load_latest(tmp_path, actor=resumed[0], critic=resumed[1], actor_opt=resumed[2], critic_opt=resumed[3])
    _train(*resumed, seed=1)

    _assert_states_equal(_params(*resumed[:2]), _params(*original[:2]))


def test_no_checkpoint_loads_nothing(tmp_path):
    from rl.learner import checkpoint

    actor, critic, *_ = _setup()
    assert checkpoint.load_latest(tmp_path, actor=actor, critic=critic) is None


def test_torn_tmp_directory_is_ignored_and_removed(tmp_path):
    from rl.learner import checkpoint

    actor, critic, a_opt, c_opt = _setup()
    checkpoint.save(tmp_path, 1, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)
    want = _params(actor, critic)
    torn = tmp_path / "ckpt" / "step_000002.tmp"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "__0_0.distcp").write_bytes(b"half a shard")
    _train(actor, critic, a_opt, c_opt, seed=0)

    found = checkpoint.load_latest(tmp_path, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)

    assert found is not None and found[0] == 1
    assert not torn.exists()
    _assert_states_equal(_params(actor, critic), want)


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    from rl.learner import checkpoint

    actor, critic, *_ = _setup()
    for step in range(1, 6):
        checkpoint.save(tmp_path, step, actor=actor, critic=critic, keep=2)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith("."))
    names = [n for n in names if not n.endswith(".del")]  # pruned ones still being deleted in the background
    assert names == ["latest", "step_000004", "step_000005"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_000005"


def test_saving_a_step_again_replaces_it(tmp_path):
    from rl.learner import checkpoint

    actor, critic, a_opt, c_opt = _setup()
    checkpoint.save(tmp_path, 1, actor=actor, critic=critic, extra={"v": 1})
    _train(actor, critic, a_opt, c_opt, seed=0)
    want = _params(actor, critic)
    checkpoint.save(tmp_path, 1, actor=actor, critic=critic, extra={"v": 2})
    fresh_actor, fresh_critic, *_ = _setup()
    assert checkpoint.load_latest(tmp_path, actor=fresh_actor, critic=fresh_critic) == (1, {"v": 2})
    _assert_states_equal(_params(fresh_actor, fresh_critic), want)


def test_a_pruned_checkpoint_is_not_complete_and_load_removes_it(tmp_path, monkeypatch):
    from rl.learner import checkpoint

    actor, critic, *_ = _setup()
    checkpoint.save(tmp_path, 1, actor=actor, critic=critic)
    checkpoint.save(tmp_path, 2, actor=actor, critic=critic)
    root = tmp_path / "ckpt"
    (root / "latest").unlink()  # the scan, not the pointer, must skip the pruned one
    # a kill after the renames, before the background deletes
    monkeypatch.setattr(checkpoint, "_remove_later", lambda path: os.replace(path, path.with_name(path.name + ".del")))
    checkpoint.save(tmp_path, 3, actor=actor, critic=critic, keep=1)
    (root / "latest").unlink()
    (root / "step_000003").rename(root / "step_000003.tmp")  # leave only torn and pruned ones
    assert sorted(p.name for p in root.glob("*.del")) == ["step_000001.del", "step_000002.del"]
    assert checkpoint.latest_dir(tmp_path) is None
    assert checkpoint.load_latest(tmp_path, actor=actor, critic=critic) is None
    assert not list(root.glob("*.del")) and not list(root.glob("*.tmp"))


def test_save_and_export_report_seconds_per_part(tmp_path, tiny_tokenizer_dir, tokenizer_vocab):
    from rl.learner import checkpoint

    actor, critic, a_opt, c_opt = _setup(tokenizer_vocab)
    parts: dict[str, float] = {}
    checkpoint.save(tmp_path, 1, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt, timings=parts)
    checkpoint.export_hf(actor, tiny_tokenizer_dir, tmp_path / "hf", timings=parts)
    want = {"state_dict", "dcp_write", "rng", "fsync", "commit", "prune",
            "export_gather", "export_write", "export_tokenizer", "export_commit"}
    assert set(parts) == want and all(v >= 0 for v in parts.values())


# ---------------------------------------------------------------------------------------------
# A real SIGKILL in the middle of a save


# kill point -> the step a load must find: `latest` is the commit point of a save
KILL_POINTS = {"state_written": 1, "before_pointer": 1, "after_pointer": 2}


def _plain_setup():
    """Two small torch modules with AdamW: the kill children need no transformers import."""
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 1))
    return actor, critic, *[torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (actor, critic)]


def _plain_train(actor, critic, actor_opt, critic_opt, seed: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
    (actor(x).square().mean() + critic(x).square().mean()).backward()
    for opt in (actor_opt, critic_opt):
        opt.step()
        opt.zero_grad()


def _kill_child(point: str, run_dir: Path) -> None:
    """Save step 1, train, then save step 2 and pause at `point` until killed."""
    from rl.learner import checkpoint

    models = _plain_setup()
    kw = {"actor": models[0], "critic": models[1], "actor_opt": models[2], "critic_opt": models[3]}
    _plain_train(*models, seed=0)
    torch.save(_params(*models[:2]), run_dir / "expected_1.pt")
    checkpoint.save(run_dir, 1, **kw)
    _plain_train(*models, seed=1)
    torch.save(_params(*models[:2]), run_dir / "expected_2.pt")

    def pause() -> None:
        print("PAUSED", flush=True)
        time.sleep(600)

    if point == "state_written":
        real_save = checkpoint.dcp.save
        checkpoint.dcp.save = lambda *a, **k: (real_save(*a, **k), pause())
    elif point == "before_pointer":
        real_write = checkpoint._write_atomic
        checkpoint._write_atomic = lambda p, d: pause() if p.name == "latest" else real_write(p, d)
    else:
        checkpoint._prune = lambda root, keep: pause()
    checkpoint.save(run_dir, 2, **kw)


def test_sigkill_in_the_middle_of_a_save_leaves_a_loadable_checkpoint(tmp_path):
    from rl.learner import checkpoint

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU ranks, gloo
    children = {}
    for point in KILL_POINTS:
        (tmp_path / point).mkdir()
        cmd = [sys.executable, __file__, "kill", point, str(tmp_path / point)]
        children[point] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for point, child in children.items():
        line = child.stdout.readline()
        assert line.strip() == "PAUSED", child.stderr.read()[-3000:]
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    for point, step in KILL_POINTS.items():
        run_dir = tmp_path / point
        actor, critic, a_opt, c_opt = _plain_setup()
        found = checkpoint.load_latest(run_dir, actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)
        assert found is not None and found[0] == step, point
        _assert_states_equal(_params(actor, critic), torch.load(run_dir / f"expected_{step}.pt"))
        assert not list((run_dir / "ckpt").glob("*.tmp"))


# ---------------------------------------------------------------------------------------------
# FSDP2: 2 ranks save and load; the same checkpoint loads unsharded in one process


def _fsdp_worker(out: Path) -> None:
    from rl.learner import checkpoint
    from rl.learner.fsdp import (
        apply_activation_checkpointing,
        close_distributed,
        full_state_items,
        init_distributed,
        shard,
    )
    from rl.learner.models import layers

    d = init_distributed()
    models = _setup()
    for m in models[:2]:
        apply_activation_checkpointing(m, layers(m))
        shard(m, layers=layers(m))
    models = (*models[:2], *[torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models[:2]])
    kw = {"actor": models[0], "critic": models[1], "actor_opt": models[2], "critic_opt": models[3]}

    def full() -> list[dict[str, torch.Tensor]]:
        return [{n: t.clone() for b in full_state_items(m, 1 << 20) for n, t in b} for m in models[:2]]

    def opt_full() -> list[torch.Tensor]:
        return [t.full_tensor() if hasattr(t, "full_tensor") else t for o in models[2:] for t in _opt_tensors(o)]

    random.seed(100 + d.rank)  # per-rank streams, so a swapped restore would show
    torch.manual_seed(100 + d.rank)
    _train(*models, seed=d.rank)
    saved, saved_opt = full(), opt_full()
    checkpoint.save(out / "run", 5, **kw, extra={"rank0_cursor": 9})
    draws = _draws()
    _train(*models, seed=7)
    changed = full()
    found = checkpoint.load_latest(out / "run", **kw)
    result = {
        "found": found,
        "saved": saved,
        "changed": changed,
        "loaded": full(),
        "opt_equal": all(torch.equal(a, b) for a, b in zip(opt_full(), saved_opt)),
        "draws_equal": _draws() == draws,
    }
    torch.save(result, out / f"result_{d.rank}.pt")
    close_distributed(sync=True)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt_fsdp")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU ranks, gloo
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, "fsdp"]
    proc = subprocess.run([*cmd, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, [torch.load(out / f"result_{r}.pt", weights_only=False) for r in range(2)]


def test_fsdp_ranks_restore_their_sharded_state(fsdp_run):
    _, results = fsdp_run
    for r in results:
        assert r["found"] == (5, {"rank0_cursor": 9})
        assert any(not torch.equal(r["changed"][0][k], r["saved"][0][k]) for k in r["saved"][0])
        _assert_states_equal(r["loaded"], r["saved"])
        assert r["opt_equal"]


def test_fsdp_ranks_restore_their_own_rng_streams(fsdp_run):
    _, results = fsdp_run
    assert all(r["draws_equal"] for r in results)


def test_fsdp_checkpoint_loads_unsharded_in_one_process(fsdp_run):
    from rl.learner import checkpoint

    out, results = fsdp_run
    actor, critic, a_opt, c_opt = _setup()
    found = checkpoint.load_latest(out / "run", actor=actor, critic=critic, actor_opt=a_opt, critic_opt=c_opt)
    assert found is not None and found[0] == 5
    saved_actor, saved_critic = results[0]["saved"]
    for key, value in actor.lm.state_dict().items():
        assert torch.equal(value, saved_actor[key]), key
    for key, value in critic.state_dict().items():
        assert torch.equal(value, saved_critic[key.removeprefix("backbone.")]), key


# ---------------------------------------------------------------------------------------------
# Hugging Face export


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.fixture(scope="module")
def tokenizer_vocab(tiny_tokenizer_dir):
    from agentcore.tiny_tokenizer import load_tokenizer

    return len(load_tokenizer(tiny_tokenizer_dir))


def test_export_loads_in_transformers_with_identical_logits(tmp_path, tiny_tokenizer_dir, tokenizer_vocab):
    from transformers import AutoModelForCausalLM

    from rl.learner import checkpoint

    actor, critic, a_opt, c_opt = _setup(tokenizer_vocab)
    _train(actor, critic, a_opt, c_opt, seed=0)  # weights that differ from any fresh init
    out = checkpoint.export_hf(actor, tiny_tokenizer_dir, tmp_path / "hf", dtype=torch.float32)

    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (out / name).is_file(), name
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, attn_implementation="sdpa")
    ids = torch.randint(0, tokenizer_vocab, (2, 16))
    assert torch.equal(_logits(loaded, ids), _logits(actor.lm, ids))


def test_export_in_bf16_declares_and_stores_bf16(tmp_path, tiny_tokenizer_dir, tokenizer_vocab):
    import json

    from transformers import AutoModelForCausalLM

    from rl.learner import checkpoint

    actor, *_ = _setup(tokenizer_vocab)
    out = checkpoint.export_hf(actor, tiny_tokenizer_dir, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, attn_implementation="sdpa")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    want = actor.lm.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, want[key].to(torch.bfloat16)), key


def test_large_export_is_sharded_and_loads(tmp_path, tiny_tokenizer_dir, tokenizer_vocab):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.learner import checkpoint

    actor, *_ = _setup(tokenizer_vocab)
    out = checkpoint.export_hf(actor, tiny_tokenizer_dir, tmp_path / "hf", dtype=torch.float32, max_shard_size="200KB")
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("model-*.safetensors"))) > 1
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, attn_implementation="sdpa")
    ids = torch.randint(0, tokenizer_vocab, (1, 16))
    assert torch.equal(_logits(loaded, ids), _logits(actor.lm, ids))
    assert AutoTokenizer.from_pretrained(out, local_files_only=True).encode("hello world")


# ---------------------------------------------------------------------------------------------
# CUDA: one NCCL rank, bf16 mixed precision, save/load and export


def _cuda_worker(out: Path, tokenizer_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from rl.learner import checkpoint
    from rl.learner.fsdp import (
        apply_activation_checkpointing,
        close_distributed,
        full_state_items,
        init_distributed,
        shard,
    )
    from rl.learner.models import build_actor, build_critic, layers

    d = init_distributed()
    actor, critic = build_actor(_cfg(hidden=64), d.device), build_critic(_cfg(hidden=64), d.device)
    for m in (actor, critic):
        apply_activation_checkpointing(m, layers(m))
        shard(m, layers=layers(m))
    models = (actor, critic, *[torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (actor, critic)])
    kw = {"actor": actor, "critic": critic, "actor_opt": models[2], "critic_opt": models[3]}
    _train(*models, seed=0)
    saved = {n: t.cpu().clone() for b in full_state_items(actor, 1 << 20) for n, t in b}
    checkpoint.save(out / "run", 1, **kw)
    cuda_draw = torch.rand(4, device=d.device).cpu()
    _train(*models, seed=1)
    found = checkpoint.load_latest(out / "run", **kw)
    loaded = {n: t.cpu().clone() for b in full_state_items(actor, 1 << 20) for n, t in b}
    exported = checkpoint.export_hf(actor, tokenizer_dir, out / "hf")
    hf = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).to(d.device)
    result = {
        "found": found,
        "restored": all(torch.equal(loaded[k], saved[k]) for k in saved),
        "cuda_rng_restored": torch.equal(torch.rand(4, device=d.device).cpu(), cuda_draw),
        "export_equal": all(torch.equal(v.cpu(), saved[k].to(torch.bfloat16)) for k, v in hf.state_dict().items()),
    }
    torch.save(result, out / "result.pt")
    close_distributed(sync=True)


@pytest.mark.gpu
def test_cuda_sharded_checkpoint_and_export_round_trip(tmp_path, tiny_tokenizer_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, __file__, "cuda", str(tmp_path), str(tiny_tokenizer_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = torch.load(tmp_path / "result.pt", weights_only=False)
    assert r == {"found": (1, {}), "restored": True, "cuda_rng_restored": True, "export_equal": True}


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        _kill_child(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "cuda":
        _cuda_worker(Path(sys.argv[2]), sys.argv[3])
    else:
        _fsdp_worker(Path(sys.argv[2]))
    from rl.learner.fsdp import end_rank_process

    end_rank_process(0)
