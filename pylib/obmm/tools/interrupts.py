"""SIGTERM handled like Ctrl-C, and teardown that a second signal cannot cut short.

A cancelled CI job gets SIGTERM (coreutils ``timeout`` and CI runners signal the whole process
group, often twice).  The first SIGINT or SIGTERM unwinds as for KeyboardInterrupt, which runs
every ``finally``: clusters are stopped and scratch directories removed.  From then on further
SIGINT/SIGTERM are noted with one line and do not interrupt the unwinding.  A signal that comes
during a teardown that is not an unwinding (:func:`signals_deferred`, a normal stop) waits until
the teardown is done, then takes effect.
Standard library only (a leaf: the testbed, the bench and the test suites use it).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any, Union

HELD = (signal.SIGINT, signal.SIGTERM)
Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]
EXIT_INTERRUPTED = 130  # like a shell's status after Ctrl-C


_state = {"unwinding": False, "said": False}


def _say_once(text: str) -> None:
    if not _state["said"]:
        _state["said"] = True
        with contextlib.suppress(OSError, ValueError):
            print(text, file=sys.stderr, flush=True)


def _noted_while_unwinding(signum: int, frame: FrameType | None) -> None:
    _say_once(f"signal {signum} noted: the teardown already under way runs to its end")


def raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler: unwind like Ctrl-C; later SIGINT/SIGTERM only wait for the unwinding."""
    if _main_thread():
        for sig in HELD:
            signal.signal(sig, _noted_while_unwinding)
    _state["unwinding"] = True
    raise KeyboardInterrupt(f"signal {signum}")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install_sigterm_unwinds() -> None:
    """From now on SIGTERM unwinds like Ctrl-C, and the first of either makes the later ones
    wait (signal handlers live in the main thread)."""
    if _main_thread():
        for sig in HELD:
            signal.signal(sig, raise_keyboard_interrupt)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C inside the block."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, raise_keyboard_interrupt) for sig in HELD}
    try:
        yield
    finally:
        if not _state["unwinding"]:  # an unwinding keeps holding the later signals
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_unwinding(prog: str, func: Callable[[], int]) -> int:
    """`func()` with SIGTERM unwinding like Ctrl-C; an interrupt ends it after the unwinding
    with one line on stderr (`<prog>: interrupted (...)`) and EXIT_INTERRUPTED.  For the entry
    points of commands: after an interrupt, later signals stay held until the process exits
    (a process that goes on calls :func:`unwound`)."""
    try:
        with sigterm_unwinds():
            return func()
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted ({exc or 'Ctrl-C'})", file=sys.stderr)
        exiting()
        return EXIT_INTERRUPTED


def exiting() -> None:
    """The unwinding is done and the process exits with its status: a later SIGINT/SIGTERM
    must not turn that into death by signal (while Python shuts down it restores the default
    action of every signal that had a Python handler)."""
    if _main_thread():
        for sig in HELD:
            signal.signal(sig, signal.SIG_IGN)


def unwound(handlers: Mapping[signal.Signals, Handler] | None = None) -> None:
    """The unwinding is over and this process goes on (a test's, say): signals act again,
    through `handlers` (default: Python's own)."""
    _state.update(unwinding=False, said=False)
    if _main_thread():
        defaults: dict[signal.Signals, Handler] = {
            signal.SIGINT: signal.default_int_handler,
            signal.SIGTERM: signal.SIG_DFL,
        }
        for sig, handler in (handlers or defaults).items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_deferred(doing: str = "stopping") -> Iterator[list[int]]:
    """SIGINT and SIGTERM are noted, not acted on, until the block ends (the first says so in
    one line: `doing`, then that it waits); then a noted one raises KeyboardInterrupt, unless
    the process is already unwinding from an earlier one.  Yields the signals noted so far."""
    noted: list[int] = []
    if not _main_thread():
        yield noted
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if not noted:
            _say_once(f"{doing}; signal {signum} waits for it")
        noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in HELD}
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if noted and not _state["unwinding"]:
        raise_keyboard_interrupt(noted[0], None)
