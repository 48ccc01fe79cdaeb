"""Run a module's KUnit suites in a guest and bring the kernel log home.

One node of the production image (restored from the single-node snapshot when there is one),
the modules copied in, then: ``kunit.ko enable=1``, the test module and what depends on it
(each must load), ``kunit_run.ko`` pointed at the test module's ``.kunit_test_suites`` section
(its address from ``/sys/module/<target>/sections``, its pointer count from the .ko), every
module unloaded again, in reverse.  The kernel log from a marker on is what :mod:`obmm.tools.ktap`
parses; :func:`obmm.tools.logscan.scan` looks at it too, so a WARN, oops or KASAN report during
the tests (or the unload) fails the run whatever KTAP says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from obmm.testbed.builds import elfcheck
from obmm.testbed.builds.image import Image
from obmm.testbed.errors import TestbedError
from obmm.testbed.progress import Progress
from obmm.testbed.session import bring_up
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import Connection
from obmm.tools import logscan

REMOTE = PurePosixPath("/tmp/obmm-kunit")
SECTION = ".kunit_test_suites"
POINTER_BYTES = 8  # x86_64 and arm64
MARKER = "obmm-patch-check: kunit"
#: Taint the run sets on purpose: out-of-tree (O), unsigned (E), a KUnit test has run (N).
BENIGN_TAINT = logscan.BENIGN_TAINT + "N"
STEP_TIMEOUT_S = 300.0


class KunitGuestError(TestbedError, RuntimeError):
    """A module did not load or unload in the guest, or the suites could not be found."""


@dataclass(frozen=True)
class GuestRun:
    log: str  # the kernel log from the start marker on
    reports: tuple[logscan.Report, ...]
    release: str
    accel: str
    seconds: float


def suite_count(ko: Path) -> int:
    """How many suite pointers the .ko's .kunit_test_suites section holds."""
    size = elfcheck.section_size(ko, SECTION)
    if not size:
        raise KunitGuestError(f"{ko.name} has no {SECTION} section: no KUnit suite linked in")
    return size // POINTER_BYTES


def _step(conn: Connection, command: str, what: str) -> str:
    res = conn.run(command, timeout=STEP_TIMEOUT_S)
    if not res.ok:
        tail = conn.run("dmesg | tail -n 40", timeout=60).out
        raise KunitGuestError(f"{what} failed: {(res.err or res.out).strip()}\n{tail}")
    return res.out


@contextlib.contextmanager
def node(image: Image, *, name: str, progress: Progress) -> Iterator[tuple[Connection, str]]:
    """One node (:func:`obmm.testbed.session.bring_up`, no modules of ours; restored from the
    single-node snapshot when there is one) and the accelerator it runs on, torn down at the
    end whatever happens.  `image` must be the settings' image (the production kernel)."""
    settings = Settings.from_env().replace(name=name, topology="single", nodes=1, kernel="debian")
    with bring_up(settings, purpose="kunit", load_modules=False, progress=progress) as session:
        assert session.cluster.image.directory == image.directory
        with session.nodes[0].connect() as conn:
            yield conn, session.cluster.accel


def run_on(
    conn: Connection,
    kunit: Path,
    modules: Sequence[Path],
    runner: Path,
    target: str,
    count: int,
    *,
    progress: Progress,
    claim: str | None = None,
) -> str:
    """Load, run and unload as the module docstring says; the kernel log from the start marker
    on.  `claim` tells kunit_run.ko another module than the one the section belongs to (its
    own test).  What was loaded is unloaded again, also when a step fails."""
    _step(conn, f"rm -rf {REMOTE} && mkdir -p {REMOTE}", "making the module directory")
    for ko in (kunit, *modules, runner):
        conn.put(ko, str(REMOTE / ko.name))
    _step(conn, f"echo '{MARKER} start' > /dev/kmsg", "marking the kernel log")
    loaded: list[str] = []
    finished = False
    try:
        _step(conn, f"insmod {REMOTE / kunit.name} enable=1", f"insmod {kunit.name}")
        loaded.append(kunit.stem)
        for ko in modules:
            _step(conn, f"insmod {REMOTE / ko.name}", f"insmod {ko.name}")
            loaded.append(ko.stem)
        section = f"/sys/module/{target}/sections/{SECTION}"
        address = _step(conn, f"cat {section}", f"reading {section}").strip()
        progress.line(f"{target}: {count} suite(s) at {address}; running them")
        _step(
            conn,
            f"insmod {REMOTE / runner.name} target={claim or target} suites={address} "
            f"count={count}",
            f"insmod {runner.name}",
        )
        loaded.append(runner.stem)
        finished = True
    finally:
        unload = " && ".join(f"rmmod {name}" for name in reversed(loaded))
        if unload and finished:
            _step(conn, unload, "unloading " + ", ".join(reversed(loaded)))
        elif unload:  # best effort: the step that failed is what the caller hears about
            conn.run(unload.replace(" && ", "; "), timeout=STEP_TIMEOUT_S)
    _step(conn, f"echo '{MARKER} end' > /dev/kmsg", "marking the kernel log")
    dmesg = _step(conn, "dmesg", "dmesg")
    start = dmesg.rfind(f"{MARKER} start")
    return dmesg[start:] if start >= 0 else dmesg


def run(
    image: Image,
    kunit: Path,
    modules: Sequence[Path],
    runner: Path,
    target: str,
    count: int,
    *,
    name: str,
    progress: Progress,
) -> GuestRun:
    """:func:`run_on` a node of its own; the log scanned for kernel reports."""
    started = time.monotonic()
    with node(image, name=name, progress=progress) as (conn, accel):
        release = _step(conn, "uname -r", "uname").strip()
        log = run_on(conn, kunit, modules, runner, target, count, progress=progress)
    reports = tuple(logscan.scan(log, benign_taint=BENIGN_TAINT))
    return GuestRun(log, reports, release, accel, time.monotonic() - started)
