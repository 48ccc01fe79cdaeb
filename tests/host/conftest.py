"""Host suite: no VM, no /dev/obmm. Puts tests/host on sys.path for its helper modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _no_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    # Host tests boot fake QEMUs: never read or write the user's cluster snapshots.
    monkeypatch.setenv("OBMM_TESTBED_SNAPSHOT", "off")
