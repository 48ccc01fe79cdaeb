"""kmemleak on the debug kernel: a baseline after boot, a scan before the nodes stop, a verdict.

The debug kernel (:mod:`obmm.testbed.builds.debugkernel`) has CONFIG_DEBUG_KMEMLEAK without the
automatic scan thread, so nothing is reported unless asked:

* :func:`baseline` (provisioning, before our modules load): scan and ``clear``, so whatever
  boot itself left unreferenced is never blamed on a test;
* :func:`scan_nodes` (a cluster about to stop): scan twice, five seconds apart (an object only
  a CPU register or a freshly freed list pointed at is not reported twice), and write each
  node's report to ``<results>/kmemleak/<cluster>-node<i>.txt``;
* :func:`verdict` (``python -m obmm.testbed.vm.kmemleak check``, the end of ``make debug-test``):
  any report fails the stage, and so does a stage that scanned nothing.

On a kernel without kmemleak (Debian's) every step is a no-op: the file does not exist.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from obmm.testbed import paths
from obmm.testbed.ssh import Connection, SshError

log = logging.getLogger(__name__)

KMEMLEAK = "/sys/kernel/debug/kmemleak"
# One guest command each; `[ -w ]` keeps them no-ops without kmemleak.
BASELINE_CMD = f"[ ! -w {KMEMLEAK} ] || {{ echo scan > {KMEMLEAK} && echo clear > {KMEMLEAK}; }}"
SCAN_CMD = (
    f"if [ -w {KMEMLEAK} ]; then echo scan > {KMEMLEAK} && sleep 5 && echo scan > {KMEMLEAK} "
    f"&& cat {KMEMLEAK}; else echo NO-KMEMLEAK; fi"
)
NO_KMEMLEAK = "NO-KMEMLEAK"
# A scan walks all of memory; under TCG with KASAN that takes a while.
SCAN_TIMEOUT_S = 300.0
UNSCANNED = ".unscanned"


def report_dir() -> Path:
    return paths.results_dir() / "kmemleak"


def baseline(conn: Connection) -> None:
    """Forget what boot left unreferenced (before the modules under test load)."""
    conn.run(BASELINE_CMD, timeout=SCAN_TIMEOUT_S, check=True)


def scan_nodes(
    name: str,
    nodes: Sequence[int],
    connect: Callable[[int], Connection],
    alive: Callable[[int], bool],
) -> None:
    """Scan every live node and record its report (empty file: scanned, nothing found)."""
    out = report_dir()
    out.mkdir(parents=True, exist_ok=True)
    for i in nodes:
        stem = f"{name}-node{i}"
        if not alive(i):
            (out / f"{stem}{UNSCANNED}").write_text("the node had died before the scan\n")
            continue
        try:
            with connect(i) as conn:
                res = conn.run(SCAN_CMD, timeout=SCAN_TIMEOUT_S)
        except (SshError, OSError) as exc:
            (out / f"{stem}{UNSCANNED}").write_text(f"cannot scan: {exc}\n")
            continue
        if res.out.strip() == NO_KMEMLEAK:
            continue  # not a kmemleak kernel: nothing to record
        if not res.ok:
            (out / f"{stem}{UNSCANNED}").write_text(f"scan failed: {res.err.strip()}\n")
            continue
        (out / f"{stem}.txt").write_text(res.out)
        if res.out.strip():
            log.error("%s: kmemleak reports:\n%s", stem, res.out)


def verdict(directory: Path) -> tuple[bool, str]:
    """(passed, summary) of the reports under `directory`."""
    scanned = sorted(directory.glob("*.txt")) if directory.is_dir() else []
    unscanned = sorted(directory.glob(f"*{UNSCANNED}")) if directory.is_dir() else []
    lines = []
    reported = [p for p in scanned if p.read_text().strip()]
    for path in reported:
        text = path.read_text()
        count = text.count("unreferenced object")
        lines.append(f"{path.stem}: {count} kmemleak report(s)\n{text}")
    for path in unscanned:
        lines.append(
            f"{path.name.removesuffix(UNSCANNED)}: not scanned: {path.read_text().strip()}"
        )
    if not scanned:
        lines.append(f"no kmemleak scan was recorded in {directory}: the check ran on nothing")
    passed = bool(scanned) and not reported
    lines.append(
        f"kmemleak: {len(scanned)} node scan(s), {len(reported)} with reports, "
        f"{len(unscanned)} not scanned: {'PASS' if passed else 'FAIL'}"
    )
    return passed, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m obmm.testbed.vm.kmemleak")
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check", help="fail if any recorded node scan has a report")
    check.add_argument("directory", nargs="?", type=Path, default=None)
    sub.add_parser("clear", help="remove the recorded scans (start of a stage)")
    args = parser.parse_args(argv)
    directory = args.directory if getattr(args, "directory", None) else report_dir()
    if args.cmd == "clear":
        for path in directory.glob("*"):
            path.unlink()
        return 0
    passed, summary = verdict(directory)
    print(summary)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
