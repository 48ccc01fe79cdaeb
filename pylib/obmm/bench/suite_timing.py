"""Wall time of the suites a user waits for: `make qemu-test` warm and cold, `make test` from a
fresh clone with an empty cache.

Each is a whole `make` run in a subprocess, timed from outside, several samples interleaved
(warm, cold, fresh, warm, cold, fresh, ...) so a drift of the machine's speed hits all alike.
A run that fails is not a sample: it is reported with its exit status and the tail of its
output, and the figure keeps only the green runs (the note says how many failed).

- ``qemu-test.warm``: in the checkout, with the testbed cache as it is (image, modules,
  snapshots); one warm-up run first, not counted, so the caches are filled.
- ``qemu-test.cold``: in the checkout with ``OBMM_TESTBED_CACHE`` pointed at a new empty
  directory: the image is built, the kernel headers fetched, the modules built, the nodes cold
  booted and their snapshot saved.
- ``make-test.fresh``: ``git clone`` of the checkout's HEAD into a new directory, ``make
  setup-python setup-node`` there (not timed; the apt part is the machine's), then ``make test``
  with an empty cache, timed.

Nothing is left: every scratch cache and clone is removed after its run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from obmm.bench.measure import make_testbed_figure
from obmm.bench.results import Figure
from obmm.tools import interrupts

SUITES = ("qemu-test.warm", "qemu-test.cold", "make-test.fresh")
RUN_BOUND_S = 90 * 60.0  # CI's limit for a whole run


@dataclass
class SuiteSamples:
    name: str
    seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def figure(self) -> Figure:
        note = f"{len(self.failures)} failed run(s) not counted" if self.failures else ""
        baseline = "testbed.qemu_test.cold" if self.name == "qemu-test.warm" else None
        return make_testbed_figure(
            figure_name(self.name), self.seconds, baseline=baseline, note=note
        )


def figure_name(suite: str) -> str:
    return "testbed." + suite.replace("-", "_")


def _timed(argv: Sequence[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run `argv` in a session of its own, timed.  Interrupted (Ctrl-C, or SIGTERM, which
    suite_figures turns into KeyboardInterrupt), the whole session gets SIGTERM so a `make` run
    stops its pytest and QEMU nodes, and is waited for before the interrupt goes on."""
    start = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=RUN_BOUND_S)
        except BaseException:
            _stop_session(proc)
            raise
    return rc, time.monotonic() - start


def _stop_session(proc: subprocess.Popen[bytes], grace_s: float = 180.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_once(suite: str, checkout: Path, logdir: Path, cache_env: str) -> tuple[int, float, Path]:
    """One timed run of `suite`; (exit status, seconds, its log).  `cache_env` names the
    testbed's cache variable (obmm.envvars.CACHE)."""
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"{suite}-{time.strftime('%H%M%S')}.log"
    env = dict(os.environ)
    if suite == "qemu-test.warm":
        rc, secs = _timed(["make", "qemu-test"], checkout, env, log)
        return rc, secs, log
    scratch = Path(tempfile.mkdtemp(prefix="obmm-bench-suite-"))
    try:
        env[cache_env] = str(scratch / "cache")
        if suite == "qemu-test.cold":
            rc, secs = _timed(["make", "qemu-test"], checkout, env, log)
            return rc, secs, log
        if suite == "make-test.fresh":
            clone = scratch / "clone"
            subprocess.run(
                ["git", "clone", "-q", str(checkout), str(clone)], check=True, timeout=300
            )
            rc, _ = _timed(["make", "setup-python", "setup-node"], clone, env, log)
            if rc != 0:
                return rc, 0.0, log
            rc, secs = _timed(["make", "test"], clone, env, log)
            return rc, secs, log
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def suite_figures(
    suites: Sequence[str],
    samples: int,
    checkout: Path,
    logdir: Path,
    say: Callable[[str], None],
    runner: Callable[[str, Path, Path], tuple[int, float, Path]],
) -> list[Figure]:
    """`samples` green-or-not runs of each suite, interleaved; one figure per suite."""
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
    results = {s: SuiteSamples(s) for s in suites}
    # SIGTERM unwinds like Ctrl-C: the run in progress is stopped, its scratch removed.
    with interrupts.sigterm_unwinds():
        if "qemu-test.warm" in results:
            say("suite timing: warm-up make qemu-test (not counted)")
            runner("qemu-test.warm", checkout, logdir)
        for i in range(samples):
            for suite in suites:
                say(f"suite timing: {suite}, sample {i + 1} of {samples}")
                rc, secs, log = runner(suite, checkout, logdir)
                if rc == 0:
                    results[suite].seconds.append(secs)
                    say(f"suite timing: {suite} {secs:.0f} s")
                else:
                    results[suite].failures.append(str(log))
                    what = f"suite timing: {suite} FAILED (exit {rc}), not counted; {log}"
                    say(f"{what}\n{_tail(log)}")
    return [r.figure() for r in results.values() if r.seconds]
