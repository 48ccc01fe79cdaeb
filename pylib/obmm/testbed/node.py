"""One interface for a node and a set of nodes, whether QEMU guests or real UB hosts.

The QEMU testbed (:class:`obmm.testbed.cluster.Cluster`, :class:`obmm.testbed.runner.GuestSession`)
and the hardware stage (:class:`obmm.testbed.hw.stage.HwCluster`, :class:`~.HwSession`) both
satisfy these protocols; the cluster suite's harness and the guest-suite pytest plugin are written
against them, so a test runs unchanged on either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from obmm.testbed.cluster import Cluster
    from obmm.testbed.hw.stage import HwCluster, HwSession
    from obmm.testbed.runner import EventParser, GuestRun, GuestSession
    from obmm.testbed.ssh import Connection


class NodeLike(Protocol):
    """One machine of a set: a QEMU node or a UB host."""

    @property
    def name(self) -> str: ...

    def alive(self) -> bool:
        """False once the node is known dead (a QEMU that exited); hosts answer True."""
        ...

    def console_tail(self) -> str:
        """The last console lines, for failure reports (a host has none to give)."""
        ...


class NodeSet(Protocol):
    """The machines a cross-node test runs on, reachable over SSH and the fabric network."""

    @property
    def nodes(self) -> Sequence[NodeLike]: ...

    def connect(self, index: int, timeout: float = 30.0, *, node_only: bool = False
                ) -> Connection: ...  # fmt: skip

    def fabric_ip(self, index: int) -> str:
        """The address other nodes reach node `index` at (handle exchange over TCP)."""
        ...


class SuiteSession(Protocol):
    """Where the guest suite runs: boots or reaches the nodes, then runs pytest in one of them."""

    def boot(self) -> object: ...

    def connect(self, node: int = 0) -> Connection: ...

    def collect(
        self, paths: Sequence[str], ignore: Sequence[str] = (), node: int = 0
    ) -> EventParser: ...

    def start(
        self,
        nodeids: Sequence[str],
        *,
        node: int = 0,
        junit: str | None = None,
        suite_timeout: float = ...,
    ) -> GuestRun: ...

    def close(self) -> None: ...


if TYPE_CHECKING:
    # mypy checks that both worlds keep to the interface.
    def _conforms(
        c: Cluster, h: HwCluster, g: GuestSession, s: HwSession
    ) -> tuple[NodeSet, NodeSet, SuiteSession, SuiteSession]:
        return c, h, g, s
