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

import errno
import json
import platform
import subprocess
import sys

import pytest
from obmm_fixtures import SZ_2M, ChildResult, Fabric, exported, imported

import obmm

pytest_plugins = ["obmm_fixtures"]

#: What the child runs: map the region (page or PMD granule), write a pattern, hand the
#: address to every path, then read the pattern back.  Prints one JSON object.
PROBE = r"""
import errno, json, sys
import obmm
from obmm.fuzz import handoff as h
mem_id, pmd, size = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
names = sys.argv[4].split(",")
def name(e):
    return errno.errorcode.get(e, str(e)) if e else "ok"
out = {}
with obmm.Obmm() as dev, obmm.ShmDev(mem_id) as shm, shm.mmap(size, pmd=pmd) as m:
    for off in range(0, size, 1 << 21):
        m.write(off, b"pattern!")
    a = m.addr
    calls = {
        "futex_wake": lambda: h.futex_wake(a),
        "futex_wait": lambda: h.futex_wait(a),
        "futex_wake_private": lambda: h.futex_wake(a, private=True),
        "vmsplice": lambda: h.vmsplice(a),
        "splice": lambda: h.splice_from(shm.fd),
        "process_vm_readv": lambda: h.process_vm(a, 8, write=False),
        "process_vm_writev": lambda: h.process_vm(a, 8, write=True),
        "madvise_dontneed": lambda: h.madvise(a, size, h.MADV_DONTNEED),
        "madvise_willneed": lambda: h.madvise(a, size, h.MADV_WILLNEED),
        "madvise_dofork": lambda: h.madvise(a, size, h.MADV_DOFORK),
        "mlock": lambda: h.mlock(a, size),
    }
    def export_pid():
        try:
            exp = dev.export_pid(a, 1 << 21)
        except OSError as exc:
            return exc.errno
        dev.unexport(exp.mem_id)
        return 0
    calls["export_pid"] = export_pid
    def direct(write):
        with h.direct_file() as fd:
            return -1 if fd is None else h.direct_io(fd, a, 4096, write)
    calls["o_direct_write"] = lambda: direct(True)
    calls["o_direct_read"] = lambda: direct(False)
    def ptrace():
        word, err = h.ptrace_peek(a)
        return err or (0 if word == b"pattern!" else errno.EIO)
    calls["ptrace_peek"] = ptrace
    for n in names:
        got = calls[n]()
        out[n] = "skip" if got == -1 else name(got)
    out["readback"] = all(m.read(off, 8) == b"pattern!" for off in range(0, size, 1 << 21))
print(json.dumps(out))
"""

#: What every correct kernel answers for a pfn mapping (the Debian 6.1 guests measured).
EXPECTED = {
    # a shared futex resolves the address with get_user_pages: a pfn mapping has no page
    "futex_wake": "EFAULT",
    "futex_wait": "EFAULT",
    # a private one only reads the word
    "futex_wake_private": "ok",
    "vmsplice": "EFAULT",
    # shmdev files have no splice_read
    "splice": "EINVAL",
    "process_vm_readv": "EFAULT",
    "process_vm_writev": "EFAULT",
    # the pages cannot be pinned: "pin memory failed"
    "export_pid": "EFAULT",
    "o_direct_write": "EFAULT",
    "o_direct_read": "EFAULT",
    # ptrace falls back to the VMA's .access
    "ptrace_peek": "ok",
    # VM_LOCKED | VM_PFNMAP: nothing to drop; VM_IO: cannot be made inheritable
    "madvise_dontneed": "EINVAL",
    "madvise_willneed": "ok",
    "madvise_dofork": "EINVAL",
    # special VMAs are skipped by mlock
    "mlock": "ok",
}


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
    assert skipped <= {"o_direct_write", "o_direct_read"}, skipped
    assert {n: v for n, v in got.items() if n not in skipped} == {
        n: v for n, v in EXPECTED.items() if n not in skipped
    }


def test_a_futex_on_a_revoked_mapping_is_still_efault(
    dev: obmm.Obmm, fabric: Fabric, child: object
) -> None:
    """After revocation zapped the entries, GUP faults into .fault (SIGBUS in a user access):
    the futex gets EFAULT, not a signal or a report."""
    code = f"""
import obmm, os
from obmm.fuzz import handoff as h
dev = obmm.Obmm()
exp = dev.export({2 * SZ_2M})
base = int(open("/sys/kernel/obmm_emu/windows/{fabric.node_id}/base").read(), 0)
pa = dev.query_pa_by_memid(exp.mem_id)
imp = dev.import_(base + pa, {2 * SZ_2M}, scna={fabric.cna}, tokenid=exp.tokenid)
shm = obmm.ShmDev(imp.mem_id)
m = shm.mmap({2 * SZ_2M}, pmd=True)
m.write(0, b"x")
dev.unexport(exp.mem_id)
print(h.futex_wake(m.addr), h.futex_wake(m.addr + 8, private=True))
m.close(); shm.close(); dev.unimport(imp.mem_id)
"""
    res: ChildResult = child(code)  # type: ignore[operator]
    assert res.returncode == 0, res.stderr
    # a private futex only reads the word: the revoked page faults, and futex reports EFAULT
    assert res.stdout.split() == [str(errno.EFAULT), str(errno.EFAULT)]
