"""A NUMA_REMOTE IMPORT that fails after its hot-add, while signals arrive: nothing is released
under memory that is still online, and nothing is left once the memory is out.

IMPORT hot-adds the range, then claims its MEMID resource and publishes its device; a failure
there (an allocation, made to fail with ``/proc/thread-self/fail-nth``) rolls the hot-add back by
offlining the memory, which a pending signal interrupts (EINTR) and an unmovable page makes fail
(EBUSY).  The rollback ignored that result: a WARN, then the resources released under online
memory (a preimport declaration freed with a live child).  Now the IMPORT fails with the real
driver's ENOTRECOVERABLE and the region becomes an orphan of the unplug thread, which removes
the memory with its bounded tries, then the region.

Needs a kernel with fault injection (the debug kernel); skips saying so elsewhere.
"""

from __future__ import annotations

import errno
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from obmm_fixtures import Fabric, exported, pool_total, pool_used

import obmm
from obmm import abi
from obmm.fuzz import faults
from obmm.tools import logscan

pytest_plugins = ["obmm_fixtures"]

if TYPE_CHECKING:
    from conftest import KernelLog  # the guest suite's conftest, beside this file

pytestmark = pytest.mark.emulator_only

NUMA = abi.OBMM_IMPORT_FLAG_NUMA_REMOTE
QUARANTINED = Path("/sys/kernel/obmm_emu/quarantined")
# The failure points walked, counted back from the last of a successful IMPORT: the device's
# creation (after the hot-add) is there.
TAIL_POINTS = 40
# A signal every 2 ms: one is pending whenever the rollback offlines.
SIGNAL_EVERY_S = 0.002
UNPLUG_S = 120.0


def block_size() -> int:
    return int(Path("/sys/devices/system/memory/block_size_bytes").read_text().strip(), 16)


def iomem() -> str:
    return Path("/proc/iomem").read_text()


def settled(before: str) -> bool:
    return iomem() == before


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_an_import_failing_after_its_hot_add_leaves_nothing(
    dev: obmm.Obmm, fabric: Fabric, fault_injection: faults.FaultInjection, kernel_log: KernelLog
) -> None:
    block = block_size()
    wait_for(lambda: int(QUARANTINED.read_text(), 0) == 0, UNPLUG_S)
    if pool_total() - pool_used() < block:
        pytest.skip("the pool has no free memory block")
    with exported(dev, block) as exp:
        addr = fabric.loopback_addr(dev, exp.mem_id)
        if addr % block:
            pytest.skip("the pool gave no block-aligned range")

        def borrow() -> obmm.Import:
            return dev.import_(addr, block, scna=fabric.cna, tokenid=exp.tokenid, flags=NUMA)

        before = iomem()
        # every failure point of a whole, successful IMPORT: fail-nth counts them down
        big = 1 << 30
        with fault_injection.nth(big) as reached:
            imp = borrow()
            assert not reached()
            left = int(Path("/proc/thread-self/fail-nth").read_text() or 0)
        dev.unimport(imp.mem_id)
        total = big - left
        assert total > TAIL_POINTS, total
        kernel_log.take()
        old = signal.signal(signal.SIGALRM, lambda signum, frame: None)
        outcomes: dict[str, int] = {}
        try:
            for n in range(total, total - TAIL_POINTS, -1):
                signal.setitimer(signal.ITIMER_REAL, SIGNAL_EVERY_S, SIGNAL_EVERY_S)
                try:
                    with fault_injection.nth(n):
                        try:
                            imp = borrow()
                            err = 0
                        except OSError as exc:
                            err = exc.errno or errno.EIO
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                name = errno.errorcode.get(err, str(err)) if err else "ok"
                outcomes[name] = outcomes.get(name, 0) + 1
                if not err:
                    dev.unimport(imp.mem_id)
                # a failed import leaves nothing once the unplug thread is through
                assert wait_for(lambda: settled(before), UNPLUG_S), (
                    f"failure point {n}: /proc/iomem still differs\n{iomem()}"
                )
                # ENOTRECOVERABLE: the rollback's offlining failed (the real driver's errno there)
                assert err in (0, errno.ENOMEM, errno.EPERM, errno.ENOTRECOVERABLE), (n, err)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        log = kernel_log.take()
    print(f"{TAIL_POINTS} failure points of {total}: {outcomes}")
    assert not logscan.scan(log, allow=()), log
    # the device's creation failed after a hot-add at least once, and so did its rollback
    assert "Failed to create import device" in log, log[-3000:]
    assert outcomes.get("ENOTRECOVERABLE"), outcomes
