"""ubs-test's OBMM steps, unmodified, on the emulated driver (issue 38 item 4).

openEuler's UB test suite (openeuler-mirror/ubs-test @3988d01) drives obmm.ko through a few
fixed steps.  Written here from what it does (facts, no code of its):

* it reloads the driver: ``rmmod ham_migrate`` (its result ignored), ``rmmod obmm``, then
  ``modprobe obmm mempool_refill_timeout=60000 mempool_size=<N>G mempool_allocator=hugetlb_pmd
  skip_cache_maintain=<true|false>`` (testcases/ubturbo/conftest.py:refill_obmm_mempool; ``true``
  in a simulation environment), or ``modprobe obmm mempool_size=<N>G mempool_allocator=hugetlb_pmd``
  (libs/ubturbo/hooks/hook_mem_pooling.py);
* it reads ``cat /sys/module/obmm/parameters/mempool_size`` and takes the first number as GiB
  (libs/ubturbo/api/numa.py:get_obmm_mempool_total_ub): the real driver declares it
  ``module_param(mempool_size, charp, 0440)`` (drivers/ub/obmm/ubmempool_allocator.c), so it
  reads back as given, ``16G``;
* it maps each socket's CNA from ``/sys/devices/ub_bus_controller0/00001/primary_cna`` and
  ``/sys/devices/ub_bus_controller1/00002/primary_cna``, parsed with base prefix
  (numa.py:get_cluster_cna2socket);
* its getCna.sh finds the borrow of a NUMA node: every ``/sys/devices/obmm/obmm_*`` whose
  ``import_info/numa_id`` is that node, then its ``import_info/scna`` and ``dcna`` as numbers.

ubs-test passes the driver no fabric identity: a UB host's hardware gives it.  The testbed's
stand-in for that hardware is the emulator's own parameters, so this test puts them in
/etc/modprobe.d (as a host's persistent module options) and runs ubs-test's command lines as
they are.  Not covered: ubs-test also requires ``pmd_mapping=100%`` on the kernel command line
(the real driver refuses hugetlb_pmd without it, ubmempool_allocator.c:select_mem_allocator;
the guests' kernel is not OLK and has no such option) and waits for the hugetlb pool to drain
into obmm's (HugePages_Free 0 on every node: the emulated pool is memory above mem=, not huge
pages).  Emulator-only: the real obmm.ko is not reloaded under a running suite.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import MODULE, SHMDEV_SYSFS, Fabric, exported, pool_total, pool_used, settle_pool
from obmm_fixtures import MODULE_KO as KO
from obmm_fixtures import MODULE_PARAMS as PARAMS
from obmm_fixtures import module_loaded as loaded

import obmm
from obmm import abi
from obmm.tools import logscan

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.emulator_only

# The parameters the testbed loads the module with (obmm.testbed.provision.insmod_command);
# pool_size is left out of the host's options: ubs-test's mempool_size sizes the pool.
FABRIC_PARAMS = ("node_id", "pool_base", "ubc_dev")
RELOAD_PARAMS = (*FABRIC_PARAMS, "pool_size")
MODPROBE_CONF = Path("/etc/modprobe.d/obmm-testbed-fabric.conf")
MEMORY_SYSFS = Path("/sys/devices/system/memory")
EMU_SYSFS = Path("/sys/kernel/obmm_emu")

# ubs-test's command lines, (what they load, what each parameter then reads).
UBS_TEST_LOADS = {
    "conftest-refill": (
        "mempool_refill_timeout=60000 mempool_size=16G mempool_allocator=hugetlb_pmd "
        "skip_cache_maintain=true",
        {
            "mempool_size": "16G",
            "mempool_allocator": "hugetlb_pmd",
            "mempool_refill_timeout": "60000",
            "skip_cache_maintain": "Y",
            "mem_allocator_granu": "2M",
        },
    ),
    "hook-refill": (
        "mempool_size=32G mempool_allocator=hugetlb_pmd",
        {
            "mempool_size": "32G",
            "mempool_allocator": "hugetlb_pmd",
            "mempool_refill_timeout": "30000",
            "skip_cache_maintain": "N",
            "mem_allocator_granu": "2M",
        },
    ),
    "bare-skip": (
        "mempool_size=16G mempool_allocator=hugetlb_pmd skip_cache_maintain",
        {"mempool_size": "16G", "skip_cache_maintain": "Y"},
    ),
}


def sh(command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One of ubs-test's shell steps, as it runs them (through a shell, output kept)."""
    return subprocess.run(command, shell=True, check=check, capture_output=True, text=True)


@pytest.fixture
def host_options() -> Iterator[None]:
    """The fabric identity as a host's modprobe options; the module as it was afterwards."""
    if not KO.is_file() or not loaded():
        pytest.skip(f"{KO} not loaded from the testbed's payload")
    if MODPROBE_CONF.exists():
        pytest.skip(f"{MODPROBE_CONF} exists already")
    before = {p: (PARAMS / p).read_text().strip() for p in RELOAD_PARAMS}
    options = " ".join(f"{p}={before[p]}" for p in FABRIC_PARAMS)
    MODPROBE_CONF.write_text(f"options {MODULE} {options}\n")
    try:
        yield
    finally:
        MODPROBE_CONF.unlink()
        if loaded():
            subprocess.run(["rmmod", MODULE], check=True)
        args = [f"{p}={v}" for p, v in before.items()]
        subprocess.run(["insmod", str(KO), *args], check=True)


def ubs_test_reload(args: str) -> None:
    """refill_obmm_mempool's reload: ham_migrate out (absent here: its failure is ignored, as
    ubs-test ignores it), obmm out, then modprobe with ubs-test's parameters."""
    sh("rmmod ham_migrate", check=False)
    sh(f"rmmod {MODULE}")
    res = sh(f"modprobe {MODULE} {args}", check=False)
    assert res.returncode == 0, res.stderr


def mempool_gib(text: str) -> int:
    """What ubs-test makes of the parameter: its first number, in GiB."""
    numbers = re.findall(r"\d+", text)
    return int(numbers[0]) if numbers else 0


@pytest.mark.parametrize("load", list(UBS_TEST_LOADS))
def test_ubs_test_reload_reads_back_as_on_a_ub_host(
    host_options: None, load: str, fabric: Fabric, kernel_log: KernelLog
) -> None:
    args, reads = UBS_TEST_LOADS[load]
    kernel_log.take()
    ubs_test_reload(args)
    out = sh(f"cat {PARAMS / 'mempool_size'}").stdout
    given = dict(w.split("=", 1) for w in shlex.split(args) if "=" in w)
    assert out == given["mempool_size"] + "\n"
    assert mempool_gib(out.strip("\n")) == int(given["mempool_size"][:-1])
    for name, value in reads.items():
        assert (PARAMS / name).read_text() == value + "\n", name
    # The host's options reached the module: it is the same fabric node.
    assert (PARAMS / "node_id").read_text().strip() == str(fabric.node_id)
    with obmm.Obmm() as dev, exported(dev) as exp:
        assert exp.mem_id > 0
    log = kernel_log.take()
    assert "unknown parameter" not in log, log
    assert not logscan.scan(log, allow=()), log


def test_ubs_test_reads_the_controllers_cna(host_options: None, fabric: Fabric) -> None:
    """get_cluster_cna2socket: two controllers at fixed paths, one CNA per socket."""
    ubs_test_reload(UBS_TEST_LOADS["conftest-refill"][0])
    cna0 = sh("cat /sys/devices/ub_bus_controller0/00001/primary_cna").stdout.strip()
    cna1 = sh("cat /sys/devices/ub_bus_controller1/00002/primary_cna").stdout.strip()
    assert int(cna0, 0) == fabric.cna  # the CNA IMPORT takes as scna
    assert int(cna1, 0) != int(cna0, 0)


def get_cna(numa_id: int) -> dict[str, object] | None:
    """getCna.sh's lookup: the obmm device whose import_info/numa_id is `numa_id`, with its
    scna and dcna as numbers (the script's shell arithmetic takes the 0x prefix)."""
    for d in sorted(SHMDEV_SYSFS.glob("obmm_*")):
        info = d / "import_info"
        if not (info / "numa_id").is_file():
            continue
        if "".join((info / "numa_id").read_text().split()) != str(numa_id):
            continue
        scna = int("".join((info / "scna").read_text().split()), 0)
        dcna = int("".join((info / "dcna").read_text().split()), 0)
        return {"scna": scna, "dcna": dcna, "dev_path": str(d)}
    return None


def test_ubs_test_finds_a_borrow_by_its_numa_node(host_options: None, fabric: Fabric) -> None:
    """After ubs-test's reload, a NUMA_REMOTE import (a borrow) shows under
    /sys/devices/obmm/obmm_shmdev<id>/import_info as getCna.sh reads it."""
    ubs_test_reload(UBS_TEST_LOADS["conftest-refill"][0])
    block = int((MEMORY_SYSFS / "block_size_bytes").read_text().strip(), 16)
    deadline = time.monotonic() + 60
    while int((EMU_SYSFS / "quarantined").read_text(), 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    settle_pool()
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    dcna = 0x42
    with obmm.Obmm() as dev, exported(dev, block) as exp:
        if fabric.loopback_addr(dev, exp.mem_id) % block:
            pytest.skip("the pool gave no block-aligned range")
        imp = fabric.import_loopback(dev, exp, flags=abi.OBMM_IMPORT_FLAG_NUMA_REMOTE, dcna=dcna)
        try:
            found = get_cna(imp.numa_id)
            assert found == {
                "scna": fabric.cna,
                "dcna": dcna,
                "dev_path": str(SHMDEV_SYSFS / f"obmm_shmdev{imp.mem_id}"),
            }
            assert get_cna(imp.numa_id + 1000) is None
        finally:
            dev.unimport(imp.mem_id)
    assert get_cna(imp.numa_id) is None
    # The module is reloaded next: let the unexported block leave quarantine first.
    deadline = time.monotonic() + 60
    while int((EMU_SYSFS / "quarantined").read_text(), 0) and time.monotonic() < deadline:
        time.sleep(0.2)
