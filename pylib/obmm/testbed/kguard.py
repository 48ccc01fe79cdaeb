"""The kernel-log guard: mark every node's kernel log, later scan what came after the mark.

Before a test (or an `obmm-testbed run`) a marker line goes into each live node's kernel log and
its taint mask is noted; afterwards each node's messages since the marker are scanned with
:mod:`obmm.tools.logscan` and the taint mask compared.  A WARN, oops, KASAN report... or a
non-benign taint gained, or a node that died, is a failure text carrying the excerpt.

One implementation for every user: the cluster suite's harness (tests/cluster/xharness.py)
and `obmm-testbed run` (:mod:`obmm.testbed.run`).  The guard only needs a way to run a shell
command on node *i* and to ask whether node *i* is alive.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from obmm.testbed.parallel import on_each
from obmm.testbed.ssh import Result, SshError
from obmm.tools import logscan

MARKER = "obmm-cluster-test"
TAINT_EXCERPT_CHARS = 3000
# Between the kernel log and the taint mask in one command's output.
TAINT_SEPARATOR = "==obmm-kguard-taint=="


class _NodeRunner(Protocol):
    def __call__(self, node: int, command: str, *, timeout: float = ...) -> Result: ...


class KernelLogGuard:
    """Kernel reports, new taint and dead nodes since :meth:`start`, one text per node."""

    def __init__(
        self,
        nodes: int,
        run: _NodeRunner,
        alive: Callable[[int], bool],
        console_tail: Callable[[int], str],
        *,
        marker: str = MARKER,
    ) -> None:
        self.nodes = nodes
        self._run = run
        self._alive = alive
        self._console_tail = console_tail
        self.marker = marker
        self.tag = ""
        self.before: dict[int, int] = {}

    def mark(self, tag: str, nodes: Sequence[int] | None = None) -> dict[int, int]:
        """Write a marker into every live node's kernel log; their taint masks."""
        live = [i for i in (range(self.nodes) if nodes is None else nodes) if self._alive(i)]

        def one(i: int) -> int:
            res = self._run(
                i,
                f"echo '{self.marker}: {tag}' > /dev/kmsg; cat /proc/sys/kernel/tainted",
                timeout=120,
            )
            return int(res.out.strip() or "0")

        return dict(zip(live, on_each(live, one)))

    def new_kernel_log(self, node: int, tag: str) -> str:
        """The node's kernel log after the marker `tag` (all of it if the marker is gone)."""
        text = self._run(node, "dmesg", timeout=60).out
        cut = text.rfind(f"{self.marker}: {tag}")
        return text[text.find("\n", cut) + 1 :] if cut >= 0 else text

    def taint(self, node: int) -> int:
        return int(self._run(node, "cat /proc/sys/kernel/tainted", timeout=60).out.strip() or "0")

    def start(self, name: str) -> None:
        """Start watching every node's kernel log."""
        self.tag = f"{name} {uuid.uuid4().hex[:8]}"
        self.before = self.mark(self.tag)

    def _log_and_taint(self, node: int) -> tuple[str, int] | SshError:
        """The node's kernel log after this guard's marker and its taint mask, in one round
        trip (or the error that prevented reading them)."""
        try:
            res = self._run(
                node, f"dmesg; echo {TAINT_SEPARATOR}; cat /proc/sys/kernel/tainted", timeout=60
            )
        except SshError as exc:
            return exc
        text, _, taint = res.out.rpartition(f"{TAINT_SEPARATOR}\n")
        cut = text.rfind(f"{self.marker}: {self.tag}")
        text = text[text.find("\n", cut) + 1 :] if cut >= 0 else text
        return text, int(taint.strip() or "0")

    def failures(self, *, allow_dead: bool = False) -> list[str]:
        """What went wrong in the kernels since :meth:`start`, one text per node."""
        failures = []
        live = [i for i in self.before if self._alive(i)]
        logs = dict(zip(live, on_each(live, self._log_and_taint)))
        for i, taint_before in self.before.items():
            if i not in logs:
                if not allow_dead:  # else: a node killed on purpose
                    failures.append(f"node{i} died; console:\n{self._console_tail(i)}")
                continue
            got = logs[i]
            if isinstance(got, SshError):
                failures.append(f"node{i}: cannot read its kernel log: {got}")
                continue
            text, taint_after = got
            reports = logscan.scan(text)
            if reports:
                failures.append(f"node{i} kernel reports:\n{logscan.format_reports(reports)}")
            gained = logscan.taint_letters(taint_after & ~taint_before)
            bad = "".join(c for c in gained if c not in logscan.BENIGN_TAINT)
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
