"""Where the seconds of a cluster's start go: per node, host-side times of each step.

Every time is in seconds since the command started (for `obmm-testbed up`, the process's start:
Python's own start-up and imports count, a user waits for them too).  Host steps are marked as
they happen.  Kernel-side steps come from the node's console: QEMU writes a serial byte to the
console file as the guest writes it, so the host time a line is first seen (the console is
polled every few tens of milliseconds while the host waits for sshd) is when the guest printed
it.  The guest clock's zero on the host's line ("kernel") is the smallest (seen - printk time)
over the lines read while they were printed: a line held in the log buffer and printed later
only gives a later time.  A console read after the fact (the systemd boot) gives guest times and
"kernel", not live host times.
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What the fast init (qemu/debian/obmm-init) prints on the console once sshd listens.
READY_LINE = "obmm-init: sshd listening"

#: A node's steps in the order they happen, with what each means (`up -v` prints these names).
NODE_STEPS: tuple[tuple[str, str], ...] = (
    ("qemu", "QEMU process started"),
    ("bound", "QEMU past device setup (its QMP socket is there, its SSH port bound)"),
    ("loaded", "snapshot state loaded and the node resumed (restore only)"),
    ("console", "first console byte: firmware done, the kernel's setup code runs"),
    ("kernel", "the guest clock's zero: the kernel decompressed and running"),
    ("init", "the kernel runs /init (the initramfs)"),
    ("userland", "obmm-init: root mounted, NIC modules loaded, NICs up, sshd starting"),
    ("sshd", "sshd listening (obmm-init's console line)"),
    ("login", "the host's first SSH login done"),
    ("configured", "after the login: the restored clock and pool, or the systemd boot's network"),
    ("modules", "the driver's modules loaded and the node identified (--kmod)"),
)
#: The command's own steps.
CLUSTER_STEPS: tuple[tuple[str, str], ...] = (
    ("bring_up", "the one way up entered (imports and argument parsing before it)"),
    ("image", "the guest image found (or built)"),
    ("kmod", "the driver's modules found (or built)"),
    ("files", "the run directory ready: RAM files and overlays made, or a snapshot's copied"),
    ("launched", "every QEMU started and bound"),
    ("snapshot", "a snapshot of the freshly booted cluster saved (a cold boot with snapshots on)"),
    ("ready", "every node logged in (and prepared)"),
    ("returned", "the command returns"),
)
#: Console lines that mark a node step: the first line that contains the text.
CONSOLE_STEPS: tuple[tuple[str, str], ...] = (
    ("init", "Run /init as init process"),
    ("userland", "obmm-init: starting sshd"),
    ("sshd", READY_LINE),
)
_PRINTK = re.compile(rb"^\[\s*(\d+\.\d+)\]")


def process_start() -> float:
    """This process's start as a time.monotonic() value (from /proc/self/stat; CLOCK_BOOTTIME
    and CLOCK_MONOTONIC differ only by time suspended).  Now, where /proc cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - max(0.0, age)


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of process `pid` (all its threads); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Timeline:
    """The steps of one cluster start, in seconds since `origin` (a time.monotonic() value)."""

    origin: float = field(default_factory=time.monotonic)
    #: "boot" or "restore" (set by the cluster start).
    kind: str = ""
    cluster: dict[str, float] = field(default_factory=dict)
    nodes: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Guest-clock seconds of the console steps, per node.
    guest: dict[int, dict[str, float]] = field(default_factory=dict)
    #: CPU seconds: "command" (this process), "node<i>" (its QEMU when it was ready).
    cpu: dict[str, float] = field(default_factory=dict)

    @classmethod
    def since_process_start(cls) -> Timeline:
        return cls(origin=process_start())

    def now(self) -> float:
        return time.monotonic() - self.origin

    def mark(self, step: str, node: int | None = None, at: float | None = None) -> None:
        """Step `step` (of the node, or of the command) happened `at` (default: now); the
        first mark of a step stands."""
        t = self.now() if at is None else at
        steps = self.cluster if node is None else self.nodes.setdefault(node, {})
        steps.setdefault(step, round(t, 3))

    def mark_cpu(self, key: str, seconds: float | None) -> None:
        if seconds is not None:
            self.cpu[key] = round(seconds, 2)

    def mark_command_cpu(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.mark_cpu("command", usage.ru_utime + usage.ru_stime)

    def phases(self, node: int) -> list[tuple[str, float]]:
        """(step, seconds since the step before it) of node `node`, in the order they happened."""
        steps = sorted(self.nodes.get(node, {}).items(), key=lambda kv: kv[1])
        out, last = [], 0.0
        for name, t in steps:
            out.append((name, round(t - last, 3)))
            last = t
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cluster": dict(self.cluster),
            "nodes": {str(i): dict(s) for i, s in sorted(self.nodes.items())},
            "guest": {str(i): dict(s) for i, s in sorted(self.guest.items())},
            "cpu": dict(self.cpu),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Timeline | None:
        if not data:
            return None
        return cls(
            origin=0.0,
            kind=str(data.get("kind", "")),
            cluster={str(k): float(v) for k, v in data.get("cluster", {}).items()},
            nodes={int(i): _floats(s) for i, s in data.get("nodes", {}).items()},
            guest={int(i): _floats(s) for i, s in data.get("guest", {}).items()},
            cpu={str(k): float(v) for k, v in data.get("cpu", {}).items()},
        )

    def format(self) -> list[str]:
        """The lines `up -v` and `status` print."""
        head = f"timeline of the {self.kind or 'start'} (seconds since the command started"
        lines = [head + "; [guest clock]; CPU seconds):"]
        steps = "  ".join(f"{k} {v:.2f}" for k, v in _ordered(self.cluster, CLUSTER_STEPS))
        cpu = f"  (CPU {self.cpu['command']:.2f})" if "command" in self.cpu else ""
        lines.append(f"  command: {steps}{cpu}")
        for i in sorted(self.nodes):
            guest = self.guest.get(i, {})
            parts = []
            for k, v in _ordered(self.nodes[i], NODE_STEPS):
                parts.append(f"{k} {v:.2f}" + (f" [{guest[k]:.2f}]" if k in guest else ""))
            cpu = f"  (QEMU CPU {self.cpu[f'node{i}']:.2f})" if f"node{i}" in self.cpu else ""
            lines.append(f"  node{i}: " + "  ".join(parts) + cpu)
        return lines


def _floats(d: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in d.items()}


def _ordered(steps: dict[str, float], order: Iterable[tuple[str, str]]) -> list[tuple[str, float]]:
    known = [name for name, _ in order]
    return sorted(
        steps.items(), key=lambda kv: (known.index(kv[0]) if kv[0] in known else len(known), kv[1])
    )


class ConsoleWatch:
    """Reads a node's console file as it grows and marks the console steps on a timeline."""

    def __init__(self, path: Path, timeline: Timeline, node: int) -> None:
        self.path = path
        self.timeline = timeline
        self.node = node
        self._offset = 0
        self._partial = b""
        self._kernel: float | None = None  # smallest (seen - printk time)
        #: time.monotonic() of the last poll that found the console grown (None: not yet)
        self.grew_at: float | None = None

    def seen(self, step: str) -> bool:
        return step in self.timeline.guest.get(self.node, {}) or step in self.timeline.nodes.get(
            self.node, {}
        )

    def poll(self, *, live: bool = True) -> None:
        """Read what was written since the last poll.  `live`: the lines were printed just now
        (polled while the guest runs), so their host time is now; otherwise only their guest
        times and the clock's zero are known."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.grew_at = time.monotonic()
        now = self.timeline.now()
        if self._offset == 0 and live:
            self.timeline.mark("console", self.node, now)
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            self._line(raw.replace(b"\r", b""), now, live)

    def _line(self, raw: bytes, now: float, live: bool) -> None:
        m = _PRINTK.match(raw)
        stamp = float(m.group(1)) if m else None
        if stamp is not None and stamp > 0 and live:
            offset = now - stamp
            if self._kernel is None or offset < self._kernel:
                self._kernel = offset
                self.timeline.nodes.setdefault(self.node, {})["kernel"] = round(offset, 3)
        text = raw.decode(errors="replace")
        for step, wanted in CONSOLE_STEPS:
            if wanted in text and not self.seen(step):
                if stamp is not None:
                    self.timeline.guest.setdefault(self.node, {})[step] = stamp
                if live:
                    self.timeline.mark(step, self.node, now)
