"""A new user's virtualenv, made cheaply: `python -m venv --without-pip` plus a .pth file that
points at this interpreter's sys.path, so it imports what the tests import and installs nothing.
Placed under /tmp it shows what the sandboxes (each with a /tmp of its own) do with such a venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def make_venv(root: Path) -> Path:
    """A virtualenv at `root/venv`; returns its python."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "parent_env.pth").write_text("\n".join(p for p in sys.path if p and os.path.isdir(p)) + "\n")
    return python
