"""OBMM_CMD_EXPORT: every check of the real driver, in its order, with its errno.

Reference: docs/obmm-driver.md sections 3.2 and 4.2 (obmm_export_from_pool.c).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

import pytest
from obmm_fixtures import (
    SZ_2M,
    SZ_4K,
    expect_errno,
    exported,
    pool_total,
    pool_used,
    settle_pool,
)

import obmm
from obmm import abi
from obmm.abi import ffi

pytest_plugins = ["obmm_fixtures"]

MAX_NODES = abi.OBMM_MAX_LOCAL_NUMA_NODES
BAD_PTR = 16


def raw_export(dev: obmm.Obmm, **fields: object) -> obmm.abi.CData:
    """An EXPORT of 2 MiB from node 0 with `fields` overridden; returns the struct."""
    cmd = abi.new("struct obmm_cmd_export")
    cmd.size[0] = SZ_2M
    cmd.length = 1
    cmd.flags = abi.OBMM_EXPORT_FLAG_ALLOW_MMAP
    for name, value in fields.items():
        if name in ("priv", "vendor_info") and isinstance(value, int):
            value = ffi.cast("void *", value)
        setattr(cmd, name, value)
    dev.ioctl("OBMM_CMD_EXPORT", cmd)
    return cmd


def offline_node() -> int:
    online = set()
    for part in Path("/sys/devices/system/node/online").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        online.update(range(int(lo), int(hi or lo) + 1))
    for node in range(MAX_NODES):
        if node not in online:
            return node
    pytest.skip("all 16 NUMA nodes online")
    return -1


# ---- check 1: length ----


def test_length_17_is_e2big(dev: obmm.Obmm) -> None:
    expect_errno(errno.E2BIG, raw_export, dev, length=MAX_NODES + 1)


def test_length_16_accepted(dev: obmm.Obmm) -> None:
    cmd = raw_export(dev, length=MAX_NODES)
    dev.unexport(cmd.mem_id)


# ---- check 2: pxm_numa range ----


@pytest.mark.parametrize("pxm", [-1, MAX_NODES + 1, 1 << 30])
def test_pxm_numa_out_of_range_is_einval(dev: obmm.Obmm, pxm: int) -> None:
    expect_errno(errno.EINVAL, raw_export, dev, pxm_numa=pxm)


# ---- check 3: per-node sizes ----


@pytest.mark.parametrize("size", [SZ_4K, SZ_2M + SZ_4K, SZ_2M // 2])
def test_size_not_memseg_multiple_is_einval(dev: obmm.Obmm, size: int) -> None:
    expect_errno(errno.EINVAL, dev.export, size)


def test_size_on_offline_node_is_enodev(dev: obmm.Obmm) -> None:
    node = offline_node()
    sizes = [0] * (node + 1)
    sizes[node] = SZ_2M
    expect_errno(errno.ENODEV, dev.export, sizes)


def test_size_past_length_is_ignored(dev: obmm.Obmm) -> None:
    """Only `length` entries of size[] are read: garbage after them is not looked at."""
    cmd = raw_export(dev, length=1)
    cmd2 = abi.new("struct obmm_cmd_export")
    cmd2.size[0] = SZ_2M
    cmd2.size[5] = SZ_4K
    cmd2.length = 1
    dev.ioctl("OBMM_CMD_EXPORT", cmd2)
    dev.unexport(cmd2.mem_id)
    dev.unexport(cmd.mem_id)


def test_size_checked_before_flags(dev: obmm.Obmm) -> None:
    """Check order: a bad size wins over bad flags."""
    cmd = abi.new("struct obmm_cmd_export")
    cmd.size[0] = SZ_4K
    cmd.length = 1
    cmd.flags = 0x4
    expect_errno(errno.EINVAL, dev.ioctl, "OBMM_CMD_EXPORT", cmd)


# ---- check 4: total ----


def test_total_zero_is_einval(dev: obmm.Obmm) -> None:
    expect_errno(errno.EINVAL, dev.export, [0] * MAX_NODES)


def test_length_zero_is_einval(dev: obmm.Obmm) -> None:
    expect_errno(errno.EINVAL, raw_export, dev, length=0)


# ---- check 5: pxm_numa node must exist with CPUs ----


def test_pxm_numa_16_passes_range_check_then_einval(dev: obmm.Obmm) -> None:
    """16 passes the (off-by-one) range check; no node 16 has CPUs: EINVAL at check 5."""
    expect_errno(errno.EINVAL, raw_export, dev, pxm_numa=MAX_NODES)


# ---- check 6: flags, priv, vendor_info ----


@pytest.mark.parametrize("flags", [0x4, 0x8, 1 << 63])
def test_unknown_flags_are_einval(dev: obmm.Obmm, flags: int) -> None:
    expect_errno(errno.EINVAL, dev.export, SZ_2M, flags=flags)


def test_priv_len_513_is_einval(dev: obmm.Obmm) -> None:
    expect_errno(errno.EINVAL, dev.export, SZ_2M, priv=b"p" * (abi.OBMM_MAX_PRIV_LEN + 1))


def test_priv_len_512_accepted(dev: obmm.Obmm) -> None:
    with exported(dev, priv=b"p" * abi.OBMM_MAX_PRIV_LEN):
        pass


def test_priv_bad_pointer_is_efault(dev: obmm.Obmm) -> None:
    expect_errno(errno.EFAULT, raw_export, dev, priv=BAD_PTR, priv_len=8)


def test_vendor_len_129_is_einval(dev: obmm.Obmm) -> None:
    expect_errno(errno.EINVAL, dev.export, SZ_2M, vendor_info=b"v" * (abi.OBMM_MAX_VENDOR_LEN + 1))


def test_vendor_bad_pointer_is_efault(dev: obmm.Obmm) -> None:
    expect_errno(errno.EFAULT, raw_export, dev, vendor_info=BAD_PTR, vendor_len=8)


def test_priv_checked_before_vendor(dev: obmm.Obmm) -> None:
    expect_errno(
        errno.EINVAL,
        raw_export,
        dev,
        priv_len=abi.OBMM_MAX_PRIV_LEN + 1,
        vendor_info=BAD_PTR,
        vendor_len=8,
    )


# ---- check 8: allocation ----


def test_larger_than_pool_is_enomem(dev: obmm.Obmm) -> None:
    settle_pool()
    expect_errno(errno.ENOMEM, dev.export, pool_total() + SZ_2M)


def test_pool_exhaustion_is_enomem(dev: obmm.Obmm) -> None:
    settle_pool()
    free = pool_total() - pool_used()
    with exported(dev, free):
        expect_errno(errno.ENOMEM, dev.export, SZ_2M)


def test_bad_struct_pointer_is_efault(dev: obmm.Obmm) -> None:
    expect_errno(errno.EFAULT, fcntl.ioctl, dev.fd, abi.OBMM_CMD_EXPORT, BAD_PTR)


# ---- success ----


def test_export_outputs(dev: obmm.Obmm) -> None:
    with exported(dev, 2 * SZ_2M) as exp:
        assert exp.mem_id >= 1
        assert exp.tokenid != 0
        assert exp.uba != 0
        assert os.path.exists(f"/dev/obmm_shmdev{exp.mem_id}")


def test_ids_lowest_free_first(dev: obmm.Obmm) -> None:
    a = dev.export(SZ_2M)
    b = dev.export(SZ_2M)
    c = dev.export(SZ_2M)
    try:
        assert (b.mem_id, c.mem_id) == (a.mem_id + 1, a.mem_id + 2)
        dev.unexport(b.mem_id)
        d = dev.export(SZ_2M)
        assert d.mem_id == b.mem_id
        b = d
    finally:
        for e in (a, b, c):
            dev.unexport(e.mem_id)


def test_tokenids_differ(dev: obmm.Obmm) -> None:
    with exported(dev) as a, exported(dev) as b:
        assert a.tokenid != b.tokenid


def test_fast_export_uses_cleared_memory(dev: obmm.Obmm) -> None:
    settle_pool()
    with exported(dev, flags=abi.OBMM_EXPORT_FLAG_ALLOW_MMAP | abi.OBMM_EXPORT_FLAG_FAST):
        pass


def test_pool_used_accounts_export(dev: obmm.Obmm) -> None:
    before = pool_used()
    with exported(dev, 3 * SZ_2M):
        assert pool_used() == before + 3 * SZ_2M
    assert pool_used() == before


def wait_quarantine_drained(timeout: float = 10.0) -> None:
    """obmm_emu keeps unexported memory out of the pool for quarantine_ms (revocation)."""
    path = Path("/sys/kernel/obmm_emu/quarantined")
    deadline = time.monotonic() + timeout
    while path.exists() and int(path.read_text(), 0) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_exported_memory_is_zeroed(dev: obmm.Obmm) -> None:
    """Dirty a region, give it back, take the same memory again: it reads as zeros."""
    # So that both exports take the lowest free granule (obmm_emu), or the head of a full pool
    # (the real driver puts a freed granule back there when it refills).
    wait_quarantine_drained()
    settle_pool()
    with exported(dev) as exp:
        pa = dev.query_pa_by_memid(exp.mem_id)
        with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(SZ_2M) as m:
            m.write(0, b"\xa5" * SZ_2M)
    wait_quarantine_drained()
    settle_pool()
    with exported(dev) as exp2:
        assert dev.query_pa_by_memid(exp2.mem_id) == pa
        with obmm.ShmDev(exp2.mem_id) as shm, shm.mmap(SZ_2M) as m:
            assert m.read(0, SZ_2M) == bytes(SZ_2M)


ZERO_DELAY_MS = Path("/sys/module/obmm/parameters/test_zero_delay_ms")


@pytest.mark.emulator_only
def test_an_export_waits_for_the_granule_the_zero_worker_holds(dev: obmm.Obmm) -> None:
    """Right after a quarantine ends the zero worker claims the released granule to clear it.
    An EXPORT meanwhile waits for that claim and gets the lowest free memory, the granule just
    released, instead of the next one: placement does not depend on the worker (the test-only
    test_zero_delay_ms makes it hold its claim for a second here)."""
    wait_quarantine_drained()
    exp = dev.export(SZ_2M)
    pa = dev.query_pa_by_memid(exp.mem_id)
    ZERO_DELAY_MS.write_text("1000")
    try:
        dev.unexport(exp.mem_id)
        wait_quarantine_drained()
        time.sleep(0.3)  # the worker has claimed the released granule and holds it
        t0 = time.monotonic()
        with exported(dev) as again:
            waited = time.monotonic() - t0
            placed = dev.query_pa_by_memid(again.mem_id)
    finally:
        ZERO_DELAY_MS.write_text("0")
    print(f"the export waited {waited:.2f} s for the worker's claim")
    assert placed == pa, f"placed at {placed:#x}, not at the released {pa:#x}"


@pytest.mark.emulator_only
def test_uba_encodes_node_and_pa(dev: obmm.Obmm, fabric: object) -> None:
    with exported(dev) as exp:
        pa = dev.query_pa_by_memid(exp.mem_id)
        node = fabric.node_id  # type: ignore[attr-defined]
        assert exp.uba == (1 << 48) | (node << 40) | pa


def test_unknown_ioctl_is_enotty(dev: obmm.Obmm) -> None:
    expect_errno(errno.ENOTTY, fcntl.ioctl, dev.fd, abi.ioc(0, "x", 8, 0), 0)
