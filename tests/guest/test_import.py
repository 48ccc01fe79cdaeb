"""OBMM_CMD_IMPORT: flags, priv, alignment, scna, overlap, UB-memory validation.

Reference: docs/obmm-driver.md sections 3.4 and 4.5 (obmm_import.c).  On one node
every import is a loopback import through the node's own window, so these
tests are emulator-only (on hardware the decoder address comes from
management software).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from obmm_fixtures import (
    SZ_2M,
    SZ_4K,
    Fabric,
    expect_errno,
    exported,
    pool_total,
    pool_used,
    settle_pool,
    skip_if_in_pieces,
)

import obmm
from obmm import abi
from obmm.abi import ffi

pytest_plugins = ["obmm_fixtures"]

pytestmark = pytest.mark.testbed_fabric

MMAP = abi.OBMM_IMPORT_FLAG_ALLOW_MMAP
PRE = abi.OBMM_IMPORT_FLAG_PREIMPORT
NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE


@pytest.fixture
def live(dev: obmm.Obmm, fabric: Fabric) -> Iterator[tuple[int, int]]:
    """Decoder address and tokenid of a live 8 MiB export of this node."""
    with exported(dev, 4 * SZ_2M) as exp:
        yield fabric.loopback_addr(dev, exp.mem_id), exp.tokenid


@pytest.fixture
def target(live: tuple[int, int]) -> int:
    return live[0]


@pytest.fixture
def token(live: tuple[int, int]) -> int:
    """The tokenid of the `target` export (the emulated UMMU check needs it)."""
    return live[1]


@pytest.mark.parametrize(
    "flags",
    [0, 0x8, MMAP | NUMA, MMAP | PRE, PRE, MMAP | PRE | NUMA],
    ids=["none", "unknown", "mmap+numa", "mmap+preimport", "preimport", "all"],
)
def test_bad_flag_combinations_are_einval(
    dev: obmm.Obmm, fabric: Fabric, target: int, flags: int
) -> None:
    expect_errno(errno.EINVAL, dev.import_, target, SZ_2M, scna=fabric.cna, flags=flags)


def test_priv_len_513_is_einval(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(
        errno.EINVAL,
        dev.import_,
        target,
        SZ_2M,
        scna=fabric.cna,
        priv=b"p" * (abi.OBMM_MAX_PRIV_LEN + 1),
    )


def test_priv_bad_pointer_is_efault(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    cmd = abi.new("struct obmm_cmd_import")
    cmd.flags = MMAP
    cmd.addr = target
    cmd.length = SZ_2M
    cmd.scna = fabric.cna
    cmd.priv_len = 8
    cmd.priv = ffi.cast("void *", 16)
    expect_errno(errno.EFAULT, dev.ioctl, "OBMM_CMD_IMPORT", cmd)


def test_flags_checked_before_priv(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(
        errno.EINVAL,
        dev.import_,
        target,
        SZ_2M,
        scna=fabric.cna + 1,
        flags=0,
        priv=b"p" * (abi.OBMM_MAX_PRIV_LEN + 1),
    )


def test_length_zero_is_einval(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(errno.EINVAL, dev.import_, target, 0, scna=fabric.cna)


@pytest.mark.parametrize("delta", [SZ_4K, SZ_2M // 2])
def test_addr_not_2m_aligned_is_einval(
    dev: obmm.Obmm, fabric: Fabric, target: int, delta: int
) -> None:
    expect_errno(errno.EINVAL, dev.import_, target + delta, SZ_2M, scna=fabric.cna)


def test_length_not_2m_multiple_is_einval(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(errno.EINVAL, dev.import_, target, SZ_2M + SZ_4K, scna=fabric.cna)


def test_addr_zero_is_einval(dev: obmm.Obmm, fabric: Fabric) -> None:
    expect_errno(errno.EINVAL, dev.import_, 0, SZ_2M, scna=fabric.cna)


def test_addr_length_overflow_is_einval(dev: obmm.Obmm, fabric: Fabric) -> None:
    expect_errno(errno.EINVAL, dev.import_, (1 << 64) - SZ_2M, 2 * SZ_2M, scna=fabric.cna)


@pytest.mark.parametrize("dist", [1, 5, 10])
def test_numa_remote_local_base_dist_is_einval(
    dev: obmm.Obmm, fabric: Fabric, target: int, dist: int
) -> None:
    expect_errno(
        errno.EINVAL, dev.import_, target, SZ_2M, scna=fabric.cna, flags=NUMA, base_dist=dist
    )


def test_unknown_scna_is_enodev(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(errno.ENODEV, dev.import_, target, SZ_2M, scna=fabric.cna + 1)


def test_alignment_checked_before_scna(dev: obmm.Obmm, fabric: Fabric, target: int) -> None:
    expect_errno(errno.EINVAL, dev.import_, target + SZ_4K, SZ_2M, scna=fabric.cna + 1)


def test_guest_ram_is_not_ub_memory(dev: obmm.Obmm, fabric: Fabric) -> None:
    """ "Non-UBMEM memory cannot be mmaped": a PA outside every decoder window."""
    expect_errno(errno.EINVAL, dev.import_, SZ_2M, SZ_2M, scna=fabric.cna)


def test_own_kernel_ram_in_the_window_is_never_reached(dev: obmm.Obmm, fabric: Fabric) -> None:
    """An IMPORT of this node's own window + 128 MiB (its kernel's RAM, which nobody
    exported) reaches nothing: the real driver over ub_compat refuses it at the decoder
    check (ub_memory_validate_pa: only what this node's UMMU maps; issue 36, finding 3), the
    emulator makes it revoked from the start (a mmap is ENXIO)."""
    try:
        imp = dev.import_(fabric.window_base() + (128 << 20), SZ_2M, scna=fabric.cna)
    except obmm.ObmmError as err:
        assert err.errno == errno.EINVAL, err
        return
    try:
        with obmm.ShmDev(imp.mem_id) as shm:
            expect_errno(errno.ENXIO, shm.mmap, SZ_2M)
    finally:
        dev.unimport(imp.mem_id)


def test_range_past_window_end_is_einval(dev: obmm.Obmm, fabric: Fabric) -> None:
    end = fabric.window_base() + fabric.window_size()
    expect_errno(errno.EINVAL, dev.import_, end - SZ_2M, 2 * SZ_2M, scna=fabric.cna)


def test_overlap_is_eexist(dev: obmm.Obmm, fabric: Fabric, target: int, token: int) -> None:
    imp = dev.import_(target, 2 * SZ_2M, scna=fabric.cna, tokenid=token)
    try:
        expect_errno(
            errno.EEXIST, dev.import_, target + SZ_2M, 2 * SZ_2M, scna=fabric.cna, tokenid=token
        )
        expect_errno(errno.EEXIST, dev.import_, target, SZ_2M, scna=fabric.cna, tokenid=token)
        adj = dev.import_(target + 2 * SZ_2M, SZ_2M, scna=fabric.cna, tokenid=token)
        dev.unimport(adj.mem_id)
    finally:
        dev.unimport(imp.mem_id)


def test_overlap_checked_before_ub_validation(dev: obmm.Obmm, fabric: Fabric) -> None:
    """EEXIST (maple tree) comes before the window check: an overlapping range that also
    runs past the window is EEXIST.  The live import sits in the last granule of the
    export pool (the whole free pool is exported to reach it)."""
    settle_pool()
    free = pool_total() - pool_used()
    end = fabric.window_base() + fabric.window_size()
    with exported(dev, free) as exp:
        skip_if_in_pieces(exp)
        last = fabric.loopback_addr(dev, exp.mem_id, free - SZ_2M)
        if last + SZ_2M != fabric.window_addr(fabric.pool_base + fabric.pool_size):
            pytest.skip("the free pool is not one run up to its end")
        imp = dev.import_(last, SZ_2M, scna=fabric.cna, tokenid=exp.tokenid)
        try:
            length = end - last + SZ_2M
            expect_errno(errno.EEXIST, dev.import_, last, length, scna=fabric.cna)
            expect_errno(errno.EINVAL, dev.import_, last + SZ_2M, length, scna=fabric.cna)
        finally:
            dev.unimport(imp.mem_id)


def test_range_free_again_after_unimport(
    dev: obmm.Obmm, fabric: Fabric, target: int, token: int
) -> None:
    imp = dev.import_(target, SZ_2M, scna=fabric.cna, tokenid=token)
    dev.unimport(imp.mem_id)
    imp = dev.import_(target, SZ_2M, scna=fabric.cna, tokenid=token)
    dev.unimport(imp.mem_id)


@pytest.mark.emulator_only
def test_failed_import_leaves_no_range(
    dev: obmm.Obmm, fabric: Fabric, target: int, token: int
) -> None:
    expect_errno(
        errno.EPERM, dev.import_, target, SZ_2M, scna=fabric.cna, flags=NUMA, tokenid=token
    )
    imp = dev.import_(target, SZ_2M, scna=fabric.cna, tokenid=token)
    dev.unimport(imp.mem_id)


@pytest.mark.parametrize("tokenid", ["zero", "other"])
def test_import_does_not_check_the_tokenid(dev: obmm.Obmm, fabric: Fabric, tokenid: str) -> None:
    """The real IMPORT never reads tokenid (obmm_import.c): tokenid 0, as programs written on
    UB hosts pass it, or any other imports the live export and reaches its bytes."""
    with exported(dev) as exp:
        with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(SZ_2M) as m:
            m.write(0, b"token-free")
        value = 0 if tokenid == "zero" else exp.tokenid ^ 1
        imp = fabric.import_loopback(dev, exp, tokenid=value)
        try:
            with obmm.ShmDev(imp.mem_id) as shm, shm.mmap(SZ_2M) as m:
                assert m.read(0, 10) == b"token-free"
        finally:
            dev.unimport(imp.mem_id)


def test_numa_remote_of_less_than_a_memory_block_is_eperm(
    dev: obmm.Obmm, fabric: Fabric, target: int, token: int
) -> None:
    """add_memory_remote() refuses a range that is not whole memory blocks: EPERM (the
    borrow itself is tested in test_borrow)."""
    expect_errno(
        errno.EPERM, dev.import_, target, SZ_2M, scna=fabric.cna, flags=NUMA, tokenid=token
    )


def test_preimport_without_declaration_is_efault(
    dev: obmm.Obmm, fabric: Fabric, target: int
) -> None:
    expect_errno(errno.EFAULT, dev.import_, target, SZ_2M, scna=fabric.cna, flags=NUMA | PRE)


def test_import_outputs(dev: obmm.Obmm, fabric: Fabric, target: int, token: int) -> None:
    imp = dev.import_(target, 2 * SZ_2M, scna=fabric.cna, tokenid=token, numa_id=3)
    try:
        assert imp.mem_id >= 1
        assert imp.numa_id == -1  # NUMA_NO_NODE for ALLOW_MMAP imports
    finally:
        dev.unimport(imp.mem_id)


def iomem_lines() -> list[str]:
    return Path("/proc/iomem").read_text().splitlines()


def test_import_claims_iomem(dev: obmm.Obmm, fabric: Fabric, target: int, token: int) -> None:
    imp = dev.import_(target, SZ_2M, scna=fabric.cna, tokenid=token)
    try:
        rng = f"{target:x}-{target + SZ_2M - 1:x}"
        lines = [ln.strip() for ln in iomem_lines()]
        assert f"{rng} : DIRECT_IMPORT_UBMEM" in lines
        assert f"{rng} : MEMID_{imp.mem_id}" in lines
    finally:
        dev.unimport(imp.mem_id)
    assert not any("MEMID_" in ln for ln in iomem_lines())


@pytest.mark.emulator_only
def test_import_of_a_whole_window_keeps_the_window_in_iomem(dev: obmm.Obmm, fabric: Fabric) -> None:
    """An import range equal to the window BAR nests under it and unwinds exactly.

    No export covers a whole window (the kernel's own RAM is in it): the import is made, as
    by the real driver, and its accesses fault (emulated UMMU: a new mmap is ENXIO).  The
    BAR's /proc/iomem line must survive the unimport.  The leak check compares the whole of
    /proc/iomem as well.
    """
    base, size = fabric.window_base(), fabric.window_size()
    bar = f"{base:x}-{base + size - 1:x}"
    before = iomem_lines()
    assert any(ln.strip().startswith(f"{bar} : 0000:00:") for ln in before)
    imp = dev.import_(base, size, scna=fabric.cna, tokenid=1)
    try:
        with obmm.ShmDev(imp.mem_id) as shm:
            expect_errno(errno.ENXIO, shm.mmap, SZ_2M)
    finally:
        dev.unimport(imp.mem_id)
    assert iomem_lines() == before
