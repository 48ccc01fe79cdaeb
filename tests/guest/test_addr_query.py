"""OBMM_CMD_ADDR_QUERY in both directions, for exports and imports.

Reference: docs/obmm-driver.md sections 3.7 and 4.6.
"""

from __future__ import annotations

import errno

import pytest
from obmm_fixtures import SZ_2M, Fabric, expect_errno, exported, imported

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

MINORMASK = (1 << 20) - 1


def raw_query(dev: obmm.Obmm, key: int, mem_id: int = 0, offset: int = 0, pa: int = 0) -> None:
    cmd = abi.new("struct obmm_cmd_addr_query")
    cmd.key_type = key
    cmd.mem_id = mem_id
    cmd.offset = offset
    cmd.pa = pa
    dev.ioctl("OBMM_CMD_ADDR_QUERY", cmd)


def test_export_round_trip(dev: obmm.Obmm) -> None:
    with exported(dev, 2 * SZ_2M) as exp:
        pa = dev.query_pa_by_memid(exp.mem_id, 0x1234)
        assert dev.query_memid_by_pa(pa) == (exp.mem_id, 0x1234)
        assert dev.query_pa_by_memid(exp.mem_id, SZ_2M) == pa - 0x1234 + SZ_2M


def test_last_byte(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        pa = dev.query_pa_by_memid(exp.mem_id, SZ_2M - 1)
        assert dev.query_memid_by_pa(pa) == (exp.mem_id, SZ_2M - 1)


def test_offset_equal_size_is_einval(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.EINVAL, dev.query_pa_by_memid, exp.mem_id, SZ_2M)


@pytest.mark.parametrize("mem_id", [0, MINORMASK + 1])
def test_mem_id_out_of_range_is_enoent(dev: obmm.Obmm, mem_id: int) -> None:
    expect_errno(errno.ENOENT, dev.query_pa_by_memid, mem_id, 0)


def test_unknown_mem_id_is_enoent(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        expect_errno(errno.ENOENT, dev.query_pa_by_memid, exp.mem_id + 1, 0)


def test_unknown_pa_is_enoent(dev: obmm.Obmm) -> None:
    expect_errno(errno.ENOENT, dev.query_memid_by_pa, SZ_2M)


def test_pa_after_unexport_is_enoent(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        pa = dev.query_pa_by_memid(exp.mem_id)
    expect_errno(errno.ENOENT, dev.query_memid_by_pa, pa)


@pytest.mark.parametrize("key", [2, 0x7FFFFFFF])
def test_unknown_key_type_is_einval(dev: obmm.Obmm, key: int) -> None:
    with exported(dev) as exp:
        expect_errno(errno.EINVAL, raw_query, dev, key, mem_id=exp.mem_id)


def test_failed_query_does_not_write_back(dev: obmm.Obmm) -> None:
    cmd = abi.new("struct obmm_cmd_addr_query")
    cmd.key_type = abi.OBMM_QUERY_BY_PA
    cmd.pa = SZ_2M
    cmd.mem_id = 77
    cmd.offset = 88
    expect_errno(errno.ENOENT, dev.ioctl, "OBMM_CMD_ADDR_QUERY", cmd)
    assert (cmd.mem_id, cmd.offset) == (77, 88)


@pytest.mark.emulator_only
def test_import_both_ways(dev: obmm.Obmm, fabric: Fabric) -> None:
    with exported(dev, 2 * SZ_2M) as exp, imported(dev, fabric, exp) as imp:
        assert dev.query_pa_by_memid(imp.mem_id, 0x10) == imp.addr + 0x10
        assert dev.query_memid_by_pa(imp.addr + SZ_2M) == (imp.mem_id, SZ_2M)
        expect_errno(errno.EINVAL, dev.query_pa_by_memid, imp.mem_id, 2 * SZ_2M)
        # The export is still found by its own (exporter-side) PA.
        pa = dev.query_pa_by_memid(exp.mem_id, 0)
        assert dev.query_memid_by_pa(pa) == (exp.mem_id, 0)
