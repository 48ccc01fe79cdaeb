"""What an import may be mapped as comes from its decoder range (issue 38 item 3e).

On a UB host the decoder says whether a PA range may be mapped cacheable, non-cacheable or both
(``ub_memory_validate_pa(scna, start, end, cacheable)``), and IMPORT records the answer as the
region's capabilities (openeuler-mirror/kernel ``drivers/ub/obmm/obmm_import.c:
get_pa_range_mem_cap``).  Public reports show hosts whose imported devices open only with
``O_SYNC``: their ranges are non-cacheable only.  Then:

* ``open(shmdev, O_RDWR)`` is EPERM, with the real line
  ``Noncacheable region N cannot be mmaped with cachable mode.``
  (``obmm_shm_dev.c:obmm_shm_fops_open``); ``O_RDWR | O_SYNC`` opens and maps;
* a NUMA_REMOTE import of such a range is EINVAL (``obmm_import.c:setup_remote_numa``: only
  cacheable memory can be hot-added), and so is a DECLARE_PREIMPORT
  (``obmm_preimport.c:preimport_prepare_common``).

The emulator's setting is the module parameter ``decoder_nc_only`` (node ids whose window's
decoder range is non-cacheable only; default none), given to a cluster like any module
parameter (``--param decoder_nc_only=1``, ``OBMM_TESTBED_PARAMS``).  Here the module is
reloaded with this node's own window non-cacheable only, and loopback imports of it are made.
"""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import (
    MODULE,
    MODULE_KO,
    MODULE_PARAMS,
    MODULE_RELOAD_PARAMS,
    SZ_2M,
    Fabric,
    exported,
    module_loaded,
)

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

# The setting is the emulator's module parameter (ub_compat's decoder has no such knob).
pytestmark = pytest.mark.emulator_only

NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE


def reload(extra: list[str], params: dict[str, str]) -> None:
    """The module (if loaded) out, then in again with `params` and `extra`."""
    if module_loaded():
        subprocess.run(["rmmod", MODULE], check=True)
    args = [f"{p}={v}" for p, v in params.items()] + extra
    subprocess.run(["insmod", str(MODULE_KO), *args], check=True)


@pytest.fixture
def nc_only_window(fabric: Fabric) -> Iterator[None]:
    """The module reloaded with this node's window non-cacheable only; as before afterwards."""
    if not MODULE_KO.is_file() or not module_loaded():
        pytest.skip(f"{MODULE_KO} not loaded from the testbed's payload")
    before = {
        p: (MODULE_PARAMS / p).read_text().strip()
        for p in MODULE_RELOAD_PARAMS
        if (MODULE_PARAMS / p).is_file()  # the parameters this build declares
    }
    node = int(before["node_id"])
    reload([f"decoder_nc_only={node}"], before)
    try:
        assert (MODULE_PARAMS / "decoder_nc_only").read_text().strip() == str(node)
        yield
    finally:
        reload([], before)


def open_shmdev(mem_id: int, flags: int) -> int:
    return os.open(f"/dev/obmm_shmdev{mem_id}", flags)


def test_default_ranges_open_both_ways(dev: obmm.Obmm, fabric: Fabric) -> None:
    """Without the setting (as today) an import opens cacheable and with O_SYNC."""
    with exported(dev) as exp:
        imp = fabric.import_loopback(dev, exp)
        try:
            for flags in (os.O_RDWR, os.O_RDWR | os.O_SYNC):
                os.close(open_shmdev(imp.mem_id, flags))
        finally:
            dev.unimport(imp.mem_id)


def test_nc_only_range_opens_only_with_o_sync(
    nc_only_window: None, fabric: Fabric, kernel_log: KernelLog
) -> None:
    with obmm.Obmm() as dev, exported(dev) as exp:
        imp = fabric.import_loopback(dev, exp)
        try:
            with pytest.raises(OSError) as info:
                open_shmdev(imp.mem_id, os.O_RDWR)
            assert info.value.errno == errno.EPERM
            assert (
                f"OBMM: Noncacheable region {imp.mem_id} cannot be mmaped with cachable mode."
                in (kernel_log.take())
            )
            fd = open_shmdev(imp.mem_id, os.O_RDWR | os.O_SYNC)
            try:
                with mmap.mmap(fd, SZ_2M, mmap.MAP_SHARED) as m:
                    m[:4] = b"nc!!"
                    assert m[:4] == b"nc!!"
            finally:
                os.close(fd)
        finally:
            dev.unimport(imp.mem_id)


def test_nc_only_range_cannot_be_borrowed(
    nc_only_window: None, fabric: Fabric, kernel_log: KernelLog
) -> None:
    """Only cacheable memory is hot-added: NUMA_REMOTE and DECLARE_PREIMPORT are EINVAL (the
    decoder's answer comes before any memory-block check, as in the real order)."""
    with obmm.Obmm() as dev:
        with exported(dev) as exp:
            with pytest.raises(OSError) as info:
                fabric.import_loopback(dev, exp, flags=NUMA)
            assert info.value.errno == errno.EINVAL
        log = kernel_log.take()
        assert "OBMM: PA range invalid. Cacheable memory cannot be managed with numa.remote" in log
        block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text(), 16)
        with pytest.raises(OSError) as info:
            dev.declare_preimport(fabric.window_base(), block, scna=fabric.cna)
        assert info.value.errno == errno.EINVAL
        log = kernel_log.take()
        assert "OBMM: PA range invalid. Cacheable memory cannot be managed with preimport" in log
