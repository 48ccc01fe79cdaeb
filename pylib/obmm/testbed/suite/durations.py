"""The seconds each test of a suite took last time, and a suite's share for one of several runs.

A suite shared out over several clusters at once (the guest suite's ``OBMM_GUEST_SHARDS``, the
cluster suite's ``OBMM_CLUSTER_SHARD``) is split by these weights
(:func:`obmm.testbed.suite.guest_suite.split_by_file`), so the runs end at about the same time.
The file is ``results/<suite>-durations.json``: ``{node id: seconds}``, merged with each run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from obmm.testbed.suite.guest_suite import split_by_file


def load(path: Path) -> dict[str, float]:
    """The recorded seconds by node id ({} when there is no readable record)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def save(path: Path, seconds: Mapping[str, float]) -> None:
    """Merge `seconds` into the record.  Best effort: a record that cannot be written leaves
    the next split less even, nothing else."""
    if not seconds:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Shards of one suite end near each other: one merges at a time, none loses the other's.
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = load(path)
            known.update({k: round(float(v), 3) for k, v in seconds.items()})
            # Whole or not at all: another run may read it meanwhile.
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)


def parse_shard(text: str) -> tuple[int, int] | None:
    """``"I/N"`` (1 <= I <= N) as (I, N); "" is None (the whole suite)."""
    if not text.strip():
        return None
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise ValueError(f"a shard is I/N with 1 <= I <= N, got {text!r}")
    return i, n


def shard(
    nodeids: Sequence[str], index: int, count: int, weights: Mapping[str, float]
) -> list[str]:
    """The `index`-th (from 1) of `count` parts of `nodeids`, split by file and weight.  Every
    run given the same node ids and weights computes the same parts, so the `count` runs
    together take each test once."""
    groups = split_by_file(nodeids, count, dict(weights))
    return groups[index - 1] if index <= len(groups) else []
