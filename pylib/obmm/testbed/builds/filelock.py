"""An exclusive lock on a file of the testbed cache, held for a block (a leaf module).

Two test sessions that build the same image or kernel at once take turns instead of building
into each other's directories.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """flock(LOCK_EX) on `path` (created, with its directory, if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
