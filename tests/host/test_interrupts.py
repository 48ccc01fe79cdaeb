"""obmm.tools.interrupts: SIGTERM as Ctrl-C, and a teardown a second signal cannot cut short."""

from __future__ import annotations

import os
import signal
import time

import pytest

from obmm.tools import interrupts


def test_sigterm_unwinds_like_ctrl_c_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.sigterm_unwinds(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_a_teardown_waits_for_its_end() -> None:
    finished = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a pytest-xdist worker
    with (
        pytest.raises(KeyboardInterrupt, match="signal 2"),
        interrupts.signals_deferred() as noted,
    ):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handlers ran: noted, not raised
        assert noted == [signal.SIGINT, signal.SIGTERM]
        finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_teardown_without_a_signal_ends_quietly() -> None:
    with interrupts.signals_deferred() as noted:
        pass
    assert noted == []


def test_a_failing_teardown_keeps_its_own_exception() -> None:
    with pytest.raises(RuntimeError), interrupts.signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        raise RuntimeError("teardown failed")
