"""The one interface of a node, whether a QEMU guest, a real UB host or the local machine.

Every front end and harness is written against :class:`Node`: the guest and cluster suites,
`obmm-testbed run`, the pytest plugin, the kernel-log guard, the bench and the hardware stage.
:class:`obmm.testbed.remote.RemoteNode` implements it over SSH (QEMU guests:
:class:`obmm.testbed.session.GuestNode`; UB hosts: :class:`obmm.testbed.hw.stage.HostNode`);
the bench's local mode has :class:`obmm.bench.local.LocalNode`.  mypy checks that each keeps to
it (the ``_conforms`` block at the end of each implementing module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from obmm.handle import Handle
    from obmm.testbed.ssh import Connection, Result

#: A command's deadline unless the caller gives one.
DEFAULT_TIMEOUT_S = 120.0
OutputFn = Callable[[bytes], None]


class Process(Protocol):
    """A command started in the background on a node (:meth:`Node.start`)."""

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...

    @property
    def running(self) -> bool: ...

    def wait_ready(self, timeout: float = ...) -> None: ...

    def wait(self, timeout: float = ...) -> int: ...

    def stop(self, grace: float = ...) -> int | None: ...


class Node(Protocol):
    """One machine of a cluster."""

    @property
    def index(self) -> int:
        """Its position in the cluster (the node id handles carry)."""
        ...

    @property
    def name(self) -> str:
        """``node<index>`` for a guest, the host spec for a UB host."""
        ...

    @property
    def addr(self) -> str:
        """The address other nodes reach it at (handle exchange over TCP)."""
        ...

    @property
    def env(self) -> Mapping[str, str]:
        """What every command run with :meth:`run` / :meth:`start` gets in its environment."""
        ...

    def run(
        self,
        command: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        check: bool = False,
        stdin: bytes | None = None,
        on_stdout: OutputFn | None = None,
        on_stderr: OutputFn | None = None,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        bare: bool = False,
    ) -> Result:
        """Run `command` (sh) and return its status and output.

        By default it runs in the node's working directory with :attr:`env`, in its own
        process group, which is killed at the `timeout` deadline (CommandTimeout).  With
        `bare` the command runs as given in the login shell (the testbed's own short
        commands); the deadline then only closes the channel."""
        ...

    def start(
        self,
        command: str,
        *,
        name: str | None = None,
        ready_line: str | None = None,
        ready_port: int | None = None,
        ready_timeout: float = ...,
        timeout: float = ...,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start `command` in the background; with `ready_line` or `ready_port` return once
        it is ready."""
        ...

    def put(self, local: Path, remote: str | PurePosixPath, *, timeout: float = ...) -> None:
        """A file, or a directory as one archive, to `remote` on the node."""
        ...

    def get(self, remote: str | PurePosixPath, local: Path, *, timeout: float = ...) -> None:
        """The file `remote` from the node to `local`."""
        ...

    def alive(self) -> bool:
        """False once the node is known dead (a QEMU that exited); hosts answer True."""
        ...

    def console_tail(self) -> str:
        """The last console lines, for failure reports (a host has none to give)."""
        ...

    def console_since(self, marker: str) -> str:
        """The console output after its last line holding `marker` (all of it without one):
        what the kernel-log guard scans when the node's kernel log cannot be read over SSH.
        "" for a node with no console here."""
        ...

    def fetch_handle(
        self, server: Node | str, name: str = ..., *, port: int = ..., timeout: float = ...
    ) -> Handle:
        """The handle `server` publishes as `name`, fetched on this node (obmm.exchange)."""
        ...

    def serve_handles(self, handles: Mapping[str, Handle], *, port: int = ...) -> Process:
        """Publish `handles` from this node until the returned process is stopped."""
        ...


class SshNode(Node, Protocol):
    """A node reached over SSH (a QEMU guest or a UB host), for harnesses that hold
    long-lived channels of their own (the cluster suite's snippet agents)."""

    def connect(self, timeout: float | None = ..., *, node_only: bool = ...) -> Connection:
        """A new logged-in connection; with `node_only` it fails only once this node died."""
        ...
