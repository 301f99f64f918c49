"""Per-trajectory tools: a fresh workspace, the shared sandbox and kernel environment, a ToolBox.

What it is: the orchestrator's default `ToolsFactory`. `open(task, trajectory_id)` creates the
trajectory's workspace under `root`, yields a ToolBox bound to it, and on exit (shielded, also
on cancellation) removes the workspace unless `keep_workspaces`.
What it is not: the tools (tools.py) or the final scoring (rewards), which receives the ToolBox
and reads `toolbox.workspace`.

Example:
    factory = WorkspaceTools(root=run_dir / "workspaces", sandbox=Sandbox(), kernel_env=env)
    async with factory.open(task, "task-1/0/abcd") as tools:
        result = await tools.run(ReadFile(path="model.py"))
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import anyio

from agentcore.kernel_env import KernelEnv
from agentcore.sandbox import Sandbox
from agentcore.tools import ToolBox, ToolBoxConfig
from agentcore.types import Task
from agentcore.workspace import Workspace


class WorkspaceTools:
    def __init__(
        self,
        *,
        root: str | Path,
        sandbox: Sandbox,
        kernel_env: KernelEnv,
        config: ToolBoxConfig = ToolBoxConfig(),
        keep_workspaces: bool = False,
    ):
        self.root, self.sandbox, self.kernel_env = Path(root), sandbox, kernel_env
        self.config, self.keep_workspaces = config, keep_workspaces

    @asynccontextmanager
    async def open(self, task: Task, trajectory_id: str) -> AsyncIterator[ToolBox]:
        workspace = await Workspace.create(
            task, self.root, name=trajectory_id.replace("/", "_"), owner_uid=self.sandbox.run_uid
        )
        try:
            yield ToolBox(workspace, self.sandbox, self.kernel_env, task, self.config)
        finally:
            if not self.keep_workspaces:
                with anyio.CancelScope(shield=True):
                    await workspace.cleanup()
