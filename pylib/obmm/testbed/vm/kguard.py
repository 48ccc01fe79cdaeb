"""The kernel-log guard: mark every node's kernel log, later scan what came after the mark.

Before a test (or an `obmm-testbed run`) a marker line goes into each live node's kernel log and
its taint mask is noted; afterwards each node's messages since the marker are scanned with
:mod:`obmm.tools.logscan` and the taint mask compared.  A WARN, oops, KASAN report... or a
non-benign taint gained, or a node that died, is a failure text carrying the excerpt.

One implementation for every host-side user: every :class:`obmm.testbed.session.Session`
has one (`obmm-testbed run`, the pytest plugin), and so does the cluster suite's harness.
(Inside a guest, the guest suite's conftest watches ``/dev/kmsg`` itself with the same
verdict, :func:`obmm.tools.logscan.scan` and :func:`~obmm.tools.logscan.new_taint`.)  It works
on any :class:`~obmm.testbed.node.Node`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from obmm.testbed.parallel import on_each
from obmm.testbed.ssh import SshError
from obmm.tools import logscan

if TYPE_CHECKING:
    from obmm.testbed.node import Node

MARKER = "obmm-cluster-test"
TAINT_EXCERPT_CHARS = 3000
# Between the kernel log and the taint mask in one command's output.
TAINT_SEPARATOR = "==obmm-kguard-taint=="


class KernelLogGuard:
    """Kernel reports, new taint and dead nodes since :meth:`start`, one text per node."""

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        marker: str = MARKER,
        allow: tuple[logscan.AllowRule, ...] = (),
    ) -> None:
        self.nodes = list(nodes)
        self.marker = marker
        #: Reports the work may cause besides logscan's defaults (a run's --kernel-allow): not
        #: failures, and the W taint they set is explained by them.
        self.allow = allow
        self.tag = ""
        self.before: dict[int, int] = {}

    def mark(self, tag: str, nodes: Sequence[int] | None = None) -> dict[int, int]:
        """Write a marker into every live node's kernel log; their taint masks."""
        wanted = range(len(self.nodes)) if nodes is None else nodes
        live = [i for i in wanted if self.nodes[i].alive()]

        def one(i: int) -> int:
            res = self.nodes[i].run(
                f"echo '{self.marker}: {tag}' > /dev/kmsg; cat /proc/sys/kernel/tainted",
                timeout=120,
                bare=True,
            )
            return int(res.out.strip() or "0")

        return dict(zip(live, on_each(live, one)))

    def new_kernel_log(self, node: int, tag: str) -> str:
        """The node's kernel log after the marker `tag` (all of it if the marker is gone)."""
        text = self.nodes[node].run("dmesg", timeout=60, bare=True).out
        return logscan.after_marker(text, f"{self.marker}: {tag}")

    def reports(self, node: int) -> list[logscan.Report]:
        """The kernel reports on `node` since :meth:`start`'s marker, while the watch goes on:
        what a test checks before it ends, on nodes an earlier test may have left a report on
        (one it expected, such as a strict-mode stale read)."""
        return logscan.scan(self.new_kernel_log(node, self.tag), allow=self._rules())

    def _rules(self) -> tuple[logscan.AllowRule, ...]:
        return logscan.DEFAULT_ALLOW + self.allow

    def _scan(self, text: str) -> tuple[list[logscan.Report], str]:
        """The reports in `text` and the taint letters the reports this run allowed explain:
        W when one that a rule of the run's own excused is a WARN."""
        allowed: list[tuple[logscan.Report, logscan.AllowRule]] = []
        reports = logscan.scan(text, allow=self._rules(), allowed=allowed)
        warned = any(r.kind is logscan.Kind.WARN and rule in self.allow for r, rule in allowed)
        return reports, "W" if warned else ""

    def _unreadable(self, node: int, error: SshError) -> str:
        """The failure of a node whose kernel log SSH cannot read (a kernel stuck after an
        oops, a KASAN report that panicked it): what its console shows since the marker."""
        text = f"node{node}: cannot read its kernel log: {error}"
        reports, _ = self._scan(self.nodes[node].console_since(f"{self.marker}: {self.tag}"))
        if reports:
            text += f"\nits console shows:\n{logscan.format_reports(reports)}"
        return text

    def taint(self, node: int) -> int:
        res = self.nodes[node].run("cat /proc/sys/kernel/tainted", timeout=60, bare=True)
        return int(res.out.strip() or "0")

    def start(self, name: str) -> None:
        """Start watching every node's kernel log."""
        self.tag = f"{name} {uuid.uuid4().hex[:8]}"
        self.before = self.mark(self.tag)

    def _log_and_taint(self, node: int) -> tuple[str, int] | SshError:
        """The node's kernel log after this guard's marker and its taint mask, in one round
        trip (or the error that prevented reading them)."""
        try:
            res = self.nodes[node].run(
                f"dmesg; echo {TAINT_SEPARATOR}; cat /proc/sys/kernel/tainted",
                timeout=60,
                bare=True,
            )
        except SshError as exc:
            return exc
        text, _, taint = res.out.rpartition(f"{TAINT_SEPARATOR}\n")
        return logscan.after_marker(text, f"{self.marker}: {self.tag}"), int(taint.strip() or "0")

    def failures(self, *, allow_dead: bool = False) -> list[str]:
        """What went wrong in the kernels since :meth:`start`, one text per node."""
        failures = []
        live = [i for i in self.before if self.nodes[i].alive()]
        logs = dict(zip(live, on_each(live, self._log_and_taint)))
        for i, taint_before in self.before.items():
            if i not in logs:
                if not allow_dead:  # else: a node killed on purpose
                    name = self.nodes[i].name
                    failures.append(f"{name} died; console:\n{self.nodes[i].console_tail()}")
                continue
            got = logs[i]
            if isinstance(got, SshError):
                failures.append(self._unreadable(i, got))
                continue
            text, taint_after = got
            reports, explained = self._scan(text)
            if reports:
                failures.append(f"node{i} kernel reports:\n{logscan.format_reports(reports)}")
            bad = "".join(
                c for c in logscan.new_taint(taint_before, taint_after) if c not in explained
            )
            if bad:
                failures.append(
                    f"node{i}: kernel taint gained {bad!r}\n{text[-TAINT_EXCERPT_CHARS:]}"
                )
        return failures

    def restart(self) -> list[str]:
        """:meth:`failures` so far (dead nodes allowed); the guard starts over."""
        failures = self.failures(allow_dead=True)
        self.start(self.tag.rsplit(" ", 1)[0])
        return failures
