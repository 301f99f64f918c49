"""The learner's two networks: the actor (policy) and the critic (value model), plus their sizes.

What it is: `Actor` wraps a Hugging Face causal LM and returns, for packed sequences, the
log-prob of each target token and the entropy of each next-token distribution, in fp32, without
ever building the full [T, vocab] logits (and, given the action mask, running the LM head only at
the positions the losses read); `Critic` is the same backbone without the LM head and
with a scalar value head. `build_actor` / `build_critic` load them from a local HF directory or
initialise them at random from a Qwen2-style config dict; `tiny_qwen2_config` / `qwen2_config`
give such dicts; `flops_per_token` and `count_params` feed the MFU figures.
What it is not: sharding, mixed precision or activation checkpointing. `rl.learner.fsdp` applies
all three (`shard`, `apply_activation_checkpointing` over `layers(module)`);
`ModelConfig.gradient_checkpointing` is read by the caller that builds the learner, never here.
Nothing here casts dtypes inside `forward`, so FSDP2's `MixedPrecisionPolicy` decides the compute
dtype. Packed inputs (one [1, T] row holding several documents) are masked per document: at
`attention_kwargs`.

Example:
    cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=32))
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    logprobs, entropy = actor(input_ids, position_ids, targets)   # [1, T] fp32 each
    logprobs, entropy = actor(input_ids, position_ids, targets, mask)  # LM head where mask > 0 only
    values = critic(input_ids, position_ids)                       # [1, T] fp32
"""

from __future__ import annotations

from typing import Any

import torch
from msgspec import Struct
from torch import nn
from torch.utils.checkpoint import checkpoint

from rl.learner import attention
from rl.pretrained import quiet_transformers, resolve_model


class ModelConfig(Struct, frozen=True, kw_only=True):
    """Where the weights come from and how the forward pass is computed."""

    path: str | None = None
    """Local HF directory (config.json + safetensors) or a name in `rl.pretrained.MODELS`
    (`smollm2-135m`); None = random init from `hf_config`."""
    hf_config: dict[str, Any] | None = None
    """A Qwen2-style config dict for random init when `path` is None."""
    attn_implementation: str = "auto"
    """"auto" = "varlen" (rl.learner.attention: FlashAttention over cu_seq_lens) on CUDA when torch has it,
    else "flex_attention"; "sdpa" on CPU; or any HF name."""
    param_dtype: str = "float32"
    """Dtype of the master weights (FSDP2 casts to bf16 for compute)."""
    gradient_checkpointing: bool = True
    """Checkpoint decoder layers; applied by `rl.learner.fsdp.apply_activation_checkpointing`."""
    checkpoint_every: int = 1
    """With gradient_checkpointing, checkpoint every k-th decoder layer (1: all of them; 2: half,
    so a third less recomputation for the activations of the other half kept in memory)."""
    logprob_chunk_tokens: int = 1024
    """Tokens per chunk of the LM head + log-softmax (bounds the fp32 logits to chunk x vocab)."""
    compile_blocks: bool = False
    """On CUDA, torch.compile each decoder block's forward (`rl.learner.fsdp.compile_blocks`): ~60 s of
    compilation at the first update, then 0.5B 11.8 -> 12.5% MFU, 1.5B 25% (H100, 16k tokens)."""
    compile_head: bool = True
    """On CUDA, fuse the fp32 log-softmax / gather / entropy over each chunk's logits into
    compiled kernels (eager runs them as ~6 passes over a [chunk, vocab] fp32 tensor each way)."""
    head_on_actions_only: bool = True
    """Run the actor's LM head + log-softmax only at the positions whose next token is an action
    (the `mask` the update passes); prompt and tool-output positions, which no loss reads, get 0.
    Same losses and gradients as the full head (tests/test_head_actions.py); False = every position."""
    reshard_after_forward: bool = True
    """FSDP2: free each block's gathered bf16 weights after its forward and gather them again for
    the backward. False keeps them (bf16 params held once more, 3 GB at 1.5B): 1.5B, 16k tokens,
    no AC on an H200: 37.8 -> 38.7% MFU alone, 39.4% with fused AdamW."""
    seed: int = 0
    """Seed of the random init (actor and critic backbones start equal)."""


class Actor(nn.Module):
    """A causal LM that returns per-token log-probs and entropies of packed sequences."""

    def __init__(
        self, lm: nn.Module, logprob_chunk_tokens: int = 4096, compile_head: bool = False,
        head_on_actions_only: bool = False,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.compile_head = compile_head
        self.head_on_actions_only = head_on_actions_only

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, targets: torch.Tensor,
        mask: torch.Tensor | None = None, temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logprobs[t] = log p(targets[t] | tokens <= t) and the entropy at t; [1, T] fp32 each.

        The caller passes targets = input_ids shifted left by one within each document. With
        `mask` ([1, T], > 0 where targets[t] is an action: `MicroBatch.mask`) and
        head_on_actions_only, the LM head runs on those positions only; both outputs are 0 elsewhere.
        `temperature`: the distribution is softmax(logits / temperature), the one a rollout engine
        samples from at that temperature (PPO's ratios compare policies at the rollouts' temperature).
        """
        # The indices first: nonzero waits for the device, which here has only the micro-batch's
        # copies queued, not the backbone's forward.
        keep = mask[0].nonzero().squeeze(1) if mask is not None and self.head_on_actions_only else None  # [A]
        hidden = self.lm.base_model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False,
            **attention_kwargs(self.lm, position_ids),
        ).last_hidden_state  # [1, T, H]
        hidden, targets = hidden[0], targets[0]  # [T, H], [T]
        if keep is None:
            logprobs, entropy = self._head_stats(hidden, targets, temperature)
            return logprobs.unsqueeze(0).clone(), entropy.unsqueeze(0).clone()  # [1, T]
        # The packed row is [1, T]: one gather over the flattened sequence, one scatter back.
        logprobs, entropy = self._head_stats(hidden.index_select(0, keep), targets.index_select(0, keep),
                                             temperature)  # [A]
        T = input_ids.shape[1]
        return (
            logprobs.new_zeros(1, T).index_copy(1, keep, logprobs[None]),
            entropy.new_zeros(1, T).index_copy(1, keep, entropy[None]),
        )  # [1, T]

    def _head_stats(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs of `targets` and entropies under the LM head's logits / temperature, chunk by
        chunk; [n, H] -> [n] each.

        An empty `hidden` (a row without actions, e.g. a dummy micro-batch) still runs one empty
        chunk: the head weight gets its (zero) gradient, so FSDP2 reduce-scatters the same
        parameters on every rank even when the head is not tied to the embedding.
        """
        head = self.lm.get_output_embeddings()
        compiled = self.compile_head and hidden.is_cuda
        logprobs, entropy = [], []
        for start in range(0, max(hidden.shape[0], 1), self.logprob_chunk_tokens):
            end = start + self.logprob_chunk_tokens
            # Compiled kernels for a zero-row chunk would be one more specialisation for nothing.
            stats = _compiled_stats() if compiled and hidden.shape[0] > 0 else _logit_stats
            # Recomputed in backward: only one chunk's [c, vocab] logits is ever alive.
            lp, ent = checkpoint(
                _head_logprobs, head, hidden[start:end], targets[start:end], stats, temperature, use_reentrant=False
            )
            logprobs.append(lp)
            entropy.append(ent)
        return torch.cat(logprobs), torch.cat(entropy)


def _head_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, stats, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` and entropy under head(hidden) / temperature, in fp32; [c] each."""
    return stats(head(hidden), targets, temperature)  # the head matmul stays a cuBLAS GEMM in the compute dtype


def _logit_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` and entropy of softmax(logits / temperature), in fp32; [c, V] -> [c] each."""
    logits = logits.float()  # [c, V]; upcast so log-softmax of a bf16 head is exact enough
    if temperature != 1.0:  # scaled after the upcast: in bf16 the division would round the logits again
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)  # [c]
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropy


_COMPILED_STATS = None


def _compiled_stats():
    """`_logit_stats` compiled once per process (static chunk shape; the shorter last chunk of a
    row makes it dynamic once)."""
    global _COMPILED_STATS
    if _COMPILED_STATS is None:
        _COMPILED_STATS = torch.compile(_logit_stats, fullgraph=True)
    return _COMPILED_STATS


def attention_kwargs(model: nn.Module, position_ids: torch.Tensor) -> dict[str, Any]:
    """What the backbone call needs, besides ids and positions, to mask a packed row by document:
    cu_seq_lens for "varlen", our BlockMask for "flex_attention", nothing otherwise.

    The backbone is called with `use_cache=False` and `position_ids` restarting at 0 for each
    document; with `attention_mask=None` transformers 5 then masks attention per document (sdpa,
    eager); under "varlen" (the CUDA default, `rl.learner.attention`) the document bounds go in
    as cu_seq_lens, under flex_attention as our BlockMask."""
    if getattr(model.config, "_attn_implementation", None) == attention.NAME:
        return {"attention_mask": None, **attention.packed_kwargs(position_ids)}
    return {"attention_mask": document_mask(model, position_ids)}


def document_mask(model: nn.Module, position_ids: torch.Tensor):
    """The packed row's attention mask: None (the HF model derives a document mask from
    `position_ids`) except under FlexAttention, where we build the causal document BlockMask
    ourselves. transformers' own flex path makes a new nested mask closure on every call, and
    compiled flex attention recompiles on each new closure identity until it hits the recompile
    limit and falls back to the slow uncompiled kernel; one flat closure over a doc-id tensor
    compiles once (plus once more when the length becomes dynamic)."""
    if getattr(model.config, "_attn_implementation", None) != "flex_attention":
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    pos = position_ids[0]  # [T]
    doc = torch.cumsum((pos == 0).to(torch.int32), 0)  # [T] document id of each token

    def causal_document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    T = pos.shape[0]
    return create_block_mask(causal_document, None, None, T, T, device=pos.device, _compile=True)


class Critic(nn.Module):
    """The actor's backbone with a scalar value head: values[t] = V(state after tokens <= t)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)
        # Zero init: every state starts at value 0 (the mean-free baseline), so the first
        # advantages are the rewards themselves and the head learns from there.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, position_ids=position_ids, use_cache=False,
            **attention_kwargs(self.backbone, position_ids),
        ).last_hidden_state  # [1, T, H]
        return self.value_head(hidden)[..., 0].float().clone()  # [1, T] (a fresh tensor, not a view)


def build_actor(cfg: ModelConfig, device: torch.device | str, *, init: bool = True) -> Actor:
    """The actor on `device`, from `cfg.path` or at random from `cfg.hf_config` (seeded). With
    `init=False` a random-config actor's weights are left uninitialised, for a caller that loads
    every one of them next (a checkpoint export: a 1.5B random init costs ~25 s of CPU)."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    kwargs = _load_kwargs(cfg, device)
    if cfg.path is not None:
        lm = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.path), local_files_only=True, **kwargs)
    elif not init:
        with _no_weight_init():
            lm = _random_causal_lm(cfg, kwargs)
    else:
        lm = _random_causal_lm(cfg, kwargs)
    return Actor(lm, cfg.logprob_chunk_tokens, cfg.compile_head, cfg.head_on_actions_only).to(device)


def build_critic(cfg: ModelConfig, device: torch.device | str) -> Critic:
    """The critic on `device`: the actor's backbone (same path or same seeded init), zero value head."""
    from transformers import AutoModel

    quiet_transformers()
    kwargs = _load_kwargs(cfg, device)
    if cfg.path is not None:
        backbone = AutoModel.from_pretrained(resolve_model(cfg.path), local_files_only=True, **kwargs)
    else:
        # The backbone of the same seeded causal LM, so actor and critic start from equal weights
        # as they do when both load one checkpoint.
        backbone = _random_causal_lm(cfg, kwargs).base_model
    return place_model(Critic(backbone), torch.device(device), getattr(torch, cfg.param_dtype))


def place_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """`model` on `device` with its parameters in `dtype`; fp32 buffers stay fp32, as
    `from_pretrained(dtype=...)` leaves them. A plain `model.to(dtype)` would round RoPE's
    `inv_freq` to bf16 too: rotary angles then drift by ~0.1-0.4% of the position (radians at
    position 2,000), and a bf16 engine samples from another policy than the learner's (a
    log-prob gap of 0.5 nats per token on long turns, seen on an H100)."""
    keep = {name: buf for name, buf in model.named_buffers() if buf.dtype == torch.float32}
    model.to(device=device, dtype=dtype)
    for name, buf in keep.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[attr] = buf.to(device)
    return model


def _load_kwargs(cfg: ModelConfig, device: torch.device | str) -> dict[str, Any]:
    attn = cfg.attn_implementation
    if attn == "auto":
        cuda = torch.device(device).type == "cuda"
        attn = (attention.NAME if attention.varlen_available() else "flex_attention") if cuda else "sdpa"
    if attn == attention.NAME:
        attention.register()
    if attn == "flex_attention":
        # Packed lengths vary per micro-batch and grad mode differs between the value pass and
        # training: allow those few variants before dynamo gives up on compiling flex attention.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    return {"attn_implementation": attn, "dtype": getattr(torch, cfg.param_dtype)}


def pretrained_config(hf_config: dict[str, Any]) -> Any:
    """The transformers config of a config dict (its `model_type` picks the class; qwen2 without one)."""
    from transformers import AutoConfig

    fields = dict(hf_config)
    return AutoConfig.for_model(fields.pop("model_type", "qwen2"), **fields)


def _random_causal_lm(cfg: ModelConfig, kwargs: dict[str, Any]) -> nn.Module:
    from transformers import AutoModelForCausalLM

    if cfg.hf_config is None:
        raise ValueError("ModelConfig needs `path` or `hf_config`")
    hf_cfg = pretrained_config(cfg.hf_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return AutoModelForCausalLM.from_config(hf_cfg, **kwargs)


def _no_weight_init():
    """transformers' context that skips parameter initialisation (its module moved in 5.x)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def layers(module: nn.Module) -> list[nn.Module]:
    """The decoder blocks of an Actor, a Critic or an HF model (FSDP2 units, checkpoint units)."""
    if isinstance(module, Actor):
        module = module.lm
    elif isinstance(module, Critic):
        module = module.backbone
    return list(module.base_model.layers)


def hf_model(actor: Actor) -> nn.Module:
    """The wrapped HF causal LM (its state-dict names are the checkpoint's names)."""
    return actor.lm


def count_params(module: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters (distinct tensors once: tied embeddings count once)."""
    params = {id(p): p for p in module.parameters() if p.requires_grad or not trainable_only}
    return sum(p.numel() for p in params.values())


def flops_per_token(hf_config: dict[str, Any], seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of a causal LM: 6 N + 12 L H S.

    N counts every matmul weight a token passes through: the decoder layers and the LM head (the
    embedding lookup is free, tied or not); 12 L H S is the attention score and value matmuls
    over a context of S tokens (PaLM appendix B; no discount for the causal mask).
    """
    c = hf_config
    h, layers_n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    q_dim, kv_dim = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h
    mlp = 3 * h * c["intermediate_size"]
    n = layers_n * (attn + mlp) + vocab * h
    return 6.0 * n + 12.0 * layers_n * q_dim * seq_len


def tiny_qwen2_config(
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_position: int = 4096,
) -> dict[str, Any]:
    """A small Qwen2 config dict for tests, benchmarks and the smoke run."""
    return _qwen2(vocab_size, hidden, layers, heads, kv_heads, intermediate, max_position)


def qwen2_config(size: str, vocab_size: int = 151936) -> dict[str, Any]:
    """The architecture of Qwen2-0.5B or Qwen2-1.5B (random init; for sizing and benchmarks)."""
    shapes = {"0.5b": (896, 24, 14, 2, 4864), "1.5b": (1536, 28, 12, 2, 8960)}
    if size not in shapes:
        raise ValueError(f"unknown Qwen2 size {size!r}; expected one of {sorted(shapes)}")
    hidden, layers_n, heads, kv_heads, intermediate = shapes[size]
    return _qwen2(vocab_size, hidden, layers_n, heads, kv_heads, intermediate, 32768)


def _qwen2(vocab, hidden, layers_n, heads, kv_heads, intermediate, max_position) -> dict[str, Any]:
    return {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers_n,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_position,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    }
