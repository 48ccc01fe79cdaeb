"""A RemoteNode whose "SSH connection" is this machine's shell, for tests without a VM.

The command lines a RemoteNode sends to a guest (setsid process groups, pidfiles, the deadline
kill, the port probe) then run here, with the same streaming callbacks and deadlines.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from obmm.bench.local import LocalNode
from obmm.testbed.remote import RemoteNode
from obmm.testbed.ssh import Connection, Result


class LocalConnection:
    """Connection-shaped: run() is LocalNode.run with the command as given."""

    def __init__(self) -> None:
        self._shell = LocalNode()
        self.commands: list[str] = []

    def run(self, command: str, **kw: Any) -> Result:
        self.commands.append(command)
        return self._shell.run(command, bare=True, **kw)

    def close(self) -> None:
        pass


class LocalRemoteNode(RemoteNode):
    def __init__(
        self, index: int = 0, env: dict[str, str] | None = None, workdir: str | None = None
    ) -> None:
        super().__init__(index, f"node{index}", addr="127.0.0.1", env=env)
        if workdir is not None:
            self.workdir = PurePosixPath(workdir)
        self.conn = LocalConnection()

    def connect(self, timeout: float | None = None, *, node_only: bool = True) -> Connection:
        return self.conn  # type: ignore[return-value]
