"""Host-side suite that boots the QEMU cluster and runs the guest tests (``make qemu-test``).

The plugin collects ``*.guestsuite`` files into one host item per guest test; see
pylib/obmm/testbed/pytest_qemu.py for the environment variables that configure the run.
"""

from __future__ import annotations

from obmm.testbed.pytest_qemu import (  # noqa: F401  (hooks and fixtures for pytest)
    guest_session,
    pytest_collect_file,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_unconfigure,
)
