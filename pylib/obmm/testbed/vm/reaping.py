"""What dead owners left: clusters whose owner process died (SIGKILL, an OOM kill) stopped and
their run directories removed; the persistence of :mod:`obmm.testbed.vm.cluster` read back.

Every ``obmm-testbed`` command, every bring-up and ``obmm-testbed gc`` run
:func:`reap_dead_owners` first (scratch directories:
:func:`obmm.testbed.vm.ownership.reap_scratch`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from obmm.testbed.paths import run_root
from obmm.testbed.vm import ownership
from obmm.testbed.vm.cluster import (
    OWNER_FILE,
    RUN_PREFIX,
    STATE_FILE,
    Cluster,
    ClusterError,
    rundir_for,
)


def run_dir_owner(rundir: Path) -> tuple[bool, ownership.Owner | None]:
    """(recorded, owner) of a run directory: whether it says who owns it, and who."""
    for name in (STATE_FILE, OWNER_FILE):
        try:
            data = json.loads((rundir / name).read_text())
        except (OSError, ValueError):
            continue
        owner = data.get("owner") if name == STATE_FILE and isinstance(data, dict) else data
        return True, ownership.Owner.from_dict(owner)
    return False, None


def reap_dead_owners() -> list[str]:
    """Stop and remove every cluster whose owner process is dead (its QEMUs and hub are killed
    if any still run; the run directory with its RAM files, sockets and pidfiles goes).
    Clusters with a live owner are never touched; those owned by nobody (``up``, ``run
    --keep``) or by no record (a run directory from before owners were recorded) only once
    nothing of them runs: no node and no hub alive, only RAM files holding host memory.  The
    names of the clusters removed.  (Scratch: :func:`ownership.reap_scratch`.)"""
    removed = []
    root = run_root()
    if root.is_dir():
        for rundir in sorted(root.glob(f"{RUN_PREFIX}*")):
            recorded, owner = run_dir_owner(rundir)
            name = rundir.name[len(RUN_PREFIX) :]
            if owner is not None and owner.alive():
                continue
            if (not recorded or owner is None) and not _nothing_runs(name):
                continue
            # No state.json: a start killed early; nothing was launched from it.
            with contextlib.suppress(ClusterError):
                Cluster.attach(name).stop()
            shutil.rmtree(rundir, ignore_errors=True)
            removed.append(name)
    return removed


def _nothing_runs(name: str) -> bool:
    """Whether the cluster `name` has state and neither a node nor its hub is alive."""
    try:
        cluster = Cluster.attach(name)
    except ClusterError:
        return False  # no state: maybe a start under way, of a version without owners
    return not any(n.alive() for n in cluster.nodes) and not cluster.hub_alive()


def stop_all_stale() -> list[str]:
    """Remove run directories whose QEMUs are all dead (left by a SIGKILLed owner)."""
    removed = []
    for name in Cluster.names():
        try:
            cluster = Cluster.attach(name)
        except Exception:
            shutil.rmtree(rundir_for(name), ignore_errors=True)
            removed.append(name)
            continue
        if not any(n.alive() for n in cluster.nodes):
            cluster.stop()
            removed.append(name)
    return removed
