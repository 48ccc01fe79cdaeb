"""Run a few commands at once, their output line by line with a ``[name]`` prefix.

``python -m obmm.tools.side_by_side NAME=COMMAND [NAME=COMMAND ...]`` (``make qemu-test`` runs the
guest suite and the cluster suite this way).  Each COMMAND runs under ``/bin/sh -c`` in this
process group, so a Ctrl-C at the terminal reaches all of them; a SIGTERM sent to this process
is passed on to each (pytest unwinds on it and stops its QEMU nodes).  Every job runs to its end
whatever the others do.  At the end one line per job gives its exit status and wall time; the
exit status is 0 if every job exited 0, else that of the first job (in argument order) that
did not.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import IO


@dataclass
class Job:
    name: str
    command: str
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    status: int | None = None
    pump: threading.Thread | None = field(default=None, repr=False)


def parse_job(text: str) -> Job:
    name, sep, command = text.partition("=")
    if not sep or not name or not command.strip() or not name.replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected NAME=COMMAND, got {text!r}")
    return Job(name, command)


def _pump(job: Job, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    """Copy the job's lines to `out` with its prefix; when its output ends, reap it."""
    prefix = f"[{job.name}] "
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()
    assert job.proc is not None
    status = job.proc.wait()
    job.seconds = time.monotonic() - job.started
    # Killed by a signal: the shell's way of saying so (128 + signal).
    job.status = status if status >= 0 else 128 - status


def run_jobs(jobs: list[Job], out: IO[str] = sys.stdout) -> int:
    lock = threading.Lock()
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must differ: {names}")

    def forward(signum: int, frame: FrameType | None) -> None:
        for job in jobs:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.send_signal(signum)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, forward)
    try:
        for job in jobs:
            job.started = time.monotonic()
            job.proc = subprocess.Popen(
                ["/bin/sh", "-c", job.command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert job.proc.stdout is not None
            job.pump = threading.Thread(
                target=_pump, args=(job, job.proc.stdout, out, lock), daemon=True
            )
            job.pump.start()
        for job in jobs:
            assert job.pump is not None
            while job.pump.is_alive():
                try:
                    job.pump.join()
                except KeyboardInterrupt:
                    # The children got the same SIGINT (one process group); wait for them to
                    # unwind rather than leave their nodes running.
                    continue
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for job in jobs:
        verdict = "ok" if job.status == 0 else f"FAILED (exit {job.status})"
        out.write(f"side_by_side: {job.name} {verdict} in {job.seconds:.0f} s\n")
    out.flush()
    failed = [j.status for j in jobs if j.status]
    return failed[0] if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m obmm.tools.side_by_side",
        description="run commands at once, output prefixed with [NAME]",
    )
    p.add_argument("jobs", nargs="+", type=parse_job, metavar="NAME=COMMAND")
    args = p.parse_args(argv)
    return run_jobs(args.jobs)


if __name__ == "__main__":
    sys.exit(main())
