"""UNEXPORT / UNIMPORT: id range, flags, refcount (EBUSY), wrong region type.

Reference: docs/obmm-driver.md sections 3.1 (lifecycle refcount), 3.6 and 4.4.
"""

from __future__ import annotations

import errno
import gc

import pytest
from obmm_fixtures import SZ_2M, Fabric, expect_errno, exported, imported, pool_used

import obmm

pytest_plugins = ["obmm_fixtures"]

MINORMASK = (1 << 20) - 1


@pytest.mark.parametrize("op", ["unexport", "unimport"])
@pytest.mark.parametrize("mem_id", [0, MINORMASK + 1, 1 << 63])
def test_mem_id_out_of_range_is_enoent(dev: obmm.Obmm, op: str, mem_id: int) -> None:
    expect_errno(errno.ENOENT, getattr(dev, op), mem_id)


@pytest.mark.parametrize("op", ["unexport", "unimport"])
def test_mem_id_range_checked_before_flags(dev: obmm.Obmm, op: str) -> None:
    expect_errno(errno.ENOENT, getattr(dev, op), 0, flags=1)


def test_unexport_flags_is_einval(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.EINVAL, dev.unexport, exp.mem_id, flags=1)


def test_unexport_unknown_id_is_enoent(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.ENOENT, dev.unexport, exp.mem_id + 1)


def test_unexport_twice_is_enoent(dev: obmm.Obmm) -> None:
    exp = dev.export(SZ_2M)
    dev.unexport(exp.mem_id)
    expect_errno(errno.ENOENT, dev.unexport, exp.mem_id)


def test_unexport_with_open_shmdev_is_ebusy(dev: obmm.Obmm) -> None:
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id):
        expect_errno(errno.EBUSY, dev.unexport, exp.mem_id)


def test_unexport_with_mapping_after_close_is_ebusy(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        shm = obmm.ShmDev(exp.mem_id)
        m = shm.mmap(SZ_2M)
        shm.close()
        try:
            expect_errno(errno.EBUSY, dev.unexport, exp.mem_id)
        finally:
            m.close()


def test_unexport_after_all_closed_succeeds(dev: obmm.Obmm) -> None:
    exp = dev.export(SZ_2M)
    for sync in (False, True):
        with obmm.ShmDev(exp.mem_id, sync=sync) as shm, shm.mmap(SZ_2M):
            pass
    dev.unexport(exp.mem_id)


def test_unimport_of_export_is_einval_and_region_survives(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.EINVAL, dev.unimport, exp.mem_id)
        # re-activated: still usable and still removable by the right call
        with obmm.ShmDev(exp.mem_id):
            pass


@pytest.mark.emulator_only
def test_unexport_of_import_is_einval(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp, imported(dev, fabric, exp) as imp:
        expect_errno(errno.EINVAL, dev.unexport, imp.mem_id)
        with obmm.ShmDev(imp.mem_id):
            pass


@pytest.mark.emulator_only
def test_unimport_flags_is_einval(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp, imported(dev, fabric, exp) as imp:
        expect_errno(errno.EINVAL, dev.unimport, imp.mem_id, flags=1)


def test_unimport_unknown_id_is_enoent(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.ENOENT, dev.unimport, exp.mem_id + 1)


@pytest.mark.emulator_only
def test_unimport_with_open_shmdev_is_ebusy(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp, imported(dev, fabric, exp) as imp:  # noqa: SIM117
        with obmm.ShmDev(imp.mem_id, sync=True):
            expect_errno(errno.EBUSY, dev.unimport, imp.mem_id)


@pytest.mark.emulator_only
def test_unimport_with_mapping_is_ebusy(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp, imported(dev, fabric, exp) as imp:
        shm = obmm.ShmDev(imp.mem_id)
        m = shm.mmap(SZ_2M)
        shm.close()
        try:
            expect_errno(errno.EBUSY, dev.unimport, imp.mem_id)
        finally:
            m.close()


@pytest.mark.emulator_only
def test_unimport_twice_is_enoent(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as exp:
        imp = fabric.import_loopback(dev, exp)
        dev.unimport(imp.mem_id)
        expect_errno(errno.ENOENT, dev.unimport, imp.mem_id)


@pytest.mark.emulator_only
def test_export_import_share_one_id_space(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev) as a:
        imp = fabric.import_loopback(dev, a)
        try:
            assert imp.mem_id == a.mem_id + 1
        finally:
            dev.unimport(imp.mem_id)
        with exported(dev) as b:
            assert b.mem_id == a.mem_id + 1


@pytest.mark.emulator_only
def test_export_may_be_unexported_while_imported(dev: obmm.Obmm, fabric: Fabric) -> None:
    """The exporter does not track importers (the real driver neither)."""
    exp = dev.export(SZ_2M)
    imp = fabric.import_loopback(dev, exp)
    dev.unexport(exp.mem_id)
    dev.unimport(imp.mem_id)


def test_shmdev_node_and_sysfs_follow_region(dev: obmm.Obmm) -> None:
    import os

    exp = dev.export(SZ_2M)
    assert os.path.exists(f"/dev/obmm_shmdev{exp.mem_id}")
    assert os.path.isdir(f"/sys/devices/obmm/obmm_shmdev{exp.mem_id}")
    dev.unexport(exp.mem_id)
    gc.collect()
    assert not os.path.exists(f"/dev/obmm_shmdev{exp.mem_id}")
    assert not os.path.exists(f"/sys/devices/obmm/obmm_shmdev{exp.mem_id}")


def test_open_after_unexport_fails(dev: obmm.Obmm) -> None:
    exp = dev.export(SZ_2M)
    dev.unexport(exp.mem_id)
    expect_errno(errno.ENOENT, obmm.ShmDev, exp.mem_id)


def test_many_regions_leave_pool_clean(dev: obmm.Obmm) -> None:
    before = pool_used()
    exps = [dev.export(SZ_2M) for _ in range(16)]
    for e in exps[::2] + exps[1::2]:
        dev.unexport(e.mem_id)
    assert pool_used() == before
