"""OBMM_CMD_DECLARE_PREIMPORT / OBMM_CMD_UNDECLARE_PREIMPORT.

Reference: obmm-uapi-and-driver.md section 2.6.  The emulator makes every
argument check, then cannot hot-add remote memory (no OLK numa_remote):
a valid declaration fails with EOPNOTSUPP, so nothing is ever registered.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from obmm_fixtures import SZ_2M, SZ_128M, Fabric, expect_errno, exported

import obmm

pytest_plugins = ["obmm_fixtures"]

pytestmark = pytest.mark.emulator_only


def memory_block_size() -> int:
    try:
        return int(open("/sys/devices/system/memory/block_size_bytes").read().strip(), 16)
    except OSError:
        return SZ_128M


@pytest.fixture
def block() -> int:
    return memory_block_size()


@pytest.fixture
def pa(fabric: Fabric, block: int) -> int:
    base = fabric.window_base() + block
    return (base + block - 1) // block * block


def test_pa_not_block_aligned_is_einval(
    dev: obmm.Obmm, fabric: Fabric, pa: int, block: int
) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, pa + SZ_2M, block, scna=fabric.cna)


def test_length_not_block_multiple_is_einval(
    dev: obmm.Obmm, fabric: Fabric, pa: int, block: int
) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, pa, block + SZ_2M, scna=fabric.cna)


def test_overflow_is_einval(dev: obmm.Obmm, fabric: Fabric, block: int) -> None:
    top = (1 << 64) - block
    expect_errno(errno.EINVAL, dev.declare_preimport, top, 2 * block, scna=fabric.cna)


def test_length_zero_is_einval(dev: obmm.Obmm, fabric: Fabric, pa: int) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, pa, 0, scna=fabric.cna)


def test_flags_is_einval(dev: obmm.Obmm, fabric: Fabric, pa: int, block: int) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, pa, block, scna=fabric.cna, flags=1)


def test_unknown_scna_is_enodev(dev: obmm.Obmm, fabric: Fabric, pa: int, block: int) -> None:
    expect_errno(errno.ENODEV, dev.declare_preimport, pa, block, scna=fabric.cna + 1)


@pytest.mark.parametrize("dist", [1, 10])
def test_local_base_dist_is_einval(
    dev: obmm.Obmm, fabric: Fabric, pa: int, block: int, dist: int
) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, pa, block, scna=fabric.cna, base_dist=dist)


def test_pa_zero_is_einval(dev: obmm.Obmm, fabric: Fabric, block: int) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, 0, block, scna=fabric.cna)


def test_overlap_with_direct_import_is_eexist(dev: obmm.Obmm, fabric: Fabric, block: int) -> None:
    # The direct import needs a live export with its tokenid (emulated UMMU check).
    with exported(dev) as exp:
        addr = fabric.loopback_addr(dev, exp.mem_id)
        imp = dev.import_(addr, SZ_2M, scna=fabric.cna, tokenid=exp.tokenid)
        try:
            start = addr // block * block
            expect_errno(errno.EEXIST, dev.declare_preimport, start, block, scna=fabric.cna)
        finally:
            dev.unimport(imp.mem_id)


def test_non_ub_memory_is_einval(dev: obmm.Obmm, fabric: Fabric, block: int) -> None:
    expect_errno(errno.EINVAL, dev.declare_preimport, block, block, scna=fabric.cna)


def test_valid_declaration_is_eopnotsupp(
    dev: obmm.Obmm, fabric: Fabric, pa: int, block: int
) -> None:
    expect_errno(errno.EOPNOTSUPP, dev.declare_preimport, pa, block, scna=fabric.cna)


def test_undeclare_flags_is_einval(dev: obmm.Obmm, pa: int, block: int) -> None:
    expect_errno(errno.EINVAL, dev.undeclare_preimport, pa, block, flags=1)


def test_undeclare_unregistered_is_efault(dev: obmm.Obmm, pa: int, block: int) -> None:
    expect_errno(errno.EFAULT, dev.undeclare_preimport, pa, block)


def test_procfs_lists_no_preimport_range() -> None:
    lines = Path("/proc/obmm/preimport_info").read_text().splitlines()
    assert lines == ["pa_start - pa_end : dcna scna deid seid nid"]
