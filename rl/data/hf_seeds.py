"""Transformers-module seeds: modules of Hugging Face transformers, inlined as plain torch.

What it is: `hf_table()`, seed operators (`seeds.SeedOp`) whose code is the math of a
transformers class (RMSNorms, gated and GPT-2 MLPs, the GELU variants of
`transformers.activations`, rotary embedding, Llama eager attention) rewritten as a small
`nn.Module` in the seed's `preamble`, so a rendered task is self-contained KernelBench code: the
verify worker needs no transformers, at no particular version. `origin` names the class each one
follows (the task's provenance); `tests/test_synth_hf_seeds.py` checks every one against the
installed transformers class built from a tiny config. They chain with the torch seeds in
`compose.py` like any other op (input dim 0 is a pure batch dim, the last dim the hidden size).
The CUDA Agent paper's seeds came from torch operators and transformers modules (its data
synthesis section).

What it is not: an import of transformers (nothing here needs it), or a copy of whole models:
dropout is left out (p=0: the filters reject stochastic tasks) and so are caches and masks
beyond the causal one.

Example:
    op = next(op for op in hf_table() if op.name == "transformers.LlamaMLP")
    seeds.seed_task(op, scale=0.02).source   # defines LlamaMLP, then Model using it
"""

from __future__ import annotations

from rl.data.seeds import SeedOp, Shape

HF_START: dict[int, Shape] = {3: (16, 1024, 2048)}
"""Chains starting with a transformers seed at rank 3 take [batch, tokens, hidden] states."""

MAX_MLP_HIDDEN = 4096
"""MLP/attention seeds only on a hidden size this small (their weights grow as hidden**2)."""

LLAMA = "transformers.models.llama.modeling_llama"

ROTATE_HALF = '''
def rotate_half(x):
    """Rotates half the hidden dims of the input (transformers' Llama rotate_half)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
'''

REPEAT_KV = '''
def repeat_kv(hidden_states, n_rep):
    """[batch, kv_heads, seq, head_dim] -> [batch, kv_heads * n_rep, seq, head_dim] (Llama repeat_kv)."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
'''

ROPE_COS_SIN = '''
def rope_cos_sin(inv_freq, seq_len, device):
    """Default RoPE tables for positions 0..seq_len-1 (LlamaRotaryEmbedding): cos, sin [seq, dim]."""
    position = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(position, inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
'''

LLAMA_RMSNORM = '''
class LlamaRMSNorm(nn.Module):
    """transformers LlamaRMSNorm (equivalent to T5LayerNorm), inlined."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
'''

GEMMA_RMSNORM = '''
class GemmaRMSNorm(nn.Module):
    """transformers GemmaRMSNorm, inlined: scales by (1 + weight), weight starting at zero."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        output = x.float()
        output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + self.eps)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)
'''

LLAMA_MLP = '''
class LlamaMLP(nn.Module):
    """transformers LlamaMLP (hidden_act "silu", no bias), inlined: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''

GPT2_MLP = '''
class GPT2MLP(nn.Module):
    """transformers GPT2MLP, inlined: Conv1D (x @ W + b, W [in, out]), gelu_new, Conv1D; no dropout."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.c_fc_weight = nn.Parameter(torch.randn(hidden_size, intermediate_size) * 0.02)
        self.c_fc_bias = nn.Parameter(torch.zeros(intermediate_size))
        self.c_proj_weight = nn.Parameter(torch.randn(intermediate_size, hidden_size) * 0.02)
        self.c_proj_bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x):
        shape = x.shape
        h = torch.addmm(self.c_fc_bias, x.reshape(-1, shape[-1]), self.c_fc_weight)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        h = torch.addmm(self.c_proj_bias, h, self.c_proj_weight)
        return h.view(shape)
'''

LLAMA_ROTARY = '''
class LlamaRotaryApply(nn.Module):
    """transformers LlamaRotaryEmbedding (default rope) + apply_rotary_pos_emb on one tensor, inlined:
    x [..., seq, head_dim] rotated by position 0..seq-1."""

    def __init__(self, head_dim, rope_theta=10000.0):
        super().__init__()
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        cos, sin = rope_cos_sin(self.inv_freq, x.shape[-2], x.device)
        return (x * cos) + (rotate_half(x) * sin)
'''

LLAMA_ATTENTION = '''
class LlamaAttention(nn.Module):
    """transformers LlamaAttention, inlined: q/k/v/o projections (no bias), default RoPE, grouped
    key/value heads, eager causal softmax attention; hidden states [batch, seq, hidden].
    Heads of 64 dims (one head below 64), a key/value head per 4 query heads where they divide."""

    def __init__(self, hidden_size, rope_theta=10000.0):
        super().__init__()
        num_heads = max(1, hidden_size // 64)
        num_kv_heads = num_heads // 4 if num_heads % 4 == 0 else num_heads
        self.head_dim = hidden_size // num_heads
        self.num_key_value_groups = num_heads // num_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden_states):
        batch, seq_len, _ = hidden_states.shape
        hidden_shape = (batch, seq_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = rope_cos_sin(self.inv_freq, seq_len, hidden_states.device)
        query = (query * cos) + (rotate_half(query) * sin)
        key = (key * cos) + (rotate_half(key) * sin)
        key = repeat_kv(key, self.num_key_value_groups)
        value = repeat_kv(value, self.num_key_value_groups)
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        causal = torch.full((seq_len, seq_len), float("-inf"), device=hidden_states.device).triu(1)
        attn_weights = F.softmax(attn_weights + causal, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
        return self.o_proj(attn_output.reshape(batch, seq_len, -1))
'''

ACTIVATIONS: dict[str, str] = {
    "NewGELUActivation": "0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))",
    "FastGELUActivation": "0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))",
    "QuickGELUActivation": "input * torch.sigmoid(1.702 * input)",
    "AccurateGELUActivation": "0.5 * input * (1 + torch.tanh(math.sqrt(2 / math.pi) * (input + 0.044715 * torch.pow(input, 3))))",
    "LaplaceActivation": "0.5 * (1.0 + torch.erf((input - 0.707107).div(0.282095 * math.sqrt(2.0))))",
    "ReLUSquaredActivation": "torch.square(F.relu(input))",
}
"""transformers.activations classes (forward bodies, constants folded in), by class name."""


def _activation(name: str, body: str) -> str:
    return (f"\nclass {name}(nn.Module):\n    \"\"\"transformers.activations.{name}, inlined.\"\"\"\n\n"
            f"    def forward(self, input):\n        return {body}\n")


def _hidden_at_most(n: int, multiple: int = 8):
    return lambda shape: shape[-1] <= n and shape[-1] % multiple == 0


def _attention_fits(shape: Shape) -> bool:
    """Whole 64-dim heads (or one small head), and a [seq, seq] score matrix per head that fits."""
    hidden = shape[-1]
    return hidden % 8 == 0 and (hidden <= 64 or hidden % 64 == 0) and hidden <= MAX_MLP_HIDDEN and shape[1] <= 4096


def hf_table() -> list[SeedOp]:
    """The transformers-module seeds (see the module docstring)."""
    def op(name, family, template, ranks, preamble, origin, fits=lambda shape: True):
        return SeedOp(name=f"transformers.{name}", family=family, template=template, ranks=ranks, fits=fits,
                      preamble=preamble, origin=origin, start=HF_START)

    ops = [
        op("LlamaRMSNorm", "norm", "LlamaRMSNorm({L})", (2, 3, 4), (LLAMA_RMSNORM,), f"{LLAMA}.LlamaRMSNorm",
           _hidden_at_most(16384)),
        op("GemmaRMSNorm", "norm", "GemmaRMSNorm({L})", (2, 3, 4), (GEMMA_RMSNORM,),
           "transformers.models.gemma.modeling_gemma.GemmaRMSNorm", _hidden_at_most(16384)),
        op("LlamaMLP", "mlp", "LlamaMLP({L}, {L} * 2)", (2, 3), (LLAMA_MLP,), f"{LLAMA}.LlamaMLP",
           _hidden_at_most(MAX_MLP_HIDDEN)),
        op("GPT2MLP", "mlp", "GPT2MLP({L}, {L} * 4)", (2, 3), (GPT2_MLP,),
           "transformers.models.gpt2.modeling_gpt2.GPT2MLP", _hidden_at_most(MAX_MLP_HIDDEN)),
        op("LlamaRotaryEmbedding", "rotary", "LlamaRotaryApply({L})", (3, 4), (ROTATE_HALF, ROPE_COS_SIN, LLAMA_ROTARY),
           f"{LLAMA}.LlamaRotaryEmbedding+apply_rotary_pos_emb", _hidden_at_most(16384, multiple=2)),
        op("LlamaAttention", "attention", "LlamaAttention({L})", (3,),
           (ROTATE_HALF, REPEAT_KV, ROPE_COS_SIN, LLAMA_ATTENTION), f"{LLAMA}.LlamaAttention", _attention_fits),
    ]
    ops += [op(name, "activation", f"{name}()", (2, 3, 4, 5), (_activation(name, body),), f"transformers.activations.{name}")
            for name, body in ACTIVATIONS.items()]
    return ops
