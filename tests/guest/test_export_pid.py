"""OBMM_CMD_EXPORT_PID: pin a process's memory; the real driver's flag, length and page rules.

Reference: docs/obmm-driver.md sections 3.3 and 4.3 (obmm_export_from_user.c).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from obmm_fixtures import (
    MAP_HUGETLB,
    SHMDEV_SYSFS,
    SZ_2M,
    SZ_4K,
    ChildResult,
    aligned_anonymous,
    buffer_address,
    expect_errno,
)

import obmm
from obmm import abi
from obmm.abi import ffi

pytest_plugins = ["obmm_fixtures"]


@pytest.fixture
def anon() -> int:
    buf, addr = aligned_anonymous(SZ_2M)
    yield addr
    buf.close()


@pytest.fixture
def huge(hugepages: int) -> int:
    buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    buf[:SZ_4K] = b"\x02" * SZ_4K
    yield buffer_address(buf)
    buf.close()


@pytest.mark.parametrize(
    "flags",
    [abi.OBMM_EXPORT_FLAG_ALLOW_MMAP, abi.OBMM_EXPORT_FLAG_FAST, 0x4, 0x3],
    ids=["allow_mmap", "fast", "unknown", "both"],
)
def test_any_flag_is_einval(dev: obmm.Obmm, anon: int, flags: int) -> None:
    expect_errno(errno.EINVAL, dev.export_pid, anon, SZ_2M, flags=flags)


def test_length_zero_is_einval(dev: obmm.Obmm, anon: int) -> None:
    expect_errno(errno.EINVAL, dev.export_pid, anon, 0)


@pytest.mark.parametrize("length", [SZ_4K, SZ_2M + SZ_4K])
def test_length_not_pmd_multiple_is_einval(dev: obmm.Obmm, anon: int, length: int) -> None:
    expect_errno(errno.EINVAL, dev.export_pid, anon, length)


def test_priv_len_513_is_einval(dev: obmm.Obmm, anon: int) -> None:
    expect_errno(errno.EINVAL, dev.export_pid, anon, SZ_2M, priv=b"p" * (abi.OBMM_MAX_PRIV_LEN + 1))


def test_vendor_len_129_is_einval(dev: obmm.Obmm, anon: int) -> None:
    expect_errno(
        errno.EINVAL,
        dev.export_pid,
        anon,
        SZ_2M,
        vendor_info=b"v" * (abi.OBMM_MAX_VENDOR_LEN + 1),
    )


def test_priv_bad_pointer_is_efault(dev: obmm.Obmm, anon: int) -> None:
    cmd = abi.new("struct obmm_cmd_export_pid")
    cmd.va = ffi.cast("void *", anon)
    cmd.length = SZ_2M
    cmd.priv_len = 8
    cmd.priv = ffi.cast("void *", 16)
    expect_errno(errno.EFAULT, dev.ioctl, "OBMM_CMD_EXPORT_PID", cmd)


def test_flags_checked_before_length(dev: obmm.Obmm, anon: int) -> None:
    expect_errno(errno.EINVAL, dev.export_pid, anon, 0, flags=0x4)


def test_unknown_pid_is_esrch(dev: obmm.Obmm, anon: int) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    expect_errno(errno.ESRCH, dev.export_pid, anon, SZ_2M, pid=pid_max + 1)


def test_anonymous_memory_is_eopnotsupp(dev: obmm.Obmm, anon: int) -> None:
    """Only hugetlbfs pages pass the "hisi workarounds" check (THP / 4K do not)."""
    expect_errno(errno.EOPNOTSUPP, dev.export_pid, anon, SZ_2M)


def test_unmapped_range_is_efault(dev: obmm.Obmm) -> None:
    """pin_user_pages() fails on an unmapped range; its errno is returned."""
    expect_errno(errno.EFAULT, dev.export_pid, SZ_2M, SZ_2M)


def test_hugetlb_export_and_shmdev_refused(dev: obmm.Obmm, huge: int) -> None:
    exp = dev.export_pid(huge, SZ_2M, pid=os.getpid())
    try:
        assert exp.tokenid != 0 and exp.uba != 0
        sysfs = SHMDEV_SYSFS / f"obmm_shmdev{exp.mem_id}"
        assert (sysfs / "export_info" / "memory_from_user").read_text() == "1\n"
        # mem_cap is 0: neither open mode is allowed.
        expect_errno(errno.EPERM, obmm.ShmDev, exp.mem_id)
        expect_errno(errno.EPERM, obmm.ShmDev, exp.mem_id, sync=True)
    finally:
        dev.unexport(exp.mem_id)


def test_hugetlb_export_by_pid_zero(dev: obmm.Obmm, huge: int) -> None:
    exp = dev.export_pid(huge, SZ_2M)
    dev.unexport(exp.mem_id)


def test_hugetlb_export_pins_and_addr_query(dev: obmm.Obmm, huge: int) -> None:
    exp = dev.export_pid(huge, SZ_2M)
    try:
        pa = dev.query_pa_by_memid(exp.mem_id, 0x1000)
        assert dev.query_memid_by_pa(pa) == (exp.mem_id, 0x1000)
    finally:
        dev.unexport(exp.mem_id)


def test_unexport_keeps_user_data(dev: obmm.Obmm, hugepages: int) -> None:
    buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
    try:
        buf[:5] = b"hello"
        exp = dev.export_pid(buffer_address(buf), SZ_2M)
        dev.unexport(exp.mem_id)
        assert buf[:5] == b"hello"
    finally:
        buf.close()


# Unprivileged: the caller keeps its /dev/obmm descriptor and drops to nobody.
NOBODY = 65534
DROP_AND_EXPORT = """
import errno, os, sys
import obmm
dev = obmm.Obmm()
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
try:
    exp = dev.export_pid({va}, {length}, pid={pid})
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
else:
    print("exported", exp.mem_id)
"""


@pytest.mark.emulator_only
def test_other_users_process_is_eperm(child: Callable[..., ChildResult]) -> None:
    """The caller must be allowed to access the target (emulator: ptrace-like rule).

    The real driver only resolves the pid; the emulator refuses, before
    pinning anything, a target whose credentials differ from the caller's
    unless the caller has CAP_SYS_PTRACE (FIDELITY.md).
    """
    res = child(DROP_AND_EXPORT.format(uid=NOBODY, va=SZ_2M, length=SZ_2M, pid=1))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["EPERM"]


@pytest.mark.emulator_only
def test_own_process_allowed_after_dropping_privileges(
    child: Callable[..., ChildResult],
) -> None:
    """The access rule lets a caller reach its own memory (pid 0 and its own pid)."""
    res = child(DROP_AND_EXPORT.format(uid=NOBODY, va=SZ_2M, length=SZ_2M, pid=0))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["EFAULT"]  # unmapped range: the pin's errno


def _fork_target(body: Callable[[int], None], size: int) -> tuple[int, bytes]:
    """A child running `body` (which never returns); its pid and the `size` bytes it reports
    on its pipe first."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        body(wfd)
    os.close(wfd)
    try:
        return pid, os.read(rfd, size)
    finally:
        os.close(rfd)


def _exiting_target(wfd: int) -> None:
    """Child: map a hugetlbfs page, report its address, then exit at once."""
    try:
        buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
        buf[:SZ_4K] = b"\x03" * SZ_4K
        os.write(wfd, buffer_address(buf).to_bytes(8, "little"))
    except OSError:
        os.write(wfd, bytes(8))
    os._exit(0)


def test_export_pid_racing_the_targets_exit(dev: obmm.Obmm, hugepages: int) -> None:
    """EXPORT_PID of a process that exits meanwhile: success or a clean errno, no report.

    The mm is held (mmget) for the whole pin, so the target's exit cannot tear
    its address space down under pin_user_pages_remote().
    """
    outcomes: set[str] = set()
    for _ in range(12):
        pid, reply = _fork_target(_exiting_target, 8)
        va = int.from_bytes(reply, "little")
        try:
            if not va:
                outcomes.add("no hugepage")
                continue
            try:
                exp = dev.export_pid(va, SZ_2M, pid=pid)
            except OSError as exc:
                assert exc.errno in (errno.ESRCH, errno.EFAULT, errno.ENOMEM), exc
                outcomes.add(errno.errorcode[exc.errno or 0])
            else:
                outcomes.add("exported")
                dev.unexport(exp.mem_id)
        finally:
            os.waitpid(pid, 0)
    assert outcomes - {"no hugepage"}, outcomes


PIN_DELAY_MS = Path("/sys/module/obmm/parameters/test_pin_delay_ms")


def _lingering_target(wfd: int) -> None:
    """Child: a hugetlbfs page with a pattern; report its address and frame, then wait."""
    try:
        buf = mmap.mmap(-1, SZ_2M, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
        buf[:SZ_4K] = b"\x5a" * SZ_4K
        va = buffer_address(buf)
        with open("/proc/self/pagemap", "rb") as pm:
            pm.seek(va // SZ_4K * 8)
            pfn = int.from_bytes(pm.read(8), "little") & ((1 << 55) - 1)
        os.write(wfd, va.to_bytes(8, "little") + pfn.to_bytes(8, "little"))
        time.sleep(120)
    finally:
        os._exit(0)


@pytest.mark.emulator_only
def test_a_target_reaped_while_the_export_waits_to_pin(dev: obmm.Obmm, hugepages: int) -> None:
    """The target is killed, and reaped, after EXPORT_PID took its mm and before the pin (the
    module's test-only test_pin_delay_ms holds the export there).  The mm is held across the
    pin, so the pin still finds the whole address space: the export succeeds with the target's
    own page, and nothing is reported (with the mm dropped before the pin, as before the fix,
    the pin finds the address space torn down: EFAULT, or worse without an mm_count)."""
    pid, reply = _fork_target(_lingering_target, 16)
    if len(reply) < 16:
        os.waitpid(pid, 0)
        pytest.fail("the target could not map a hugetlbfs page")
    va, pfn = int.from_bytes(reply[:8], "little"), int.from_bytes(reply[8:], "little")
    outcome: list[object] = []

    def export() -> None:
        try:
            outcome.append(dev.export_pid(va, SZ_2M, pid=pid))
        except OSError as exc:
            outcome.append(exc)

    PIN_DELAY_MS.write_text("1500")
    try:
        worker = threading.Thread(target=export)
        worker.start()
        time.sleep(0.3)  # the export has the mm and waits
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        worker.join(60)
    finally:
        PIN_DELAY_MS.write_text("0")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    assert outcome and isinstance(outcome[0], obmm.Export), outcome
    try:
        assert dev.query_pa_by_memid(outcome[0].mem_id) == pfn * SZ_4K
    finally:
        dev.unexport(outcome[0].mem_id)


@pytest.mark.emulator_only
@pytest.mark.parametrize(
    "length",
    [1 << 40, 1 << 39, 1 << 62, (1 << 64) - SZ_2M],
    ids=["1TiB", "512GiB", "2^62", "max"],
)
def test_huge_length_is_enomem_before_allocating(dev: obmm.Obmm, anon: int, length: int) -> None:
    """A length beyond the machine's RAM can never be pinned: ENOMEM, no allocation.

    The real driver sizes its page array from the length first (a kernel WARN
    in kvmalloc from 1 TiB on, a huge allocation below); the emulator bounds
    it by the RAM first (FIDELITY.md).  The kernel log guard fails a WARN.
    """
    expect_errno(errno.ENOMEM, dev.export_pid, anon, length)


# Export record slots per node (OBMM_EMU_CTL_RECORDS_PER_NODE, kmod/obmm_emu/obmm_emu_ctl.h).
RECORD_SLOTS = 1024


@pytest.mark.emulator_only
def test_export_beyond_the_record_slots_is_enospc(dev: obmm.Obmm, huge: int) -> None:
    """With every control-region record slot taken, EXPORT and EXPORT_PID fail ENOSPC.

    Such an export used to succeed with no record: no node, this one included, could ever
    import it.  One 2 MiB hugetlbfs page, exported again and again, fills the slots.
    """
    made: list[obmm.Export] = []
    try:
        for _ in range(RECORD_SLOTS + 1):
            try:
                made.append(dev.export_pid(huge, SZ_2M))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        assert len(made) <= RECORD_SLOTS, f"{len(made)} exports for {RECORD_SLOTS} record slots"
        shmdevs = sorted(p.name for p in SHMDEV_SYSFS.iterdir())
        expect_errno(errno.ENOSPC, dev.export_pid, huge, SZ_2M)
        expect_errno(errno.ENOSPC, dev.export, SZ_2M)
        assert sorted(p.name for p in SHMDEV_SYSFS.iterdir()) == shmdevs, (
            "a refused export left a node"
        )
        # One slot free again: one export fits, and it can be found.
        dev.unexport(made.pop().mem_id)
        made.append(dev.export_pid(huge, SZ_2M))
    finally:
        for exp in made:
            dev.unexport(exp.mem_id)
