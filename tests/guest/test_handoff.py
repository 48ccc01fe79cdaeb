"""A mapped shmdev address handed to other kernel paths, as users' programs do.

A mapping of ``/dev/obmm_shmdev<id>`` is a pfn mapping: no struct page stands behind it (a
window BAR, pool memory above ``mem=``).  Whatever looks pages up from an address must refuse it
(EFAULT) or take the VMA's own ``.access`` (ptrace), never read a struct page.  Before the fix, a
PMD-granule mapping had huge pfn entries that the 6.1 kernel cannot mark special, and
``get_user_pages_fast()`` took them for transparent huge pages: the issue's reproducer (a 4 MiB
ALLOW_MMAP export mapped with the PMD flag, one byte written, ``futex(FUTEX_WAKE)`` on it)
oopsed in ``try_grab_folio``, and so did EXPORT_PID, vmsplice and O_DIRECT of such an address.

Each case runs in a child process, so an oops takes the child, not the suite; the kernel-log
guard fails the test on any report.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from obmm_fixtures import SZ_2M, Fabric, exported, imported

import obmm
from obmm.fuzz import handoff

pytest_plugins = ["obmm_fixtures"]

#: What the child runs: map the region (page or PMD granule), write a pattern at every 2 MiB,
#: hand the address to each path (obmm.fuzz.handoff.call), then read the pattern back.  Prints
#: one JSON object: each path's answer ("skip" where it cannot be made) and the read-back.
PROBE = r"""
import json, sys
import obmm
from obmm.fuzz import handoff as h
mem_id, pmd, size = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
out = {}
with obmm.Obmm() as dev, obmm.ShmDev(mem_id) as shm, shm.mmap(size, pmd=pmd) as m:
    for off in range(0, size, 1 << 21):
        m.write(off, b"pattern!")
    for name in sys.argv[4].split(","):
        got = h.call(name, m.addr, size, fd=shm.fd, dev=dev)
        out[name] = "skip" if got is None else h.errname(got)
    out["readback"] = all(m.read(off, 8) == b"pattern!" for off in range(0, size, 1 << 21))
print(json.dumps(out))
"""

#: What a correct kernel answers for a live pfn mapping (obmm.fuzz.handoff.PATHS).
EXPECTED = {name: answer.live for name, answer in handoff.PATHS.items()}


def run_probe(mem_id: int, pmd: bool, size: int, names: list[str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(mem_id), "1" if pmd else "0", str(size), ",".join(names)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, (
        f"the probe died ({proc.returncode}): an oops kills the process that hit it\n"
        f"{proc.stderr[-2000:]}"
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_issues_reproducer_futex_wake_on_a_pmd_mapping(dev: obmm.Obmm) -> None:
    """A 4 MiB ALLOW_MMAP export, mapped with OBMM_MMAP_FLAG_HUGETLB_PMD, one byte written,
    FUTEX_WAKE on it: EFAULT (it oopsed in try_grab_folio from get_user_pages_fast)."""
    with exported(dev, 2 * SZ_2M) as exp:
        got = run_probe(exp.mem_id, True, 2 * SZ_2M, ["futex_wake"])
    assert got == {"futex_wake": "EFAULT", "readback": True}


@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
@pytest.mark.parametrize("side", ["export", "import"])
def test_every_path_refuses_or_uses_access(
    dev: obmm.Obmm, fabric: Fabric, pmd: bool, side: str
) -> None:
    """Every path on an export's and on a (loopback) import's mapping, both granules: the
    errno each gives a pfn mapping, and the mapping still holds what was written."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("futex numbers known for x86_64 and aarch64 only")
    names = sorted(EXPECTED)
    with exported(dev, 2 * SZ_2M) as exp:
        if side == "export":
            got = run_probe(exp.mem_id, pmd, 2 * SZ_2M, names)
        else:
            with imported(dev, fabric, exp) as imp:
                got = run_probe(imp.mem_id, pmd, 2 * SZ_2M, names)
    assert got.pop("readback") is True
    skipped = {n for n, v in got.items() if v == "skip"}
    assert skipped <= set(handoff.NEEDS_DIRECT_FILE), skipped
    assert {n: v for n, v in got.items() if n not in skipped} == {
        n: v for n, v in EXPECTED.items() if n not in skipped
    }


REVOKED_PROBE = r"""
import json, sys
import obmm
from obmm.fuzz import handoff as h
node, cna, size, pmd = (int(a) for a in sys.argv[1:5])
win = f"/sys/kernel/obmm_emu/windows/{node}"
base = int(open(f"{win}/base").read(), 0)
try:
    base -= int(open(f"{win}/remote_base").read(), 0)  # the node's RAM base (arm64)
except FileNotFoundError:
    pass
out = {}
with obmm.Obmm() as dev:
    exp = dev.export(size)
    imp = dev.import_(base + dev.query_pa_by_memid(exp.mem_id), size, scna=cna,
                      tokenid=exp.tokenid)
    with obmm.ShmDev(imp.mem_id) as shm, shm.mmap(size, pmd=bool(pmd)) as m:
        m.write(0, b"x")
        dev.unexport(exp.mem_id)  # revokes the loopback import at once
        for name in sys.argv[5].split(","):
            got = h.call(name, m.addr, size, fd=shm.fd, dev=dev, value=0)
            out[name] = "skip" if got is None else h.errname(got)
    dev.unimport(imp.mem_id)
print(json.dumps(out))
"""


@pytest.mark.emulator_only  # the emulator's revocation (emulated UMMU): FIDELITY.md
@pytest.mark.parametrize("pmd", [False, True], ids=["page", "pmd"])
def test_every_path_on_a_revoked_mapping(dev: obmm.Obmm, fabric: Fabric, pmd: bool) -> None:
    """After revocation zapped the entries, a lookup faults into .fault, whose SIGBUS a kernel
    access turns into EFAULT (ptrace: EIO): the answers of a revoked mapping, no signal and
    no report."""
    names = sorted(handoff.PATHS)
    proc = subprocess.run(
        [sys.executable, "-c", REVOKED_PROBE, str(fabric.node_id), str(fabric.cna),
         str(2 * SZ_2M), str(int(pmd)), ",".join(names)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    skipped = {n for n, v in got.items() if v == "skip"}
    assert skipped <= set(handoff.NEEDS_DIRECT_FILE), skipped
    assert got == {n: a.revoked for n, a in handoff.PATHS.items() if n not in skipped}
