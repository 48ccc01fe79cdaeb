"""A user's arm64-only C program built and run on two arm64 nodes by `obmm-testbed run`.

examples/arm64/handoff.c hands buffers back and forth between an exporter on node 0 and an
importer on node 1 with `dmb osh`/`dmb ishst` fences and `dc civac` around every hand-over (it
refuses to build anywhere but on arm64).  Its directory is copied outside the checkout, as a
user's would be, and one `run` line copies it to both nodes, builds it there with the guest's gcc
(`make`), starts the exporter as a service and the importer beside it.  Both ends check every
word of every round and exit 0; nothing is left behind.

Only on arm64 suites (the arm64 stage, `make arm64-test`): elsewhere the image it needs may not
be built, and the x86 suites have nothing arm64 to learn from it.  The stage lists this file
before the ones on its session cluster, so the two pairs never run at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obmm.testbed.paths import repo_root, run_root
from obmm.testbed.settings import Settings, scaled
from obmm.testbed.vm.cluster import RUN_PREFIX

pytestmark = [
    pytest.mark.testbed_fabric,  # the decoder address from the testbed's window files
    pytest.mark.skipif(
        Settings.from_env().arch != "arm64",
        reason="arm64 suites only (OBMM_TESTBED_ARCH=arm64): the program is arm64 code",
    ),
]

EXAMPLE = repo_root() / "examples" / "arm64"


def run_handoff(
    tmp_path: Path, *extra: str, make: str = "make"
) -> tuple[subprocess.CompletedProcess[str], str]:
    """examples/arm64 copied as a user's directory, built and run by one `run --arch arm64`
    line on two nodes (`extra`: more of its options); the process and its output."""
    work = tmp_path / "handoff"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("handoff", "*.o"))
    name = f"arm64-handoff-{os.getpid()}"
    argv = [
        sys.executable, "-m", "obmm.testbed.cli.main", "run", "--arch", "arm64",
        "--nodes", "2", "--name", name, "--dir", str(work), "--timeout", str(scaled(300)),
        "--node", f"0={make} && exec ./handoff export",
        "--node", f"1={make} && ./handoff import",
        "--service", "0", "--ready-line", "serving handle", *extra,
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=scaled(900), check=False
    )  # fmt: skip
    print(f"obmm-testbed run --arch arm64 {' '.join(extra)}: {time.monotonic() - t0:.1f} s\n"
          f"{proc.stdout}\n{proc.stderr[-3000:]}")  # fmt: skip
    # The cluster is gone with its run directory.
    assert not list(run_root().glob(f"{RUN_PREFIX}{name}*"))
    return proc, proc.stdout


def test_handoff_with_arm64_fences_builds_and_runs_on_two_arm64_nodes(tmp_path: Path) -> None:
    proc, out = run_handoff(tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-4000:]}"
    lines = out.splitlines()
    for node in (0, 1):  # built in each guest, by its compiler, from the copied sources
        assert any(
            ln.startswith(f"[node{node}] ") and ln.endswith("-o handoff handoff.c") for ln in lines
        ), out
    assert any(
        ln.startswith("[node1] handoff: aarch64, ") and "node 0's mem_id" in ln for ln in lines
    ), out
    assert any(
        ln.startswith("[node1] handoff: 8 rounds of ")
        and "(dmb osh, dmb ishst, dc civac), 0 wrong words" in ln
        for ln in lines
    ), out
    assert "[node0] handoff: answered 8 rounds, 0 wrong words received" in lines, out
    assert "[node0] handoff: unexported" in lines, out


@pytest.mark.parametrize("maintained", [True, False], ids=["dc-civac", "no-dc"])
def test_strict_coherence_counts_the_programs_own_dc_civac(
    tmp_path: Path, maintained: bool
) -> None:
    """Under --coherence strict each node caches what its cacheable mappings touch until
    maintenance; on arm64 the program's own `dc civac` is maintenance (kmod/obmm_emu/
    usermaint.c).  With it the hand-off is right; built without it (make NO_DC=1) the exporter
    never sees the importer's round 1 (its stores stay in the importer's cache), as on a UB host."""
    make = "make" if maintained else "make NO_DC=1"
    proc, out = run_handoff(tmp_path, "--coherence", "strict", make=make)
    if maintained:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-4000:]}"
        assert "[node0] handoff: answered 8 rounds, 0 wrong words received" in out, out
    else:  # whichever end waits out its 20 s first says so (the other may see the revocation)
        said = out + proc.stderr
        assert proc.returncode != 0, said
        assert "[node0] handoff: round 1 never came" in said or (
            "[node1] handoff: no answer to round 1" in said
        ), said
