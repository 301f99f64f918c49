"""A small Qwen2.5-style tokenizer built locally, for tests and the smoke run's tiny model.

What it is: `build_tiny_tokenizer(out_dir)` trains a byte-level BPE (about 1,800 tokens) on a
built-in corpus of English, Python/CUDA code and tool-call JSON, wraps it in a
`PreTrainedTokenizerFast` with Qwen's special tokens and a Qwen2.5-style chat template that lists
tools in `<tools></tools>` and wraps tool results as user turns in `<tool_response>`, and saves it
with `save_pretrained`. The build is deterministic and cached under a hash of everything that goes
into it, so a repeat call returns at once. `load_tokenizer(path)` reads a local directory only,
without importing torch.

What it is not: a tokenizer for a real model; nothing here downloads anything.

How it is used:
    path = build_tiny_tokenizer(tmp_dir)
    tokenizer = load_tokenizer(path)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
VOCAB_SIZE = 4096

# Qwen2's pre-tokenizer split: contractions, letters, single digits, punctuation runs, newlines.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's template (Qwen/Qwen2.5-7B-Instruct), with a neutral default system prompt.
CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

_ENGLISH = """\
You are an expert in writing fast CUDA kernels. Read the reference model, profile it, then write
a faster implementation. The goal is to be at least five percent faster than torch.compile while
producing the same outputs. Compile the kernels, verify correctness on fresh random inputs, and
profile against eager PyTorch. If the kernel fails to compile, read the error log and fix the
code. When the result is correct and fast, call finish with a short summary of what you did.
The workspace contains model.py, which you must not change, and the kernels directory where
your CUDA sources live. Each kernel has a launcher and a binding that registers it with Python.
Memory coalescing, shared memory tiling, warp shuffles and vectorized loads make kernels fast.
Avoid bank conflicts, keep occupancy high, fuse elementwise operations into one pass, and reduce
the number of launches. Check every index against the bounds before reading or writing memory.
The user asked a question about the tensor shapes. The answer is that the batch size is sixteen
and the hidden dimension is four thousand and ninety six. Let me check the file first.
I will read the file, then edit the kernel and compile it again. The verification passed.
The profile shows the candidate takes 0.42 ms, eager takes 1.31 ms and compile takes 0.97 ms.
"""

_PYTHON = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    """Performs a matrix multiplication followed by a ReLU and a scaling."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = torch.relu(x)
        return x * self.scale


batch_size = 128
in_features = 1024
out_features = 512


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, 0.5]


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return cuda_ext.fused_linear_relu_scale(x, self.linear.weight, self.linear.bias, self.scale)
'''

_CUDA = """\
#include <cuda_runtime.h>

__global__ void relu_scale_kernel(const float* __restrict__ x, float* __restrict__ y,
                                  float scale, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        float v = x[idx];
        y[idx] = v > 0.0f ? v * scale : 0.0f;
    }
}

__global__ void row_sum_kernel(const float* x, float* out, int rows, int cols) {
    extern __shared__ float smem[];
    int row = blockIdx.x;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        acc += x[row * cols + c];
    }
    smem[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = smem[0];
}

extern "C" void launch_relu_scale(const float* x, float* y, float scale, int n, cudaStream_t stream) {
    int threads = 256;
    int blocks = (n + threads - 1) / threads;
    relu_scale_kernel<<<blocks, threads, 0, stream>>>(x, y, scale, n);
}
"""

_TOOL_TEXT = """\
<tool_call>
{"name": "read_file", "arguments": {"path": "model.py"}}
</tool_call>
<tool_call>
{"name": "bash", "arguments": {"command": "nvidia-smi && ls kernels", "timeout_s": 30.0}}
</tool_call>
<tool_call>
{"name": "edit_file", "arguments": {"path": "kernels/relu.cu", "edits": [{"old_string": "int threads = 128;", "new_string": "int threads = 256;", "replace_all": false}]}}
</tool_call>
<tool_call>
{"name": "compile", "arguments": {}}
</tool_call>
<tool_response>
{"kind": "compile", "ok": true, "log": "built 2 units", "seconds": 1.2}
</tool_response>
<tool_response>
{"kind": "verify", "ok": false, "message": "max abs error 0.37 exceeds tolerance", "trials": 5}
</tool_response>
<tool_call>
<function=write_file>
<parameter=path>
model_new.py
</parameter>
<parameter=content>
import torch
</parameter>
</function>
</tool_call>
"""

_MORE_ENGLISH = """\
A kernel is a function that runs on the graphics processor across many threads at once. Threads
are grouped into blocks, and blocks into a grid; each block runs on one streaming multiprocessor.
Global memory is large but slow, shared memory is small but fast, and registers are private to a
thread. Reading neighbouring addresses from neighbouring threads lets the hardware combine the
requests. Reductions usually proceed in a tree: every step halves the active threads until one
value remains. Softmax needs the maximum of each row for numerical stability, then the sum of the
exponentials, then a division. Layer normalization computes a mean and a variance per row, and a
convolution slides a small filter over an image. Matrix multiplication dominates the running time
of most networks, so tensor cores, double buffering and careful tiling matter a great deal.
Before optimizing anything, measure: profile the reference, find the slowest operator, and start
there. After every change, compile, verify and profile again, because a faster wrong answer is
worth nothing. Keep notes of what helped and what did not; remove unused files before finishing.
Questions, answers, explanations and summaries are written in plain English sentences, with
numbers, units such as milliseconds and gigabytes, and names like float, half, int, bool or void.
"""

_OPS = ("relu", "gelu", "softmax", "layer_norm", "matmul", "conv2d", "max_pool", "sigmoid", "tanh",
        "batch_norm", "log_softmax", "cross_entropy", "mean", "argmax", "cumsum", "transpose",
        "group_norm", "avg_pool", "hardswish", "mish", "leaky_relu", "dropout", "embedding")
_TOOLS = ("bash", "read_file", "write_file", "edit_file", "glob", "grep", "compile", "verify", "profile", "finish")
_API = """\
torch.empty_like torch.zeros torch.ones torch.randn torch.rand torch.cat torch.stack torch.matmul
torch.bmm torch.einsum torch.softmax torch.sigmoid torch.tanh torch.exp torch.log torch.sqrt
torch.clamp torch.where torch.allclose torch.testing.assert_close torch.cuda.synchronize
torch.cuda.Event torch.compile torch.no_grad torch.float32 torch.float16 torch.bfloat16
tensor.contiguous tensor.view tensor.reshape tensor.permute tensor.size tensor.numel tensor.stride
tensor.data_ptr tensor.device tensor.dtype nn.Conv2d nn.Linear nn.LayerNorm nn.BatchNorm2d
nn.ReLU nn.GELU nn.Dropout nn.Module nn.Parameter F.relu F.gelu F.softmax F.conv2d F.linear
cudaMalloc cudaFree cudaMemcpy cudaMemcpyAsync cudaStreamSynchronize cudaDeviceSynchronize
cudaGetLastError cudaGetErrorString cudaStream_t cudaError_t __syncthreads __shfl_down_sync
__shfl_xor_sync __ldg __expf __fdividef __launch_bounds__ __device__ __host__ __forceinline__
atomicAdd atomicMax blockIdx threadIdx blockDim gridDim warpSize float4 half2 dim3 size_t
cublasSgemm cublasGemmEx cudnnConvolutionForward PYBIND11_MODULE pybind11 m.def TORCH_CHECK
at::Tensor torch::Tensor data_ptr<float> numel() is_cuda() is_contiguous() scalar_type()
def class return import from if elif else for while try except finally with as lambda yield
async await assert raise pass break continue global nonlocal True False None self super
print len range enumerate zip sorted reversed isinstance getattr setattr dict list tuple set
"""
_SUFFIXES = ("kernel", "forward", "launcher", "binding")
_DTYPES = ("float", "half", "__nv_bfloat16", "double", "int", "int64_t")
_COMMANDS = ("ls -la kernels", "cat model.py", "nvcc --version", "python -c 'import torch'",
             "grep -rn __global__ kernels", "wc -l model_new.py", "rm kernels/old.cu", "nvidia-smi")


def corpus() -> list[str]:
    """The training text: fixed samples plus deterministic variations on ops, types and tools."""
    texts = [_ENGLISH, _MORE_ENGLISH, _API, _PYTHON, _CUDA, _TOOL_TEXT]
    for i, op in enumerate(_OPS):
        dtype = _DTYPES[i % len(_DTYPES)]
        texts.append(" ".join(f"{op}_{part}" for part in _SUFFIXES))
        texts.append(_CUDA.replace("relu_scale", f"{op}_fused").replace("float", dtype))
        texts.append(_PYTHON.replace("relu", op).replace("128", str(16 * (i + 1))))
        texts.append(f"Let me write a {op} kernel for {dtype} inputs. The {op} is computed per element.\n")
    for i, tool in enumerate(_TOOLS):
        command = _COMMANDS[i % len(_COMMANDS)]
        texts.append(f'<tool_call>\n{{"name": "{tool}", "arguments": {{}}}}\n</tool_call>\n')
        texts.append(f"<tool_call>\n<function={tool}>\n</function>\n</tool_call>\n")
        texts.append(f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{command}"}}}}\n</tool_call>\n')
    return texts


def _build_hash() -> str:
    import tokenizers

    spec = [tokenizers.__version__, str(VOCAB_SIZE), SPLIT_PATTERN, CHAT_TEMPLATE]
    spec += [*SPECIAL_TOKENS, *ADDED_TOKENS, *corpus()]
    return hashlib.sha256("\x00".join(spec).encode()).hexdigest()[:16]


def _train() -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )


def build_tiny_tokenizer(out_dir: str | os.PathLike[str]) -> Path:
    """Build (or find, by content hash) the tiny tokenizer under `out_dir`; return its directory."""
    out_dir = Path(out_dir)
    path = out_dir / f"tiny-tokenizer-{_build_hash()}"
    if (path / "tokenizer.json").exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-tokenizer-", dir=out_dir))
    _wrap(_train()).save_pretrained(staging)
    try:
        os.replace(staging, path)  # atomic: concurrent builders never see a half-written dir
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process got there first
    return path


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A tokenizer from a local directory; never touches the network.

    A directory with `tokenizer.json` loads through the fast-tokenizer class itself: in
    transformers 5 `AutoTokenizer` imports torch (configuration_utils -> modeling_rope_utils),
    and agentcore stays free of torch. Other directories fall back to `AutoTokenizer`.
    """
    if (Path(path) / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
