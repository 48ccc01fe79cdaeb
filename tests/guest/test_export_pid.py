"""OBMM_CMD_EXPORT_PID: pin a process's memory; the real driver's flag, length and page rules.

Reference: obmm-uapi-and-driver.md section 2.2 (obmm_export_from_user.c).
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest
from obmm_fixtures import (
    MAP_HUGETLB,
    SHMDEV_SYSFS,
    SZ_2M,
    SZ_4K,
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
