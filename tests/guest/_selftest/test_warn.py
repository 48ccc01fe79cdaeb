"""Deliberately failing guest test: a kernel WARN must fail the test that caused it.

Not part of the guest suite; the runner's self-test (tests/testbed/test_runner_selftest.py) runs it.
"""

from __future__ import annotations

from pathlib import Path

TESTHOOK = Path("/dev/obmm_testhook")


def test_triggers_warn() -> None:
    # The test body passes; only the kernel-log check after it can fail it.
    TESTHOOK.write_text("warn\n")


def test_after_warn_is_clean() -> None:
    # The previous test's WARN must not leak into this one.
    assert TESTHOOK.read_text() == "obmm_testhook ready\n"
