"""The kernel log of a refused call: the real driver's line for that check.

A refused ioctl (or shmdev mmap) logs what the real driver logs at that check: its level
(``pr_err``: KERN_ERR), its prefix (``OBMM: ``, obmm_core.h's ``pr_fmt``) and its format, as the
table of facts :mod:`obmm.driver_log` lists them with their ``drivers/ub/obmm/<file>.c:<function>``
(openeuler-mirror/kernel; tests/host/tools/test_refusal_lines.py holds kmod/obmm_emu to it):

    OBMM: PA=0 unexpected.

Where the real driver logs a second line for the refusal (its caller's), both come, in order.  A
refusal only the emulator makes logs the emulator's own line, marked so (emulator only):

    OBMM: emulator: IMPORT refused (-EACCES): no live export covers ...

A sample of checks is provoked here and its lines asserted, on both drivers.  The emulator's lines
are rate-limited per call site (10 per 5 s; the real driver's are not): the module fixture first
waits out the window of the tests before.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import SZ_2M, SZ_4K, Fabric, exported

import obmm
from obmm import abi, driver_log
from obmm.tools.logscan import KmsgWatcher

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

# printk's default rate-limit interval (DEFAULT_RATELIMIT_INTERVAL, 5 s) and a margin.
RATELIMIT_WINDOW_S = 5.5
KERN_ERR = 3
MMAP = abi.OBMM_IMPORT_FLAG_ALLOW_MMAP
NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE


@pytest.fixture(scope="module", autouse=True)
def _fresh_ratelimit() -> None:
    """Every call site's rate-limit window restarts at its next line."""
    time.sleep(RATELIMIT_WINDOW_S)


@pytest.fixture
def kmsg() -> Iterator[KmsgWatcher]:
    """/dev/kmsg records (with their level) from now on."""
    with KmsgWatcher() as watcher:
        yield watcher


def driver_lines(kmsg: KmsgWatcher, kernel_log: KernelLog) -> list[tuple[int, str]]:
    """(level, text after the prefix) of the driver's new lines; the guard's copy is claimed."""
    out = []
    for rec in kmsg.read_records():
        for part in rec.message.split("\n"):
            if part.startswith(driver_log.PREFIX):
                out.append((rec.level, part.removeprefix(driver_log.PREFIX)))
    kernel_log.take()
    return out


def err(value: int) -> str:
    """How %pe prints -value: the name with CONFIG_SYMBOLIC_ERRNAME, else the number."""
    return f"(?:-{errno.errorcode[value]}|-{value})"


def refuse(
    kmsg: KmsgWatcher, kernel_log: KernelLog, code: int, call: Callable[[], object], *lines: str
) -> list[str]:
    """`call` fails with `code` and logs exactly `lines` (regexes of the text after the prefix,
    in order), each at KERN_ERR."""
    driver_lines(kmsg, kernel_log)
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == code, info.value
    got = driver_lines(kmsg, kernel_log)
    assert len(got) == len(lines), got
    for (level, text), pattern in zip(got, lines, strict=True):
        assert level == KERN_ERR, (level, text)
        assert re.fullmatch(pattern, text), (pattern, text)
    return [text for _, text in got]


def fmt_is_a_fact(text: str) -> None:
    """The pattern a test asserts is a line of the table (kept in step with it)."""
    assert text in driver_log.real_formats(), text


@pytest.fixture
def live(dev: obmm.Obmm, fabric: Fabric) -> Iterator[tuple[int, obmm.Export]]:
    with exported(dev, 2 * SZ_2M) as exp:
        yield fabric.loopback_addr(dev, exp.mem_id), exp


def test_import_unknown_flags(
    dev: obmm.Obmm, fabric: Fabric, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    fmt_is_a_fact("Invalid import flags %#lx (unknown flags: %#lx).")
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(SZ_2M, SZ_2M, scna=fabric.cna, flags=0x8 | MMAP),
        r"Invalid import flags 0x9 \(unknown flags: 0x8\)\.",
    )


def test_import_both_models(
    dev: obmm.Obmm, fabric: Fabric, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(SZ_2M, SZ_2M, scna=fabric.cna, flags=MMAP | NUMA),
        re.escape("Exactly one of {ALLOW_MMAP, NUMA_REMOTE} must be specified as import flag."),
    )


def test_import_unaligned(
    dev: obmm.Obmm,
    fabric: Fabric,
    live: tuple[int, obmm.Export],
    kmsg: KmsgWatcher,
    kernel_log: KernelLog,
) -> None:
    addr = live[0] + SZ_4K
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(addr, SZ_2M, scna=fabric.cna),
        rf"PA segments not aligned to OBMM basic granu: base={addr:#x}, size=0x200000, "
        r"granularity=0x200000\.",
    )


def test_import_unknown_scna(
    dev: obmm.Obmm,
    fabric: Fabric,
    live: tuple[int, obmm.Export],
    kmsg: KmsgWatcher,
    kernel_log: KernelLog,
) -> None:
    """validate_scna()'s line (the lookup's NUMA_NO_NODE printed by %pe), then obmm_import()'s
    after prepare_import_memory() failed."""
    bad = fabric.cna + 0x40
    fmt_is_a_fact("%#x is not a known scna, lookup ret=%pe")
    fmt_is_a_fact("Failed to prepare import memory: ret=%pe")
    refuse(
        kmsg,
        kernel_log,
        errno.ENODEV,
        lambda: dev.import_(live[0], SZ_2M, scna=bad),
        rf"{bad:#x} is not a known scna, lookup ret={err(errno.EPERM)}",
        rf"Failed to prepare import memory: ret={err(errno.ENODEV)}",
    )


def test_import_over_an_import(
    dev: obmm.Obmm,
    fabric: Fabric,
    live: tuple[int, obmm.Export],
    kmsg: KmsgWatcher,
    kernel_log: KernelLog,
) -> None:
    """An import whose PA range overlaps a live one: occupy_pa_range()'s line, with
    obmm_addr_check.c's sub-prefix (``addr_check:``, no space), then obmm_import()'s; a
    declaration over it: occupy_pa_range()'s line alone (preimport_prepare_prefilled())."""
    addr, _ = live
    fmt_is_a_fact(driver_log.ADDR_CHECK + "failed to occupy PA range: ret=%pe")
    first = dev.import_(addr, 2 * SZ_2M, scna=fabric.cna)
    try:
        refuse(
            kmsg,
            kernel_log,
            errno.EEXIST,
            lambda: dev.import_(addr + SZ_2M, SZ_2M, scna=fabric.cna),
            rf"addr_check:failed to occupy PA range: ret={err(errno.EEXIST)}",
            rf"Failed to prepare import memory: ret={err(errno.EEXIST)}",
        )
        block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text().strip(), 16)
        refuse(
            kmsg,
            kernel_log,
            errno.EEXIST,
            lambda: dev.declare_preimport(addr - addr % block, block, scna=fabric.cna),
            rf"addr_check:failed to occupy PA range: ret={err(errno.EEXIST)}",
        )
    finally:
        dev.unimport(first.mem_id)


@pytest.mark.emulator_only
def test_borrow_of_an_unexported_range(
    dev: obmm.Obmm, fabric: Fabric, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    """A refusal only the emulator makes: its own line, marked, with the operation and errno."""
    block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text(), 16)
    addr = fabric.window_base() + block  # this node's own RAM: nobody exported it
    refuse(
        kmsg,
        kernel_log,
        errno.EACCES,
        lambda: dev.import_(addr, block, scna=fabric.cna, flags=NUMA),
        rf"emulator: IMPORT refused \({err(errno.EACCES)}\): no live export covers "
        rf"pa={addr:#x} size={block:#x}: memory nobody exported is not hot-added",
        rf"Failed to prepare import memory: ret={err(errno.EACCES)}",
    )


def test_export_size_list_too_long(
    dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    refuse(
        kmsg,
        kernel_log,
        errno.E2BIG,
        lambda: dev.export(SZ_2M, length=abi.OBMM_MAX_LOCAL_NUMA_NODES + 1),
        r"Size list is too long: max=16, actual_length=17",
    )


def test_export_size_not_memseg_multiple(
    dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.export(SZ_2M + SZ_4K),
        r"The size of new OBMM region 0x201000 on node 0 is not aligned to OBMM memseg size "
        r"0x200000\.",
    )


def test_export_beyond_the_pool(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    """More than the node's pool holds, without waiting (FAST): the allocator's own line, its
    __func__ in it (ubmempool_allocator.c:allocate_memory_contiguous)."""
    size = 1 << 32  # more than the guest's RAM: no pool grows to it
    refuse(
        kmsg,
        kernel_log,
        errno.ENOMEM,
        lambda: dev.export(size, flags=abi.OBMM_EXPORT_FLAG_FAST),
        rf"allocate_memory_contiguous: failed to alloc {size:#x} bytes for node 0",
    )


def test_export_pid_allow_mmap(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.export_pid(SZ_2M, SZ_2M, flags=abi.OBMM_EXPORT_FLAG_ALLOW_MMAP),
        r"ALLOW_MMAP flag is not allowed in export_user_addr\.",
    )


def test_unexport_id_zero(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    refuse(
        kmsg,
        kernel_log,
        errno.ENOENT,
        lambda: dev.unexport(0),
        r"mem_id=0 is out of valid mem_id range\.",
    )


def test_unexport_busy(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id):
        refuse(
            kmsg,
            kernel_log,
            errno.EBUSY,
            lambda: dev.unexport(exp.mem_id),
            rf"failed to deactivate: region {exp.mem_id} is being used or in "
            r"creation/destruction process\.",
        )


def test_unimport_of_an_export(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    """obmm_unimport()'s two lines, its __func__ in both."""
    with exported(dev) as exp:
        refuse(
            kmsg,
            kernel_log,
            errno.EINVAL,
            lambda: dev.unimport(exp.mem_id),
            rf"obmm_unimport: mem_id={exp.mem_id} region type mismatched\.",
            rf"obmm_unimport: mem_id={exp.mem_id} failed, {err(errno.EINVAL)}\.",
        )


def test_addr_query_unknown_key(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    cmd = abi.new("struct obmm_cmd_addr_query")
    cmd.key_type = 7
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.ioctl("OBMM_CMD_ADDR_QUERY", cmd),
        r"invalid query key type: 7\.",
    )


def test_declare_preimport_unaligned_length(
    dev: obmm.Obmm, fabric: Fabric, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text().strip(), 16)
    refuse(
        kmsg,
        kernel_log,
        errno.EINVAL,
        lambda: dev.declare_preimport(fabric.window_base(), block + SZ_2M, scna=fabric.cna),
        rf"preimport length not aligned to {block:#x}\.",
    )


def test_update_range_on_o_sync(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id, sync=True) as shm, shm.mmap(SZ_2M) as m:
        state = abi.OBMM_SHM_MEM_NORMAL | abi.OBMM_SHM_MEM_READWRITE
        refuse(
            kmsg,
            kernel_log,
            errno.EINVAL,
            lambda: shm.update_range(m.addr, m.addr + SZ_2M, state, abi.OBMM_SHM_CACHE_INFER),
            rf"Ownership operation is not applicable to o-sync mmap {exp.mem_id}\.",
        )


def test_mmap_pmd_unaligned_length(
    dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog
) -> None:
    with exported(dev, 2 * SZ_2M) as exp, obmm.ShmDev(exp.mem_id) as shm:
        (text,) = refuse(
            kmsg,
            kernel_log,
            errno.EINVAL,
            lambda: shm.mmap(SZ_2M + SZ_4K, pmd=True),
            r"PMD mmap vma not PMD-aligned: start=0x[0-9a-f]+ end=0x[0-9a-f]+",
        )
        start, end = (int(v, 16) for v in re.findall(r"=(0x[0-9a-f]+)", text))
        assert start % SZ_2M == 0 and end - start == SZ_2M + SZ_4K


def test_success_logs_no_refusal(
    dev: obmm.Obmm,
    fabric: Fabric,
    live: tuple[int, obmm.Export],
    kmsg: KmsgWatcher,
    kernel_log: KernelLog,
) -> None:
    driver_lines(kmsg, kernel_log)
    imp = dev.import_(live[0], SZ_2M, scna=fabric.cna, tokenid=live[1].tokenid)
    dev.unimport(imp.mem_id)
    assert [t for lvl, t in driver_lines(kmsg, kernel_log) if lvl <= KERN_ERR] == []


@pytest.mark.emulator_only
def test_flood_is_rate_limited(dev: obmm.Obmm, kmsg: KmsgWatcher, kernel_log: KernelLog) -> None:
    """100 bad calls in a row leave at most the burst of 10 lines of their call site (the
    emulator's lines are rate-limited; the real driver's are not)."""
    driver_lines(kmsg, kernel_log)
    for _ in range(100):
        with pytest.raises(OSError):
            dev.unexport(0)
    lines = [t for _, t in driver_lines(kmsg, kernel_log) if "valid mem_id range" in t]
    assert 1 <= len(lines) <= 10
