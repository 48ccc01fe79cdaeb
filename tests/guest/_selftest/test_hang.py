"""A guest test that takes long enough for the host to freeze the guest under it.

Not part of the guest suite; the runner's self-test stops the node's QEMU while this runs and
expects the run to fail as "stopped answering" within a minute or so.
"""

from __future__ import annotations

import time


def test_sleeps_long() -> None:
    time.sleep(600)
