"""Loads a linked workspace module as `cuda_extension`, by path, in the GPU worker.

What: `load_extension(so_path)` imports torch first (the module's Tensor arguments need torch's
Python types registered, and its torch libraries resolve against the ones torch loaded), then
loads the file through importlib under the name `cuda_extension` and registers it in
`sys.modules`, so the candidate's `import cuda_extension` gets exactly this file.
What not: it does not build (`rewards.build.compile_pool` does), check or sandbox anything, and it
cannot unload: a process loads one candidate's module (the GPU worker forks per job).
How used:
    module = load_extension(artifact.so_path)     # the trusted cache copy, not the workspace's
    y = module.relu_forward(x)
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

MODULE_NAME = "cuda_extension"


def load_extension(so_path: str | Path, name: str = MODULE_NAME, *, register: bool = True) -> ModuleType:
    """Import the extension module at `so_path` as `name`; raises ImportError if it cannot load.

    A module of the same name already in `sys.modules` from another file is an error: the
    dynamic loader would hand back the first file's code under the second one's name.
    """
    import torch  # noqa: F401  (must be imported before the extension)

    path = Path(so_path).resolve()
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ImportError(f"{name} is already loaded from {loaded.__file__}; load {path} in a fresh process")
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if register:
        sys.modules[name] = module
    return module
