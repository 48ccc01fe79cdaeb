"""Run a few commands at once, their output line by line with a ``[name]`` prefix.

``python -m obmm.tools.side_by_side NAME=COMMAND [NAME+=COMMAND] [NAME=COMMAND ...]`` (``make
qemu-test`` runs the guest suite and the cluster suite this way).  ``NAME+=COMMAND`` adds a step
to job NAME: it starts when the job's previous step has ended, whatever that step's status, so
a short job can take on more work while the long ones run.  Each COMMAND runs under ``/bin/sh
-c`` in this process group, so a Ctrl-C at the terminal reaches all of them; a SIGTERM sent to
this process is passed on to each running step (pytest unwinds on it and stops its QEMU nodes)
and no further step starts.  Every job runs to its end whatever the others do.  At the end one
line per job gives its exit status, wall time and CPU time; a job's status is that of its first
step that failed, and the exit status is 0 if every job exited 0, else that of the first job (in
argument order) that did not.

A job's CPU time is that of every process of its steps, children included: each step's shell is
reaped with ``os.wait4``, whose usage counts the descendants each process waited for (pytest waits
for the QEMUs it starts, :meth:`obmm.testbed.vm.cluster.Cluster.stop`, so a guest's CPU is its
job's).
``--stage NAME --record FILE`` appends one JSON line per job and one for the whole run to FILE
(``make test``'s stage summary, :mod:`obmm.testbed.stages.stage_summary`); ``--plain`` passes a
single job's output through unprefixed (a stage timed as a whole, whose own jobs prefix theirs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO


@dataclass
class Job:
    name: str
    command: str
    then: list[str] = field(default_factory=list)  # steps after `command`, in order
    step: bool = False  # parsed from NAME+=COMMAND: to be folded into job NAME (add_steps)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system of its steps and what they waited for
    status: int | None = None
    runner: threading.Thread | None = field(default=None, repr=False)


def parse_job(text: str) -> Job:
    """NAME=COMMAND, or NAME+=COMMAND (a further step of job NAME: :func:`add_steps`)."""
    name, sep, command = text.partition("=")
    name = name.removesuffix("+")
    if not sep or not name or not command.strip() or not name.replace("-", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected NAME=COMMAND or NAME+=COMMAND, got {text!r}")
    return Job(name, command, step=text.startswith(f"{name}+="))


def add_steps(parsed: list[Job]) -> list[Job]:
    """Fold each NAME+=COMMAND into the job NAME given before it."""
    jobs: dict[str, Job] = {}
    for job in parsed:
        if job.step:
            if job.name not in jobs:
                raise ValueError(f"{job.name}+=...: no job {job.name} given before it")
            jobs[job.name].then.append(job.command)
        elif job.name in jobs:
            raise ValueError(f"job names must differ: {job.name} given twice")
        else:
            jobs[job.name] = job
    return list(jobs.values())


def _pump(job: Job, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    """Copy the step's lines to `out` with the job's prefix, until its output ends."""
    prefix = f"[{job.name}] "
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()


def _reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Wait for `proc`: its status (negative: killed by that signal, as Popen says) and the CPU
    seconds it and the descendants it waited for used."""
    _, wstatus, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(wstatus)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run_jobs(jobs: list[Job], out: IO[str] | None = None, *, plain: bool = False) -> int:
    """Run `jobs` at once, each to its end; the first failing status in argument order, else 0.
    `plain`: one job, its output passed through as it is (no prefix, no pipe)."""
    out = sys.stdout if out is None else out
    if plain and len(jobs) != 1:
        raise ValueError("--plain runs one job")
    lock = threading.Lock()
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must differ: {names}")
    stopping = threading.Event()
    procs_lock = threading.Lock()  # a step starts, or the signal is passed on, not both at once

    def forward(signum: int, frame: FrameType | None) -> None:
        with procs_lock:
            stopping.set()
            for job in jobs:
                # Not poll(): that would reap the step before its runner measures it.
                if job.proc is not None and job.proc.returncode is None:
                    job.proc.send_signal(signum)

    def run(job: Job) -> None:
        try:
            for command in [job.command, *job.then]:
                with procs_lock:
                    if stopping.is_set():
                        break
                    job.proc = subprocess.Popen(
                        ["/bin/sh", "-c", command],
                        stdin=subprocess.DEVNULL,
                        stdout=None if plain else subprocess.PIPE,
                        stderr=None if plain else subprocess.STDOUT,
                    )
                if job.proc.stdout is not None:
                    with job.proc.stdout:
                        _pump(job, job.proc.stdout, out, lock)
                status, cpu = _reap(job.proc)
                job.cpu_seconds += cpu
                # Killed by a signal: the shell's way of saying so (128 + signal).
                status = status if status >= 0 else 128 - status
                if not job.status:
                    job.status = status
        except OSError as exc:  # the shell itself could not be started
            with lock:
                out.write(f"[{job.name}] cannot start: {exc}\n")
        finally:
            # No step ran (stopped first, or a step could not start): that is no success.
            if job.status is None:
                job.status = 1
            job.seconds = time.monotonic() - job.started

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, forward)
    try:
        for job in jobs:
            job.started = time.monotonic()
            job.runner = threading.Thread(target=run, args=(job,), daemon=True)
            job.runner.start()
        for job in jobs:
            assert job.runner is not None
            while job.runner.is_alive():
                try:
                    job.runner.join()
                except KeyboardInterrupt:
                    # The children got the same SIGINT (one process group); wait for them to
                    # unwind rather than leave their nodes running.  No further step starts.
                    with procs_lock:
                        stopping.set()
                    continue
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for job in jobs:
        verdict = "ok" if job.status == 0 else f"FAILED (exit {job.status})"
        out.write(
            f"side_by_side: {job.name} {verdict} in {job.seconds:.0f} s "
            f"(CPU {job.cpu_seconds:.0f} s)\n"
        )
    out.flush()
    failed = [j.status for j in jobs if j.status]
    return failed[0] if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m obmm.tools.side_by_side",
        description="run commands at once, output prefixed with [NAME]",
    )
    p.add_argument("--stage", default="", help="the stage these jobs are (for --record)")
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        help="append each job's and the whole run's times to this JSON-lines file",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="one job, its output unprefixed (a stage timed as a whole)",
    )
    p.add_argument("jobs", nargs="+", type=parse_job, metavar="NAME[+]=COMMAND")
    args = p.parse_args(argv)
    try:
        jobs = add_steps(args.jobs)
        if args.plain and len(jobs) != 1:
            raise ValueError("--plain runs one job")
    except ValueError as exc:
        p.error(str(exc))
    started = time.monotonic()
    status = run_jobs(jobs, plain=args.plain)
    if args.record is not None:
        record(
            args.record,
            args.stage or "+".join(j.name for j in jobs),
            jobs,
            time.monotonic() - started,
        )
    return status


def record(path: Path, stage: str, jobs: list[Job], wall: float) -> None:
    """Append one line per job (``kind: job``) and one for the run (``kind: stage``) to `path`.
    Best effort: a summary that cannot be written does not fail the run."""
    lines = [
        {
            "kind": "job",
            "stage": stage,
            "job": j.name,
            "wall_s": round(j.seconds, 1),
            "cpu_s": round(j.cpu_seconds, 1),
            "status": j.status,
        }
        for j in jobs
    ]
    lines.append({"kind": "stage", "stage": stage, "job": stage, "wall_s": round(wall, 1),
                  "cpu_s": round(sum(j.cpu_seconds for j in jobs), 1),
                  "status": next((j.status for j in jobs if j.status), 0)})  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    except OSError as exc:
        print(f"side_by_side: cannot record the times in {path}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
