"""obmm.tools.interrupts: SIGTERM as Ctrl-C, and a teardown a second signal cannot cut short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from obmm.tools import interrupts


def test_sigterm_unwinds_like_ctrl_c_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.sigterm_unwinds():
        pass
    assert signal.getsignal(signal.SIGTERM) is before  # no signal: nothing stays changed
    with interrupts.sigterm_unwinds(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


def test_after_the_first_signal_the_next_ones_wait_for_the_unwinding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM twice (timeout(1), a CI runner cancelling): the second does not interrupt the
    teardown the first started; one line says it was noted."""
    torn_down = []
    with pytest.raises(KeyboardInterrupt, match="signal 15"), interrupts.sigterm_unwinds():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # during the teardown
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            torn_down.append(True)
    assert torn_down == [True]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["signal 15 noted: the teardown already under way runs to its end"]


def test_a_signal_during_a_teardown_waits_for_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    finished = []
    with (
        pytest.raises(KeyboardInterrupt, match="signal 2"),
        interrupts.signals_deferred("stopping cluster x") as noted,
    ):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handlers ran: noted, not raised
        assert noted == [signal.SIGINT, signal.SIGTERM]
        finished.append(True)
    assert finished == [True]
    assert capsys.readouterr().err.strip() == "stopping cluster x; signal 2 waits for it"


def test_a_teardown_without_a_signal_ends_quietly() -> None:
    with interrupts.signals_deferred() as noted:
        pass
    assert noted == []


def test_a_failing_teardown_keeps_its_own_exception() -> None:
    with pytest.raises(RuntimeError), interrupts.signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        raise RuntimeError("teardown failed")


def test_an_interrupted_command_exits_with_its_status_whatever_comes_after() -> None:
    """A second SIGTERM that lands after the unwinding, while the interpreter shuts down (when
    Python restores the default action of signals it handled), killed `up` with -15 instead
    of exit 130: once the command's one line is out, later signals are ignored."""
    code = (
        "import os, signal, sys, time\n"
        "from obmm.tools import interrupts\n"
        "def work():\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); return 0\n"
        "status = interrupts.run_unwinding('prog', work)\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.exit(status)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "prog: interrupted (signal 15)"
