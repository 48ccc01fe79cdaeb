"""SIGTERM handled like Ctrl-C, and teardown that a second signal cannot cut short.

A cancelled CI job gets SIGTERM.  Unwinding as for KeyboardInterrupt runs every ``finally``, so
clusters are stopped and scratch directories removed; a signal that comes during such a
teardown waits until the teardown is done instead of leaving half of it undone.
Standard library only (a leaf: the testbed, the bench and the test suites use it).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED = 130  # like a shell's status after Ctrl-C


def raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler: unwind like Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install_sigterm_unwinds() -> None:
    """From now on SIGTERM unwinds like Ctrl-C (signal handlers live in the main thread)."""
    if _main_thread():
        signal.signal(signal.SIGTERM, raise_keyboard_interrupt)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C inside the block."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_unwinding(prog: str, func: Callable[[], int]) -> int:
    """`func()` with SIGTERM unwinding like Ctrl-C; an interrupt ends it after the unwinding
    with one line on stderr (`<prog>: interrupted (...)`) and EXIT_INTERRUPTED.  For the entry
    points of commands."""
    try:
        with sigterm_unwinds():
            return func()
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted ({exc or 'Ctrl-C'})", file=sys.stderr)
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are noted, not acted on, until the block ends; then a noted one
    raises KeyboardInterrupt (unless the block is already unwinding).  Yields the list of
    signals noted so far."""
    noted: list[int] = []
    if not _main_thread():
        yield noted
        return

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in HELD}
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if noted:
        raise KeyboardInterrupt(f"signal {noted[0]} (held until the teardown ended)")
