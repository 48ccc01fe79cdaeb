"""The kernel log of a refused call: one line per refused ioctl (or shmdev mmap).

Each line names the operation, the errno, the check and the offending values, in the real
driver's words where it logs one (docs/obmm-driver.md section 4.12; openeuler-mirror/kernel
drivers/ub/obmm/obmm_import.c@bf00953, obmm_export_from_pool.c@d4f4936,
obmm_export_from_user.c@80a7753, obmm_export.c@d4f4936, obmm_core.c@53eaf2b,
obmm_preimport.c@7863d54, obmm_shm_dev.c@753ece1):

    obmm: IMPORT refused (-EINVAL): PA=0 unexpected

A sample of rows is provoked here and its one line asserted.  The lines are rate-limited per
call site (10 per 5 s): the module fixture first waits out the window of the tests before.
Emulator-only: the real driver's lines have its own prefix and no "refused (...)" part.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import SZ_2M, SZ_4K, Fabric, exported

import obmm
from obmm import abi

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.emulator_only

# printk's default rate-limit interval (DEFAULT_RATELIMIT_INTERVAL, 5 s) and a margin.
RATELIMIT_WINDOW_S = 5.5
REFUSED = re.compile(r"obmm: (\S+) refused \((-?[A-Z0-9]+)\): (.*)$")
MMAP = abi.OBMM_IMPORT_FLAG_ALLOW_MMAP
NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE


@pytest.fixture(scope="module", autouse=True)
def _fresh_ratelimit() -> None:
    """Every call site's rate-limit window restarts at its next line."""
    time.sleep(RATELIMIT_WINDOW_S)


@dataclass(frozen=True)
class Refusal:
    op: str
    err: str
    text: str


def refusals(log: str) -> list[Refusal]:
    out = []
    for line in log.splitlines():
        m = REFUSED.search(line)
        if m:
            out.append(Refusal(m.group(1), m.group(2), m.group(3)))
    return out


def errname(err: int) -> tuple[str, str]:
    """How %pe prints -err: the name with CONFIG_SYMBOLIC_ERRNAME, else the number."""
    return f"-{errno.errorcode[err]}", f"-{err}"


def refuse_once(
    kernel_log: KernelLog, err: int, call: Callable[[], object], op: str, pattern: str
) -> Refusal:
    """`call` fails with `err` and logs exactly one refusal line: `op`, `err`, `pattern`."""
    kernel_log.take()
    with pytest.raises(OSError) as info:
        call()
    assert info.value.errno == err, info.value
    lines = refusals(kernel_log.take())
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.op == op
    assert line.err in errname(err)
    assert re.search(pattern, line.text), line.text
    return line


@pytest.fixture
def live(dev: obmm.Obmm, fabric: Fabric) -> Iterator[tuple[int, obmm.Export]]:
    with exported(dev, 2 * SZ_2M) as exp:
        yield fabric.loopback_addr(dev, exp.mem_id), exp


def test_import_unknown_flags(dev: obmm.Obmm, fabric: Fabric, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(SZ_2M, SZ_2M, scna=fabric.cna, flags=0x8 | MMAP),
        "IMPORT",
        r"Invalid import flags 0x9 \(unknown flags: 0x8\)",
    )


def test_import_both_models(dev: obmm.Obmm, fabric: Fabric, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(SZ_2M, SZ_2M, scna=fabric.cna, flags=MMAP | NUMA),
        "IMPORT",
        r"Exactly one of \{ALLOW_MMAP, NUMA_REMOTE\} must be specified as import flag",
    )


def test_import_unaligned(
    dev: obmm.Obmm, fabric: Fabric, live: tuple[int, obmm.Export], kernel_log: KernelLog
) -> None:
    addr = live[0] + SZ_4K
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.import_(addr, SZ_2M, scna=fabric.cna),
        "IMPORT",
        rf"PA segments not aligned to OBMM basic granu: base={addr:#x}, size=0x200000, "
        r"granularity=0x200000",
    )


def test_import_unknown_scna(
    dev: obmm.Obmm, fabric: Fabric, live: tuple[int, obmm.Export], kernel_log: KernelLog
) -> None:
    bad = fabric.cna + 0x40
    refuse_once(
        kernel_log,
        errno.ENODEV,
        lambda: dev.import_(live[0], SZ_2M, scna=bad),
        "IMPORT",
        rf"{bad:#x} is not a known scna \(this node's primary_cna is {fabric.cna:#x}\)",
    )


def test_borrow_of_an_unexported_range(
    dev: obmm.Obmm, fabric: Fabric, kernel_log: KernelLog
) -> None:
    block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text(), 16)
    addr = fabric.window_base() + block  # this node's own RAM: nobody exported it
    refuse_once(
        kernel_log,
        errno.EACCES,
        lambda: dev.import_(addr, block, scna=fabric.cna, flags=NUMA),
        "IMPORT",
        rf"emulator: no live export covers pa={addr:#x} size={block:#x}",
    )


def test_export_size_list_too_long(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.E2BIG,
        lambda: dev.export(SZ_2M, length=abi.OBMM_MAX_LOCAL_NUMA_NODES + 1),
        "EXPORT",
        r"Size list is too long: max=16, actual_length=17",
    )


def test_export_size_not_memseg_multiple(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.export(SZ_2M + SZ_4K),
        "EXPORT",
        r"The size of new OBMM region 0x201000 on node 0 is not aligned to OBMM memseg size "
        r"0x200000",
    )


def test_export_pid_allow_mmap(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.export_pid(SZ_2M, SZ_2M, flags=abi.OBMM_EXPORT_FLAG_ALLOW_MMAP),
        "EXPORT_PID",
        r"ALLOW_MMAP flag is not allowed in export_user_addr",
    )


def test_unexport_id_zero(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    refuse_once(
        kernel_log,
        errno.ENOENT,
        lambda: dev.unexport(0),
        "UNEXPORT",
        r"mem_id=0 is out of valid mem_id range",
    )


def test_unexport_busy(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id):
        refuse_once(
            kernel_log,
            errno.EBUSY,
            lambda: dev.unexport(exp.mem_id),
            "UNEXPORT",
            rf"region {exp.mem_id} is being used or in creation/destruction process",
        )


def test_unimport_of_an_export(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    with exported(dev) as exp:
        refuse_once(
            kernel_log,
            errno.EINVAL,
            lambda: dev.unimport(exp.mem_id),
            "UNIMPORT",
            rf"mem_id={exp.mem_id} region type mismatched \(it is an export\)",
        )


def test_addr_query_unknown_key(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    cmd = abi.new("struct obmm_cmd_addr_query")
    cmd.key_type = 7
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.ioctl("OBMM_CMD_ADDR_QUERY", cmd),
        "ADDR_QUERY",
        r"invalid query key type: 7",
    )


def test_declare_preimport_unaligned_length(
    dev: obmm.Obmm, fabric: Fabric, kernel_log: KernelLog
) -> None:
    block = int(Path("/sys/devices/system/memory/block_size_bytes").read_text().strip(), 16)
    refuse_once(
        kernel_log,
        errno.EINVAL,
        lambda: dev.declare_preimport(fabric.window_base(), block + SZ_2M, scna=fabric.cna),
        "DECLARE_PREIMPORT",
        rf"preimport length {block + SZ_2M:#x} not aligned to {block:#x}",
    )


def test_update_range_on_o_sync(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    with exported(dev) as exp, obmm.ShmDev(exp.mem_id, sync=True) as shm, shm.mmap(SZ_2M) as m:
        state = abi.OBMM_SHM_MEM_NORMAL | abi.OBMM_SHM_MEM_READWRITE
        refuse_once(
            kernel_log,
            errno.EINVAL,
            lambda: shm.update_range(m.addr, m.addr + SZ_2M, state, abi.OBMM_SHM_CACHE_INFER),
            "SHMDEV_UPDATE_RANGE",
            rf"Ownership operation is not applicable to o-sync mmap {exp.mem_id}",
        )


def test_mmap_pmd_unaligned_length(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    with exported(dev, 2 * SZ_2M) as exp, obmm.ShmDev(exp.mem_id) as shm:
        line = refuse_once(
            kernel_log,
            errno.EINVAL,
            lambda: shm.mmap(SZ_2M + SZ_4K, pmd=True),
            "SHMDEV_MMAP",
            r"PMD mmap vma not PMD-aligned: start=0x[0-9a-f]+ end=0x[0-9a-f]+$",
        )
        start, end = (int(v, 16) for v in re.findall(r"=(0x[0-9a-f]+)", line.text))
        assert start % SZ_2M == 0 and end - start == SZ_2M + SZ_4K


def test_success_logs_no_refusal(
    dev: obmm.Obmm, fabric: Fabric, live: tuple[int, obmm.Export], kernel_log: KernelLog
) -> None:
    kernel_log.take()
    imp = dev.import_(live[0], SZ_2M, scna=fabric.cna, tokenid=live[1].tokenid)
    dev.unimport(imp.mem_id)
    assert refusals(kernel_log.take()) == []


def test_flood_is_rate_limited(dev: obmm.Obmm, kernel_log: KernelLog) -> None:
    """100 bad calls in a row leave at most the burst of 10 lines of their call site."""
    kernel_log.take()
    for _ in range(100):
        with pytest.raises(OSError):
            dev.unexport(0)
    lines = [r for r in refusals(kernel_log.take()) if r.op == "UNEXPORT"]
    assert 1 <= len(lines) <= 10
