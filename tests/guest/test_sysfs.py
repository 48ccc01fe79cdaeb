"""sysfs: per-region attributes, the mempool counters, the ub_bus_controller files libobmm reads.

Reference: docs/obmm-driver.md sections 6 and 8.2 (vendor adaptor).
"""

from __future__ import annotations

import glob
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from obmm_fixtures import (
    MEMPOOL_SYSFS,
    SHMDEV_SYSFS,
    SZ_2M,
    Fabric,
    exported,
    imported,
    settle_pool,
)

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

HEX = re.compile(r"^0x[0-9a-f]+\n$")
EID = re.compile(r"^(0|0x[0-9a-f]+):(0|0x[0-9a-f]+)\n$")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def region_dir(mem_id: int) -> Path:
    return SHMDEV_SYSFS / f"obmm_shmdev{mem_id}"


def test_the_driver_is_the_obmm_module(dev: obmm.Obmm) -> None:
    """The module is `obmm`, as on a UB host (lsmod | grep obmm, /sys/module/obmm)."""
    assert Path("/sys/module/obmm/parameters").is_dir()
    mods = [line.split()[0] for line in Path("/proc/modules").read_text().splitlines()]
    assert "obmm" in mods


def test_region_root_attributes(dev: obmm.Obmm) -> None:
    with exported(dev, 2 * SZ_2M, priv=b"abc") as exp:
        d = region_dir(exp.mem_id)
        assert (d / "size").read_text() == f"{2 * SZ_2M:#x}\n"
        assert (d / "type").read_text() == "export\n"
        assert (d / "priv_len").read_text() == "3\n"
        assert (d / "allow_mmap").read_text() == "1\n"
        priv = (d / "priv").read_bytes()
        assert len(priv) == abi.OBMM_MAX_PRIV_LEN
        assert priv[:3] == b"abc" and priv[3:] == bytes(abi.OBMM_MAX_PRIV_LEN - 3)


def test_region_attributes_are_admin_read_only(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        d = region_dir(exp.mem_id)
        names = ["size", "type", "priv_len", "allow_mmap", "priv"] + [
            f"export_info/{n}"
            for n in ("node_mem_size", "uba", "tokenid", "memory_from_user", "deid")
        ]
        for name in names:
            assert mode(d / name) == 0o400, name


def test_export_info(dev: obmm.Obmm) -> None:
    deid = bytes(range(1, 17))
    with exported(dev, 2 * SZ_2M, flags=0, deid=deid) as exp:
        d = region_dir(exp.mem_id) / "export_info"
        assert (d / "node_mem_size").read_text() == f"{2 * SZ_2M:#x}\n"
        assert (d / "uba").read_text() == f"{exp.uba:#x}\n"
        assert (d / "tokenid").read_text() == f"{exp.tokenid:#x}\n"
        assert (d / "memory_from_user").read_text() == "0\n"
        lo = int.from_bytes(deid[:8], "little")
        hi = int.from_bytes(deid[8:], "little")
        assert (d / "deid").read_text() == f"{hi:#x}:{lo:#x}\n"
        assert (region_dir(exp.mem_id) / "allow_mmap").read_text() == "0\n"
        assert not (region_dir(exp.mem_id) / "import_info").exists()


def test_node_mem_size_trims_trailing_zero_nodes(dev: obmm.Obmm) -> None:
    with exported(dev, [SZ_2M] + [0] * 15) as exp:
        text = (region_dir(exp.mem_id) / "export_info" / "node_mem_size").read_text()
        assert text == f"{SZ_2M:#x}\n"


@pytest.mark.emulator_only
def test_import_info(dev: obmm.Obmm, fabric: Fabric) -> None:
    seid = fabric.seid
    with exported(dev) as exp, imported(dev, fabric, exp, dcna=0x42, seid=seid) as imp:
        d = region_dir(imp.mem_id)
        assert (d / "type").read_text() == "import\n"
        info = d / "import_info"
        assert (info / "pa").read_text() == f"{imp.addr:#x}\n"
        assert (info / "scna").read_text() == f"{fabric.cna:#x}\n"
        assert (info / "dcna").read_text() == "0x42\n"
        assert EID.match((info / "seid").read_text())
        assert EID.match((info / "deid").read_text())
        # numa_id / preimport only exist for NUMA_REMOTE imports
        assert not (info / "numa_id").exists()
        assert not (info / "preimport").exists()
        assert not (d / "export_info").exists()
        for name in ("pa", "scna", "dcna", "seid", "deid"):
            assert mode(info / name) == 0o400


def test_region_device_has_dev_node_numbers(dev: obmm.Obmm) -> None:
    with exported(dev) as exp:
        devnum = (region_dir(exp.mem_id) / "dev").read_text().strip()
        major, minor = (int(x) for x in devnum.split(":"))
        st = os.stat(f"/dev/obmm_shmdev{exp.mem_id}")
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
        assert minor == exp.mem_id


def test_mempool_counters(dev: obmm.Obmm) -> None:
    pools = sorted(MEMPOOL_SYSFS.glob("obmm-*"))
    assert pools, "no /sys/kernel/obmm_mempool/obmm-<nid>"
    d = pools[0]
    for name in ("total", "used", "available_cleared", "available_uncleared"):
        assert HEX.match((d / name).read_text()), name
        assert mode(d / name) == 0o400, name
    settle_pool()

    def counters() -> tuple[int, int, int, int]:
        used, cleared, uncleared, total = (
            int((d / name).read_text(), 16)
            for name in ("used", "available_cleared", "available_uncleared", "total")
        )
        return used, cleared, uncleared, total

    with exported(dev, SZ_2M):
        # Four files, read one after another: memory a background clearing moves from
        # uncleared to cleared in between is counted in neither (and the real driver's pool
        # thread may add to the total).  So the same values twice in a row (the clearing of
        # what earlier tests freed takes a few seconds).
        deadline = time.monotonic() + 30
        seen, now = None, counters()
        while now != seen and time.monotonic() < deadline:
            time.sleep(0.2)
            seen, now = now, counters()
        used, cleared, uncleared, total = now
        assert used >= SZ_2M
        assert used + cleared + uncleared == total, (used, cleared, uncleared, total)


def test_dev_obmm_is_root_only() -> None:
    st = os.stat("/dev/obmm")
    assert stat.S_ISCHR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0


def test_ub_bus_controller_files_for_libobmm() -> None:
    """libobmm globs /sys/devices/ub_bus_controller<i>/*/ubc and reads eid, primary_cna,
    ummu_map and numa as integers (strtol base 0) from the directory holding ubc."""
    hits = sorted(glob.glob("/sys/devices/ub_bus_controller*/*/ubc"))
    assert hits
    ctl = Path(os.path.dirname(hits[0]))
    values = {
        n: int((ctl / n).read_text().strip(), 0) for n in ("eid", "primary_cna", "ummu_map", "numa")
    }
    assert values["eid"] > 0 and values["primary_cna"] > 0
    assert values["ummu_map"] >= 0 and values["numa"] >= 0


# drivers/ub/ubus/sysfs.c: how a UB host's bus prints its controllers' attributes.
UBC_FORMATS = {
    "eid": r"[0-9]+",  # %u
    "primary_cna": r"0x[0-9a-f]{4,}|0{6}",  # %#06x
    "ummu_map": r"0x[0-9a-f]{2,}|0{4}",  # %#04x
    "numa": r"0x[0-9a-f]{2,}|0{4}",  # %#04x of the proximity domain
    "ubc": r"0x[0-9a-f]{3,}|0{5}",  # %#05x
    "vendor": r"0x[0-9a-f]{4,}|0{6}",  # %#06x of the guid's vendor
    "device": r"0x[0-9a-f]{4,}|0{6}",  # %#06x of the guid's device
    "class_code": r"0x[0-9a-f]{4,}|0{6}",  # %#06x
    "type": r"0x[0-9a-f]+|0",  # %#x of the guid's type
    # ub_show_guid(): vendor-device-version-type-reserved-seq_num
    "guid": r"[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]-[0-9a-f]-[0-9a-f]{6}-[0-9a-f]{16}",
}


def test_ub_bus_controller_attributes_as_the_ub_bus_prints_them() -> None:
    """`ubc` is a file (the controller's entity number), and each attribute has the real
    bus's format."""
    hits = sorted(glob.glob("/sys/devices/ub_bus_controller*/*/ubc"))
    assert hits
    for hit in hits:
        assert Path(hit).is_file(), hit
        ctl = Path(hit).parent
        for name, fmt in UBC_FORMATS.items():
            text = (ctl / name).read_text()
            assert re.fullmatch(f"(?:{fmt})\n", text), (ctl, name, text)
    cnas = [int((Path(h).parent / "primary_cna").read_text(), 0) for h in hits]
    assert len(set(cnas)) == len(cnas), cnas


def test_ub_bus_controller_guid_names_its_vendor_device_and_type() -> None:
    """The guid's fields are the vendor, device and type files' values; a controller's type
    is UB_TYPE_CONTROLLER (1); each controller's guid is its own."""
    ctls = [Path(h).parent for h in sorted(glob.glob("/sys/devices/ub_bus_controller*/*/ubc"))]
    assert ctls
    guids = []
    for ctl in ctls:
        guid = (ctl / "guid").read_text().strip()
        vendor, device, _version, kind, _reserved, _seq = guid.split("-")
        assert int(vendor, 16) == int((ctl / "vendor").read_text(), 0), (ctl, guid)
        assert int(device, 16) == int((ctl / "device").read_text(), 0), (ctl, guid)
        assert int(kind, 16) == int((ctl / "type").read_text(), 0) == 1, (ctl, guid)
        guids.append(guid)
    assert len(set(guids)) == len(guids), guids


def test_ub_bus_attributes() -> None:
    """/sys/bus/ub: ub_feature (the bitmap, then one line per feature), cluster, instance."""
    bus = Path("/sys/bus/ub")
    lines = (bus / "ub_feature").read_text().splitlines()
    assert re.fullmatch(r"0x[0-9a-f]{16}", lines[0]), lines[0]
    features = int(lines[0], 16)
    assert [ln[-1] for ln in lines[1:5]] == ["+" if features & (1 << i) else "-" for i in range(4)]
    assert lines[1] == ("UB Memory Borrowing(Non Cacheable)" + lines[1][-1])
    assert features & 0xF, "the OBMM memory features"
    assert re.fullmatch(r"-?[0-9]+\n", (bus / "cluster").read_text())
    assert (bus / "instance").read_text().startswith("count 0x")


def test_two_controllers_as_ub_hosts_name_them(fabric: Fabric) -> None:
    """The testbed loads two controllers named as on UB hosts (ubs-test and the seed's programs
    read these paths), on either driver: one layout (kmod/common/ub_controller.c)."""
    first = Path("/sys/devices/ub_bus_controller0/00001")
    second = Path("/sys/devices/ub_bus_controller1/00002")
    assert int((first / "primary_cna").read_text(), 0) == fabric.cna
    assert int((first / "eid").read_text()) == fabric.eid
    assert (first / "ubc").read_text() == "0x001\n"
    assert (second / "ubc").read_text() == "0x002\n"
    assert int((second / "primary_cna").read_text(), 0) != fabric.cna


@pytest.mark.emulator_only
def test_an_import_may_name_either_controller(fabric: Fabric) -> None:
    """An IMPORT's scna may be either controller's CNA (ub_compat's ub_mem_get_numa_id() knows
    the first one's only)."""
    second = Path("/sys/devices/ub_bus_controller1/00002")
    cna2 = int((second / "primary_cna").read_text(), 0)
    with obmm.Obmm() as dev, exported(dev) as exp:
        imp = dev.import_(fabric.loopback_addr(dev, exp.mem_id), SZ_2M, scna=cna2)
        dev.unimport(imp.mem_id)


@pytest.mark.emulator_only
def test_ub_bus_controller_matches_fabric(fabric: Fabric) -> None:
    ctl = Path(os.path.dirname(sorted(glob.glob("/sys/devices/ub_bus_controller*/*/ubc"))[0]))
    assert int((ctl / "primary_cna").read_text(), 0) == fabric.cna
    assert int((ctl / "eid").read_text()) == fabric.eid  # %u
    # libobmm compares the sysfs eid with the first 4 bytes of a 16-byte EID
    assert fabric.seid[:4] == fabric.eid.to_bytes(4, sys.byteorder)


@pytest.mark.emulator_only
def test_emulator_fabric_sysfs(fabric: Fabric) -> None:
    assert 0 <= fabric.node_id < 8
    assert fabric.node_id in fabric.windows
    base, size = fabric.windows[fabric.node_id]
    assert base % SZ_2M == 0 and size >= fabric.pool_base + fabric.pool_size
    assert fabric.pool_base % SZ_2M == 0 and fabric.pool_size % SZ_2M == 0
    assert Path("/sys/kernel/obmm_emu/enabled").read_text() == "1\n"
    assert int(Path("/sys/kernel/obmm_emu/control_size").read_text(), 0) >= 2 << 20


@pytest.mark.emulator_only
def test_emulator_physical_addresses_are_root_only(fabric: Fabric) -> None:
    """Like /proc/iomem, the pool, control-region and window bases are for root only."""
    emu = Path("/sys/kernel/obmm_emu")
    secret = [emu / "pool_base", emu / "control_base"]
    secret += sorted((emu / "windows").glob("*/base"))
    for path in secret:
        assert mode(path) == 0o400, path
    # Not addresses: still world-readable (tools read the node id unprivileged).
    for name in ("node_id", "cna", "eid", "enabled"):
        assert mode(emu / name) == 0o444, name
    code = (
        "import os, sys\n"
        "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        open(p).read(); print('read', p)\n"
        "    except PermissionError:\n"
        "        pass\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, *map(str, secret)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
