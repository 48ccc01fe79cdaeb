"""Who owns a cluster or a scratch directory, and what a dead owner left behind.

A process that starts a cluster (or makes a scratch directory) records itself as the owner: its
pid and the pid's start time, so a recycled pid is never taken for it.  A cluster started with
``up`` or ``run --keep`` has no owner until ``down``.  When the owner dies without tearing down
(SIGKILL, an OOM kill), its QEMUs and hub die with it (``PR_SET_PDEATHSIG``), but the run
directory (RAM files on tmpfs: host memory), its sockets and pidfiles, and its scratch
directories stay; the next testbed command (:func:`obmm.testbed.vm.reaping.reap_dead_owners`, run by
every ``obmm-testbed`` command, every bring-up and ``obmm-testbed gc``) removes them.

Standard library only, besides :mod:`obmm.testbed.paths`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRATCH_PREFIX = "obmm-scratch-"
_SCRATCH_RE = re.compile(rf"^{SCRATCH_PREFIX}(?P<pid>\d+)\.(?P<start>\d+)-")


def pid_start_time(pid: int) -> int | None:
    """Start time of `pid` (clock ticks since boot), to tell it from a recycled pid; None if
    there is no such process (or only its zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Owner:
    """A process, as a pid and its start time."""

    pid: int
    start: int | None

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), pid_start_time(os.getpid()))

    def alive(self) -> bool:
        start = pid_start_time(self.pid)
        return start is not None and (self.start is None or start == self.start)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_dict(cls, data: Any) -> Owner | None:
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            return None
        start = data.get("start")
        return cls(int(data["pid"]), int(start) if isinstance(start, int) else None)


@contextlib.contextmanager
def scratch_dir(what: str) -> Iterator[Path]:
    """A temporary directory named after its owner (this process), removed at the end; if
    this process is killed first, :func:`reap_scratch` removes it."""
    me = Owner.me()
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{me.pid}.{me.start or 0}-{what}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def reap_scratch(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories whose owner is dead; the paths removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in sorted(root.glob(f"{SCRATCH_PREFIX}*")):
        m = _SCRATCH_RE.match(path.name)
        if m is None:
            continue
        start = int(m["start"]) or None
        if Owner(int(m["pid"]), start).alive():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
