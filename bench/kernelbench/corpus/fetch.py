"""Rebuild the third-party solution corpus (`.corpus/`) from local git mirrors, checking sha256.

What it is: `manifest.jsonl` names, per solution file, the repository, commit and path it comes
from (and, for a solution stored as a string inside a JSON file, the JSON pointer to it) with the
sha256 of its bytes. `python bench/kernelbench/corpus/fetch.py --mirrors DIR` reads each one out
of a git clone under DIR, checks its sha256 and writes it to `.corpus/<file>`; what it cannot find
(no clone, no such commit or path, other bytes) it lists, with the clone command to run.
`--check` only verifies the files already in `.corpus/`.
What it is not: a downloader (it never touches the network) or part of the package: the corpus
is third-party code and stays out of the repository (`/.corpus/` is git-ignored locally).

Example:
    python bench/kernelbench/corpus/fetch.py --mirrors ~/mirrors
    cuda-agent bench --replay .corpus/cuda-l1/h100 --out runs/corpus-cuda-l1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import msgspec
from msgspec import Struct

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.jsonl"
ROOT = HERE.parents[2]


class Entry(Struct, frozen=True, kw_only=True):
    """One manifest row: where a solution file comes from and what the source says of it."""

    source: str
    set: str
    """The solution set (one file per problem): `.corpus/<source>/<set>/` is one `--replay` path."""
    repo: str
    """owner/name on GitHub."""
    commit: str
    path: str
    json_pointer: str | None = None
    """RFC 6901 pointer to the code string when `path` is a JSON file (JSON Lines: a list of rows)."""
    sha256: str
    level: int
    problem_id: int
    name: str
    """Our KernelBench problem name (rl/data/kernelbench/problems.jsonl)."""
    file: str
    """Path under .corpus/."""
    verdict: str
    """The source's own word: correct, incorrect, hack, or unknown."""
    speedup: float | None = None
    speedup_vs: str | None = None
    source_problem: str | None = None
    """The source's problem name, where it differs from ours."""
    reference: str | None = None
    """Source's reference vs ours: same, sizes (Model class same, sizes differ), changed; null if it ships none."""
    note: str | None = None


def read_manifest(path: Path = MANIFEST) -> list[Entry]:
    decode = msgspec.json.Decoder(Entry).decode
    return [decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def find_git_dir(repo: str, mirrors: list[Path]) -> Path | None:
    """The first clone of `repo` under a mirrors folder: owner+name/repo, owner+name, owner/name, name."""
    owner, name = repo.split("/")
    for base in mirrors:
        for cand in (base / f"{owner}+{name}" / "repo", base / f"{owner}+{name}", base / owner / name, base / name):
            for git_dir in (cand / ".git", cand):
                if (git_dir / "HEAD").is_file() and (git_dir / "objects").is_dir():
                    return git_dir
    return None


def read_blob(git_dir: Path, commit: str, path: str) -> bytes | None:
    done = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "blob", f"{commit}:{path}"],
                          check=False, capture_output=True)
    return done.stdout if done.returncode == 0 else None


def resolve_pointer(data: bytes, pointer: str) -> bytes:
    """The string at `pointer` in a JSON document, or in a JSON Lines file read as a list of rows."""
    try:
        node = json.loads(data)
    except json.JSONDecodeError:
        node = [json.loads(line) for line in data.splitlines() if line.strip()]
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    if not isinstance(node, str):
        raise TypeError(f"{pointer} is not a string")
    return node.encode()


def solution_bytes(entry: Entry, git_dir: Path) -> bytes | None:
    data = read_blob(git_dir, entry.commit, entry.path)
    if data is None or entry.json_pointer is None:
        return data
    try:
        return resolve_pointer(data, entry.json_pointer)
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rebuild(entries: list[Entry], mirrors: list[Path], out: Path) -> list[str]:
    """Write every entry's file under `out`; the problems, one line each."""
    problems = []
    for e in entries:
        target = out / e.file
        if target.is_file() and sha256(target.read_bytes()) == e.sha256:
            continue
        git_dir = find_git_dir(e.repo, mirrors)
        if git_dir is None:
            problems.append(f"{e.file}: no clone of {e.repo} (git clone --mirror "
                            f"https://github.com/{e.repo} MIRRORS/{e.repo.replace('/', '+')}/repo)")
            continue
        data = solution_bytes(e, git_dir)
        if data is None:
            where = e.path + (f" {e.json_pointer}" if e.json_pointer else "")
            problems.append(f"{e.file}: {e.repo}@{e.commit[:12]} has no {where} (fetch that commit)")
        elif sha256(data) != e.sha256:
            problems.append(f"{e.file}: sha256 {sha256(data)[:12]}, manifest {e.sha256[:12]}")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return problems


def check(entries: list[Entry], out: Path) -> list[str]:
    problems = []
    for e in entries:
        target = out / e.file
        if not target.is_file():
            problems.append(f"{e.file}: missing")
        elif sha256(target.read_bytes()) != e.sha256:
            problems.append(f"{e.file}: sha256 differs from the manifest")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    p.add_argument("--out", type=Path, default=ROOT / ".corpus", help="corpus folder (default: .corpus/)")
    p.add_argument("--mirrors", type=Path, action="append", default=[],
                   help="folder of git clones: owner+name/repo, owner+name, owner/name or name (repeatable)")
    p.add_argument("--only", default="", help="only this source, or source/set")
    p.add_argument("--check", action="store_true", help="only verify the files already in --out")
    a = p.parse_args(argv)
    entries = [e for e in read_manifest(a.manifest)
               if not a.only or a.only in (e.source, f"{e.source}/{e.set}")]
    if not a.check and not a.mirrors:
        p.error("--mirrors DIR is needed to rebuild (or pass --check)")
    problems = check(entries, a.out) if a.check else rebuild(entries, a.mirrors, a.out)
    for line in problems:
        print(line)
    print(f"{len(entries) - len(problems)}/{len(entries)} files in {a.out} match the manifest")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
