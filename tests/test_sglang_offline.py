"""The offline SGLang bundle on small wheels built here: strip, pack into parts, install with pip."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import random
import zipfile
from pathlib import Path

import pytest

from agentcore.sglang import offline


def record_row(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


BLOB = random.Random(0).randbytes(100_000)  # incompressible: the wheel stays about 100 kB


def make_wheel(folder: Path, name: str, files: dict[str, bytes], version: str = "1.0") -> Path:
    """A minimal pure-Python wheel pip installs: the files, METADATA, WHEEL and a RECORD of them."""
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(record_row(p, d) for p, d in files.items()), f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(path, data)
    return wheel


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """Two wheels, one with incompressible data so that a small part size gives several parts."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "alpha", {"alpha/__init__.py": b"VALUE = 1\n", "alpha/blob.bin": BLOB})
    make_wheel(folder, "beta", {"beta/__init__.py": b"import alpha\nVALUE = alpha.VALUE + 1\n"})
    return folder


def test_pack_writes_parts_no_larger_than_asked_and_a_manifest_of_their_hashes(wheels, tmp_path):
    manifest = offline.pack(wheels, tmp_path / "parts", part_bytes=40_000)
    parts = sorted((tmp_path / "parts").glob(f"{offline.BUNDLE}.*"))
    assert len(parts) == len(manifest["parts"]) > 1
    assert all(p.stat().st_size <= 40_000 for p in parts)
    assert [p.name for p in parts] == [p["name"] for p in manifest["parts"]]
    assert all(offline.sha256(p) == entry["sha256"] for p, entry in zip(parts, manifest["parts"]))
    assert sum(p.stat().st_size for p in parts) == manifest["tar"]["size"]
    assert json.loads((tmp_path / "parts" / offline.MANIFEST).read_text()) == manifest
    assert {w["name"] for w in manifest["wheels"]} == {w.name for w in wheels.glob("*.whl")}


def test_install_joins_the_parts_and_pip_installs_the_wheels_into_the_target(wheels, tmp_path, capsys):
    offline.pack(wheels, tmp_path / "parts", part_bytes=40_000)
    target = tmp_path / "site"
    assert offline.main(["install", str(tmp_path / "parts"), "--target", str(target)]) == 0
    assert (target / "beta" / "__init__.py").read_bytes().startswith(b"import alpha")
    assert (target / "alpha" / "blob.bin").read_bytes() == BLOB
    assert capsys.readouterr().out.strip() == f"PYTHONPATH={target.resolve()}"


def test_a_missing_part_is_a_one_line_error_naming_it(wheels, tmp_path, capsys):
    manifest = offline.pack(wheels, tmp_path / "parts", part_bytes=40_000)
    last = manifest["parts"][-1]["name"]
    (tmp_path / "parts" / last).unlink()
    assert offline.main(["install", str(tmp_path / "parts"), "--target", str(tmp_path / "site")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and last in err and "missing" in err
    assert not (tmp_path / "site").exists()


def test_a_part_whose_sha256_differs_is_a_one_line_error_naming_it(wheels, tmp_path, capsys):
    manifest = offline.pack(wheels, tmp_path / "parts", part_bytes=40_000)
    first = tmp_path / "parts" / manifest["parts"][0]["name"]
    data = bytearray(first.read_bytes())
    data[1000] ^= 0xFF
    first.write_bytes(bytes(data))
    assert offline.main(["install", str(tmp_path / "parts"), "--target", str(tmp_path / "site")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and first.name in err and "sha256" in err


def test_a_truncated_part_is_reported_by_its_size(wheels, tmp_path):
    manifest = offline.pack(wheels, tmp_path / "parts", part_bytes=40_000)
    first = tmp_path / "parts" / manifest["parts"][0]["name"]
    first.write_bytes(first.read_bytes()[:-10])
    with pytest.raises(offline.BundleError, match="bytes, expected"):
        offline.check_parts(tmp_path / "parts")


def test_pack_replaces_the_parts_of_an_earlier_bundle(wheels, tmp_path):
    offline.pack(wheels, tmp_path / "parts", part_bytes=20_000)
    manifest = offline.pack(wheels, tmp_path / "parts", part_bytes=1 << 20)
    assert len(manifest["parts"]) == 1
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [offline.MANIFEST, f"{offline.BUNDLE}.000"]


def test_strip_drops_matching_files_and_their_record_rows(tmp_path):
    make_wheel(tmp_path, "gamma", {"gamma/__init__.py": b"", "gamma/sm100/ops.so": b"x" * 100, "gamma/keep.py": b""})
    out = tmp_path / "out"
    out.mkdir()
    changes = offline.strip_wheel(tmp_path / "gamma-1.0-py3-none-any.whl", out / "gamma.whl", (("gamma/sm100/*", "why"),))
    assert changes == [{"pattern": "gamma/sm100/*", "reason": "why", "files": 1, "bytes": 100}]
    with zipfile.ZipFile(out / "gamma.whl") as z:
        assert "gamma/sm100/ops.so" not in z.namelist() and "gamma/keep.py" in z.namelist()
        rows = list(csv.reader(io.StringIO(z.read("gamma-1.0.dist-info/RECORD").decode())))
    assert [r[0] for r in rows if r[0].startswith("gamma/")] == ["gamma/__init__.py", "gamma/keep.py"]


def test_strip_records_the_sha256_of_every_input_and_output(wheels, tmp_path):
    record = offline.strip(wheels, tmp_path / "stripped")
    assert json.loads((tmp_path / "stripped" / offline.STRIP_RECORD).read_text()) == record
    for entry in record["wheels"]:
        assert entry["input_sha256"] == offline.sha256(wheels / entry["name"])
        assert entry["output_sha256"] == offline.sha256(tmp_path / "stripped" / entry["name"])
        assert entry["changes"] == [] and entry["input_sha256"] == entry["output_sha256"]


def test_two_versions_of_one_distribution_are_refused(wheels):
    make_wheel(wheels, "alpha", {"alpha/__init__.py": b""}, version="2.0")
    with pytest.raises(offline.BundleError, match="two wheels of alpha"):
        offline.wheels_in(wheels)


def test_every_pin_names_one_version_and_every_strip_rule_a_pinned_distribution():
    names = [offline.normalise(req.split("==")[0]) for req in offline.WHEELS]
    assert all(req.count("==") == 1 for req in offline.WHEELS)
    assert len(names) == len(set(names))
    assert set(offline.STRIP) <= set(names)
