"""An SGLang bundle for the GPU machines that have no package index: download, strip, pack, install.

What it is: the recipe that brings SGLang 0.5.17 onto a machine that already has Python 3.12,
torch 2.11 (CUDA 13), triton and transformers, reaches no package index, and receives at most
64 MiB per call. `download` fetches a fixed list of wheels (`WHEELS`: SGLang, its kernels, and
only those requirements that the server's start-up imports and the machine lacks); `strip`
rewrites them to the Hopper path (`STRIP`) and drops the debug information of their libraries;
`pack` writes one tar in parts with a manifest; `install`, on the GPU machine, checks and joins
the parts and pip-installs the wheels into a target folder next to the machine's torch. It uses
only the standard library, so that `python3 agentcore/sglang/offline.py install ...` runs where
nothing is installed yet (`python -m` also imports agentcore.sglang's client: msgspec, httpx).
What it is not: a resolver. The README's "SGLang on an offline GPU machine" says why each wheel
is kept or left out, and which server flags the stripped build supports.

    python -m agentcore.sglang.offline download .sglang/wheels
    python -m agentcore.sglang.offline strip .sglang/wheels           # -> .sglang/wheels/stripped
    python -m agentcore.sglang.offline pack .sglang/wheels/stripped .sglang/parts
    python -m agentcore.sglang.offline install /tmp/sglang-parts --target /tmp/sglang-site
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PYTHON_VERSION = "3.12"
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(17, 35)),  # pip matches each N exactly; sglang needs 2_34
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
ABIS = ("cp312", "abi3", "none")

WHEELS = (
    # name==version, and the import that needs it (the GPU image has torch, triton, transformers,
    # numpy, requests, aiohttp, uvloop, httpx, anyio, psutil, huggingface-hub, sentencepiece, ...)
    "sglang==0.5.17",  # the server; pins torch==2.11.0
    "sglang-kernel==0.4.5",  # sgl_kernel; PyPI's build links CUDA 13 (libcudart.so.13)
    "flashinfer-python==0.6.15.post1",  # --attention-backend/--sampling-backend flashinfer (JIT, nvcc)
    "apache-tvm-ffi==0.1.11",  # flashinfer.jit.core and xgrammar
    "xgrammar==0.2.1",  # sglang.srt.function_call.inkling_detector, at import even with no grammar
    "torch_memory_saver==0.0.10",  # --enable-memory-saver (release/resume memory occupation)
    "fastapi==0.165.0",  # http_server
    "starlette==1.10.0",  # fastapi; sglang.srt.utils.common
    "uvicorn==0.54.0",  # http_server
    "python-multipart==0.0.34",  # fastapi, for the Form/File parameters of /v1/audio/transcriptions
    "opentelemetry-api==1.45.2",  # fastapi's requirement
    "pydantic==2.14.4",  # openai protocol, io_struct, sglang.utils
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "openai==2.6.1",  # sglang.srt.entrypoints.openai.protocol
    "distro==1.9.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "jsonschema==4.26.0",  # sglang.srt.entrypoints.openai.serving_chat
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "soundfile==0.13.1",  # the OpenAI realtime session, imported by http_server (bundles libsndfile)
    "cffi==2.1.1",  # its _cffi_backend; pycparser only serves building a cffi module
    "pybase64==1.5.1",  # sglang.utils
    "partial-json-parser==0.2.1.1.post7",  # sglang.srt.function_call
    "msgspec==0.22.0",  # io_struct and the ZMQ messages
    "orjson==3.13.0",  # sglang.srt.utils.common
    "pyzmq==27.3.0",  # the IPC between tokenizer, scheduler and detokenizer
    "setproctitle==1.3.8",  # the scheduler and data-parallel processes
    "dill==0.4.1",  # sglang.srt.sampling.custom_logit_processor
    "compressed-tensors==0.20.0",  # sglang.srt.layers.quantization imports every method
    "loguru==0.7.3",
    "gguf==0.19.0",  # sglang.srt.layers.quantization.gguf
    "ipython==9.18.1",  # sglang.utils imports IPython.display, so `import sglang` needs it
    "traitlets==5.16.1",  # IPython; its other requirements serve the shell, which nothing starts
    "transformers==5.12.1",  # sglang's pin; 5.17 (the image's) already registers qwen3_asr
    "tokenizers==0.22.2",  # transformers 5.12.1 wants <=0.23.0; the image has 0.23.2
)

STRIP = {
    # distribution: (path pattern in the wheel, why the Hopper text-generation path does without it)
    "sglang-kernel": (
        ("sgl_kernel/flash_ops.*", "FA3 (--attention-backend fa3); sgl_kernel/__init__ does not load it"),
        ("sgl_kernel/sm100/*", "loaded only on GPUs other than sm90"),
        ("sgl_kernel/flashmla_ops.*", "FlashMLA, MLA models only (DeepSeek); its import is guarded"),
        ("sgl_kernel/infllm_ops*", "InfLLM-v2 sparse attention, loaded on first use"),
    ),
    "sglang": (
        ("sglang/srt/server/_core.*", "the Rust server, only with SGLANG_RUST_SERVER"),
        ("sglang/srt/grpc/_core.*", "the native gRPC server, only with --grpc-port"),
        ("sglang/srt/multimodal/_core.*", "Inkling's Rust image processing (multimodal)"),
        ("sglang/multimodal_gen/*", "diffusion serving (sglang[diffusion])"),
    ),
    "flashinfer-python": (
        ("flashinfer/data/cutlass/examples/*", "CUTLASS examples; the JIT includes cutlass/include, tools/util"),
        ("flashinfer/data/cutlass/python/*", "CUTLASS's Python generator, not used by the JIT"),
        ("flashinfer/data/cutlass/test/*", "CUTLASS's tests"),
    ),
    "xgrammar": (
        ("xgrammar/lib/*", "the static library for C++ builds; Python loads libxgrammar_bindings.so"),
    ),
}

DEBUG_INFO_MIN_BYTES = 1 << 16  # a library that would lose less keeps its original bytes
BUNDLE = "sglang-offline.tar"
MANIFEST = "manifest.json"
STRIP_RECORD = "STRIP.json"
PART_MIB = 22  # a part fits a call's 64 MiB beside the checkout, .device, .corpus and a third of SmolLM2's wheel


class BundleError(Exception):
    """A bundle that cannot be built or installed: a missing or corrupt part, a wrong wheel set."""


def normalise(name: str) -> str:
    """A distribution name as pip compares them: `sglang_kernel` and `sglang-kernel` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(wheel: Path) -> str:
    """The distribution of a wheel file: `sglang_kernel-0.4.5-cp310-abi3-....whl` -> sglang-kernel."""
    return normalise(wheel.name.split("-")[0])


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheels_in(folder: Path) -> dict[str, Path]:
    """One wheel per distribution in `folder`; two versions of one would stop pip's install."""
    found: dict[str, Path] = {}
    for wheel in sorted(folder.glob("*.whl")):
        name = dist_name(wheel)
        if name in found:
            raise BundleError(f"two wheels of {name} in {folder}: {found[name].name}, {wheel.name}")
        found[name] = wheel
    return found


def download(dest: Path) -> list[Path]:
    """pip-download every wheel of `WHEELS` for CPython 3.12 on x86-64 Linux into `dest`, which
    then holds exactly those: wheels of other distributions or versions are removed."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = {normalise(name): version for name, version in (req.split("==") for req in WHEELS)}
    for wheel in dest.glob("*.whl"):
        if pins.get(dist_name(wheel)) != wheel.name.split("-")[1]:
            wheel.unlink()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp", "-d", str(dest)]
    command += [f"--abi={abi}" for abi in ABIS] + [f"--platform={p}" for p in PLATFORMS]
    subprocess.run([*command, *WHEELS], check=True)
    found = wheels_in(dest)
    missing = [req for req in WHEELS if normalise(req.split("==")[0]) not in found]
    if missing:
        raise BundleError(f"pip left out {', '.join(missing)}")
    return list(found.values())


def strip_wheel(src: Path, out: Path, rules: tuple[tuple[str, str], ...]) -> list[dict]:
    """Copy wheel `src` to `out` without the files that `rules` match and without the debug
    information of its shared libraries; RECORD drops their rows and rehashes what changed.
    Returns the changes: one entry per rule that matched (files, bytes) and per library stripped."""
    dropped = {pattern: {"pattern": pattern, "reason": why, "files": 0, "bytes": 0} for pattern, why in rules}
    debug: list[dict] = []
    rows: dict[str, list[str] | None] = {}  # RECORD path -> new row, None to drop it
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(i for i in zin.infolist() if i.filename.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            pattern = next((p for p, _ in rules if fnmatch.fnmatch(info.filename, p)), None)
            if pattern is not None:
                dropped[pattern]["files"] += 1
                dropped[pattern]["bytes"] += info.file_size
                rows[info.filename] = None
                continue
            if info is record:
                continue
            data = zin.read(info)
            if data[:4] == b"\x7fELF" and b".debug_info" in data:
                smaller = _without_debug_info(data)
                if len(data) - len(smaller) >= DEBUG_INFO_MIN_BYTES:
                    debug.append({"path": info.filename, "debug_info_bytes": len(data) - len(smaller)})
                    data = smaller
                    rows[info.filename] = [info.filename, _record_hash(data), str(len(data))]
            zout.writestr(info, data)
        if rows:
            zout.writestr(record, _rewrite_record(zin.read(record), rows))
    return [d for d in dropped.values() if d["files"]] + debug


def _without_debug_info(elf: bytes) -> bytes:
    """`elf` after `objcopy --strip-debug` (binutils): the code and symbols stay, DWARF goes."""
    if shutil.which("objcopy") is None:
        raise BundleError("objcopy not found: strip needs binutils")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(elf)
        f.flush()
        subprocess.run(["objcopy", "--strip-debug", f.name], check=True)
        return Path(f.name).read_bytes()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _rewrite_record(record: bytes, rows: dict[str, list[str] | None]) -> bytes:
    out = []
    for row in csv.reader(io.StringIO(record.decode())):
        if row and row[0] in rows:
            row = rows[row[0]]
        if row:
            out.append(row)
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(out)
    return text.getvalue().encode()


def strip(src: Path, out: Path) -> dict:
    """Write every wheel of `src` to `out`, stripped (`strip_wheel`), with both sha256s in STRIP.json."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    record: dict = {"wheels": []}
    for name, wheel in wheels_in(src).items():
        target = out / wheel.name
        changes = strip_wheel(wheel, target, STRIP.get(name, ()))
        if not changes:
            shutil.copyfile(wheel, target)
        record["wheels"].append({
            "name": wheel.name, "input_sha256": sha256(wheel), "input_size": wheel.stat().st_size,
            "output_sha256": sha256(target), "output_size": target.stat().st_size, "changes": changes,
        })
    (out / STRIP_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


class _PartWriter:
    """A file object that writes a stream into numbered parts of at most `part_bytes` each."""

    def __init__(self, folder: Path, part_bytes: int):
        self.folder, self.part_bytes = folder, part_bytes
        self.parts: list[dict] = []
        self.whole = hashlib.sha256()
        self.size = 0
        self._file = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._file.tell() == self.part_bytes:
                self._next_part()
            room = self.part_bytes - self._file.tell()
            chunk = view[:room]
            self._file.write(chunk)
            self._digest.update(chunk)
            self.whole.update(chunk)
            self.size += len(chunk)
            view = view[room:]
        return len(data)

    def _next_part(self) -> None:
        self._close_part()
        self._file = (self.folder / f"{BUNDLE}.{len(self.parts):03d}").open("wb")
        self._digest = hashlib.sha256()

    def _close_part(self) -> None:
        if self._file is not None:
            self._file.close()
            path = Path(self._file.name)
            self.parts.append({"name": path.name, "size": path.stat().st_size, "sha256": self._digest.hexdigest()})

    def close(self) -> None:
        self._close_part()
        self._file = None


def pack(src: Path, parts_dir: Path, part_bytes: int = PART_MIB << 20) -> dict:
    """Tar the wheels of `src` (and its STRIP.json) into parts of `part_bytes` plus a manifest."""
    wheels = list(wheels_in(src).values())
    if not wheels:
        raise BundleError(f"no wheels in {src}")
    parts_dir.mkdir(parents=True, exist_ok=True)
    for old in [*parts_dir.glob(f"{BUNDLE}.*"), parts_dir / MANIFEST]:
        old.unlink(missing_ok=True)
    members = wheels + [p for p in [src / STRIP_RECORD] if p.exists()]
    writer = _PartWriter(parts_dir, part_bytes)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in members:
            info = tar.gettarinfo(str(path), arcname=path.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
    writer.close()
    manifest = {
        "tar": {"name": BUNDLE, "size": writer.size, "sha256": writer.whole.hexdigest()},
        "parts": writer.parts,
        "wheels": [{"name": w.name, "size": w.stat().st_size, "sha256": sha256(w)} for w in wheels],
    }
    (parts_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check_parts(parts_dir: Path) -> dict:
    """The manifest of `parts_dir`, once every part it names is there with its size and sha256."""
    manifest_path = parts_dir / MANIFEST
    if not manifest_path.exists():
        raise BundleError(f"no {MANIFEST} in {parts_dir}")
    manifest = json.loads(manifest_path.read_text())
    parts = manifest["parts"]
    absent = [p["name"] for p in parts if not (parts_dir / p["name"]).exists()]
    if absent:
        raise BundleError(f"{len(absent)} of {len(parts)} parts missing in {parts_dir}: {', '.join(absent)}")
    for part in parts:
        path = parts_dir / part["name"]
        if path.stat().st_size != part["size"]:
            raise BundleError(f"part {part['name']} is corrupt: {path.stat().st_size} bytes, expected {part['size']}")
        got = sha256(path)
        if got != part["sha256"]:
            raise BundleError(f"part {part['name']} is corrupt: sha256 {got[:12]}, expected {part['sha256'][:12]}")
    return manifest


class _Joined(io.RawIOBase):
    """Files read one after the other as one stream: the parts, joined without a copy on disk."""

    def __init__(self, paths: list[Path]):
        self._paths, self._file = list(paths), None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = self._paths.pop(0).open("rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None


def unpack(parts_dir: Path, dest: Path) -> list[Path]:
    """Check the parts, join them and extract the wheels into `dest`; each wheel's sha256 is checked."""
    manifest = check_parts(parts_dir)
    stream = io.BufferedReader(_Joined([parts_dir / p["name"] for p in manifest["parts"]]), 1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    wheels = []
    for wheel in manifest["wheels"]:
        path = dest / wheel["name"]
        if not path.exists() or sha256(path) != wheel["sha256"]:
            raise BundleError(f"wheel {wheel['name']} missing or corrupt after joining the parts")
        wheels.append(path)
    return wheels


def install(parts_dir: Path, target: Path) -> None:
    """Install the bundle's wheels into `target` with pip, offline and without dependencies."""
    with tempfile.TemporaryDirectory(prefix="sglang-bundle-") as tmp:
        wheels = unpack(parts_dir, Path(tmp))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
             "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)],
            check=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentcore.sglang.offline", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("download", help="pip-download the wheels into DIR").add_argument("dir", type=Path)
    strip_cmd = commands.add_parser("strip", help="write DIR's wheels, stripped, to OUT")
    strip_cmd.add_argument("dir", type=Path)
    strip_cmd.add_argument("--out", type=Path, help="default: DIR/stripped")
    pack_cmd = commands.add_parser("pack", help="tar DIR's wheels into parts in PARTS_DIR")
    pack_cmd.add_argument("dir", type=Path)
    pack_cmd.add_argument("parts_dir", type=Path)
    pack_cmd.add_argument("--part-mib", type=int, default=PART_MIB, help="size of a part in MiB")
    install_cmd = commands.add_parser("install", help="check, join and pip-install the parts")
    install_cmd.add_argument("parts_dir", type=Path)
    install_cmd.add_argument("--target", type=Path, default=Path("/tmp/sglang-site"))
    args = parser.parse_args(argv)
    try:
        if args.command == "download":
            wheels = download(args.dir)
            print(f"{len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB in {args.dir}")
        elif args.command == "strip":
            out = args.out or args.dir / "stripped"
            record = strip(args.dir, out)
            before = sum(w["input_size"] for w in record["wheels"]) / 2**20
            after = sum(w["output_size"] for w in record["wheels"]) / 2**20
            print(f"{len(record['wheels'])} wheels, {before:.1f} -> {after:.1f} MiB in {out}")
        elif args.command == "pack":
            manifest = pack(args.dir, args.parts_dir, args.part_mib << 20)
            print(f"{len(manifest['parts'])} parts, {manifest['tar']['size'] / 2**20:.1f} MiB in {args.parts_dir}")
        else:
            install(args.parts_dir, args.target)
            print(f"PYTHONPATH={args.target.resolve()}")
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
