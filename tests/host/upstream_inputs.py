"""The upstream tree a host test reads, given by path, or the test's one-line skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed import paths


def ub_upstream_tree(purpose: str) -> Path:
    """$OBMM_UB_UPSTREAM's tree; without one, skip with the line naming `purpose`."""
    missing = paths.ub_upstream_missing(purpose)
    if missing is not None:
        pytest.skip(missing)
    tree = paths.ub_upstream_dir()
    assert tree is not None  # nothing is missing
    return tree
