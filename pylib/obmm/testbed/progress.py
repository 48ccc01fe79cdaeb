"""Progress for long steps: a live status line with elapsed time on a TTY, plain lines otherwise."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from obmm.testbed.errors import TestbedError

log = logging.getLogger(__name__)

# How often a non-TTY run says it is still alive, so CI logs show a slow step is not hung.
PLAIN_HEARTBEAT_S = 30.0


class StepFailed(TestbedError, RuntimeError):
    """A subprocess step failed; the message carries the tail of its log."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Progress:
    """Reports the steps of one long job (an image build, a boot)."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def _fmt(self, secs: float) -> str:
        return f"{int(secs) // 60:d}:{int(secs) % 60:02d}"

    def line(self, message: str) -> None:
        """One finished step (always its own line)."""
        text = f"[{self.label} {self._fmt(self.elapsed())}] {message}"
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()

    def status(self, message: str) -> None:
        """A transient status; on a TTY it overwrites the previous one, otherwise dropped."""
        if self.tty:
            text = f"[{self.label} {self._fmt(self.elapsed())}] {message}"
            width = 120
            self.stream.write("\r\033[K" + text[:width])
            self.stream.flush()

    def run(
        self,
        step: str,
        argv: Sequence[str],
        logfile: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Run one subprocess step, its output appended to `logfile`, with live progress."""
        self.line(f"{step}: {' '.join(argv[:3])}{' ...' if len(argv) > 3 else ''}")
        step_start = time.monotonic()
        last_beat = step_start
        with logfile.open("ab") as out:
            out.write(f"\n$ {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
            )
            try:
                while proc.poll() is None:
                    time.sleep(0.5)
                    now = time.monotonic()
                    last = _tail(logfile, 1).strip()
                    self.status(f"{step} ({self._fmt(now - step_start)}): {last}")
                    if not self.tty and now - last_beat >= PLAIN_HEARTBEAT_S:
                        last_beat = now
                        self.line(f"{step} still running ({now - step_start:.0f} s)")
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if proc.returncode != 0:
            self.line(f"{step}: FAILED (exit {proc.returncode})")
            raise StepFailed(
                f"{step} failed with exit status {proc.returncode}; log {logfile}, last lines:\n"
                + _tail(logfile)
            )
        self.line(f"{step}: done in {time.monotonic() - step_start:.0f} s")
