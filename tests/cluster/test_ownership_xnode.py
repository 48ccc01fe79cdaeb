"""Ownership across nodes, as libobmm's obmm_set_ownership uses it: node B maps its import of
A's export PROT_NONE, gains READ through OBMM_SHMDEV_UPDATE_RANGE and reads what A wrote, then
loses it again and faults (obmm_shm_dev.c:obmm_shm_update_range changes the mapping's access).
"""

from __future__ import annotations

import random
import shlex
import signal

from test_xnode import B, exporter, import_on, unimport_on
from xharness import ClusterHarness

SZ_2M = 2 << 20
SIGSEGV_STATUS = 128 + signal.SIGSEGV  # how sh reports a child killed by SIGSEGV

# On B: map the import PROT_NONE, then READ, read, NO_ACCESS, read; one line per step.
STEPS = """
import ctypes, sys
import obmm
from obmm import abi
mem_id, n = int(sys.argv[1]), int(sys.argv[2])
NORMAL, INFER = abi.OBMM_SHM_MEM_NORMAL, abi.OBMM_SHM_CACHE_INFER
shm = obmm.ShmDev(mem_id)
m = shm.mmap({size}, prot=obmm.PROT_NONE)
end = m.addr + {size}
print("mapped", flush=True)
shm.update_range(m.addr, end, NORMAL | abi.OBMM_SHM_MEM_READONLY, INFER)
print("read", ctypes.string_at(m.addr, n).hex(), flush=True)
shm.update_range(m.addr, end, NORMAL | abi.OBMM_SHM_MEM_NO_ACCESS, INFER)
print("revoked", flush=True)
print("read again", ctypes.string_at(m.addr, n).hex(), flush=True)
"""


def test_b_gains_read_through_update_range_then_loses_it(
    xc: ClusterHarness, guest_tmp: str
) -> None:
    n = 64
    with exporter(xc, guest_tmp, seed=31) as exp:
        mem_id = import_on(xc, B, exp)
        try:
            script = f"{guest_tmp}/ownership_steps.py"
            xc.run(B, f"cat > {script}", stdin=STEPS.format(size=SZ_2M).encode())
            res = xc.run(
                B,
                f"env {xc.env(B)} {xc.python} {shlex.quote(script)} {mem_id} {n}; echo status=$?",
                check=False,
            )
            lines = res.out.splitlines()
            want = random.Random(31).randbytes(n).hex()  # xnode's pattern of A's export
            assert lines[:3] == ["mapped", f"read {want}", "revoked"], (lines, res.err)
            assert lines[-1] == f"status={SIGSEGV_STATUS}", (lines, res.err)
            assert not any(ln.startswith("read again") for ln in lines), lines
        finally:
            unimport_on(xc, B, mem_id)
