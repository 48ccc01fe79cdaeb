"""Run operations against obmm_emu and a model of it; check both after every step.

Each ``_op_<kind>`` resolves its operation's random words against the model (which region,
which file, which boundary value), says which errnos the model allows (0 = success), makes the
call and updates the model from what happened.  After every step :meth:`Engine.check` compares
the kernel's state with the model and reads the kernel log.

Recording (``Engine(record=True)``, ``python3 -m obmm.fuzz --record FILE``): for comparing two
drivers on one seed (``make fuzz-diff``).  No errno or state is held against the model (it is
the emulator's); each operation's outcome is recorded instead: the errno of every call it made,
the reply fields that do not depend on placement, and any check of the data or the model that
failed.  The kernel log is still checked: a report ends the run.
"""

from __future__ import annotations

import contextlib
import errno
import mmap as mmap_mod
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import obmm
from obmm import abi
from obmm.abi import ffi
from obmm.errors import errno_name
from obmm.fuzz import faults, handoff, target
from obmm.fuzz.model import MAX_REGION_ID, SZ_2M, SZ_4K, U64, File, Map, Model, Region
from obmm.fuzz.ops import Op

R, W = mmap_mod.PROT_READ, mmap_mod.PROT_WRITE
#: Record mode: an export left out on both drivers because one driver's pool scattered it.
SCATTERED = "pool placement: export not one physical run (testbed UMMU is 1:1)"
#: Record mode: finding 1's sequence, left out on both drivers.  The real driver makes a mapping
#: of a read-only fd writable (VM_WRITE without VM_SHARED), so each munmap of one takes its
#: pages off the process's data_vm, which never counted them: data_vm underflows and every
#: later private writable mapping (malloc) is ENOMEM (FIDELITY).
RO_FD_WRITABLE = "UPDATE_RANGE writable on a read-only fd's mapping: real underflows data_vm"
PMD_FLAG = abi.OBMM_MMAP_FLAG_HUGETLB_PMD
BAD_POINTERS = (1, 0xDEAD0000000, (1 << 47) - SZ_4K, U64 - SZ_4K + 1)
OK = 0
#: Record mode: how long a FAST EXPORT waits for the pool to be whole and cleared.
SETTLE_S = 60.0


class Failure(Exception):
    """The driver did something the model does not allow, or the kernel complained."""

    def __init__(self, op: Op | None, kind: str, message: str) -> None:
        self.op = op
        self.kind = kind
        self.message = message
        super().__init__(message)

    @property
    def signature(self) -> tuple[str, str]:
        """What a shrunk reproducer must still show: the check and the operation kind."""
        return self.kind, self.op.kind if self.op else ""

    def __str__(self) -> str:
        where = f"op {self.op.index} ({self.op.kind})" if self.op else "cleanup"
        return f"{self.kind} failure at {where}: {self.message}"


def names(errs: Iterable[int]) -> str:
    return "{" + ", ".join("ok" if e == 0 else errno_name(e) for e in sorted(errs)) + "}"


@dataclass
class Buffer:
    """User memory of this process for EXPORT_PID."""

    addr: int
    length: int
    huge: bool


class Engine:
    def __init__(
        self,
        *,
        reload: bool = True,
        faults_on: bool = True,
        log: bool = False,
        record: bool = False,
        progress: str | None = None,
        skip_exports: Iterable[int] = (),
    ) -> None:
        self.model = Model()
        self.log = log
        self.record = record
        #: record mode: EXPORT operations another driver's run found scattered (left out here)
        self.skip_exports = set(skip_exports)
        #: record mode: one outcome per operation run (see the module's docstring)
        self.outcomes: list[dict[str, object]] = []
        self._outcome: dict[str, object] = {}
        # the operation about to run, rewritten before each one: what a kernel bug that kills
        # this process leaves for whoever ran it (make fuzz prints it)
        self._progress = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) \
            if progress else -1  # fmt: skip
        self.trace: list[str] = []
        self.fabric = target.load_fabric()
        self.pool_total = target.pool_total()
        self.module = target.Module()
        self.reload_ok = reload and self.module.reloadable and not record
        self.faults = faults.FaultInjection.detect() if faults_on and not record else None
        self.kmsg = target.KernelLog(faults.ALLOW if self.faults else ())
        self.dev = obmm.Obmm()
        if target.shmdev_ids() or target.sysfs_ids():
            raise RuntimeError("regions exist already: the fuzzer needs an idle node")
        self.base_refcnt = 0 if record else target.module_refcnt()
        self.base_iomem = target.iomem_others()
        self.peers = [n for n in self.fabric.windows if n != self.fabric.node_id]
        self.buffers = self._buffers()
        self.ops_run = 0
        self.stats: dict[str, tuple[int, float]] = {}  # kind -> (count, seconds)
        # handoff path -> [calls on a live mapping, calls on a revoked one] that reached the path
        self.handoffs: dict[str, list[int]] = {}

    # ---- setup ----

    def _buffers(self) -> list[Buffer]:
        out = []
        old = target.read_int(target.NR_HUGEPAGES)
        self._hugepages_old = old
        with contextlib.suppress(OSError):
            target.NR_HUGEPAGES.write_text(str(old + 2))
        for _ in range(2):
            flags = target.MAP_PRIVATE | target.MAP_ANONYMOUS | target.MAP_HUGETLB
            addr, err = target.mmap(0, SZ_2M, R | W, flags, -1, 0)
            if not err:
                target.write_word(addr, bytes(8))  # fault the huge page in
                out.append(Buffer(addr, SZ_2M, True))
        # an ordinary (not hugetlb) 2 MiB-aligned range: EXPORT_PID refuses it
        addr, err = target.mmap(
            0, 2 * SZ_2M, R | W, target.MAP_PRIVATE | target.MAP_ANONYMOUS, -1, 0
        )
        if not err:
            start = (addr + SZ_2M - 1) & ~(SZ_2M - 1)
            for off in range(0, SZ_2M, SZ_4K):
                target.write_word(start + off, b"\1" * 8)
            out.append(Buffer(start, SZ_2M, False))
        return out

    def close(self) -> None:
        if self._progress >= 0:
            os.close(self._progress)
            self._progress = -1
        self.reset()
        self.dev.close()
        self.kmsg.close()
        target.close_kept()
        with contextlib.suppress(OSError):
            target.NR_HUGEPAGES.write_text(str(self._hugepages_old))

    # ---- running ----

    def run(
        self, ops: Sequence[Op], *, check_every: int = 1, deadline: float | None = None
    ) -> Failure | None:
        """Run ``ops`` from an idle node; the first failure, or None.  Leaves the node idle.
        Past ``deadline`` (time.monotonic()) no further operation starts."""
        failure: Failure | None = None
        try:
            for i, op in enumerate(ops):
                self.step(op)
                last = i == len(ops) - 1 or (deadline is not None and time.monotonic() >= deadline)
                if (i + 1) % check_every == 0 or last:
                    self.check(op)
                if last:
                    break
        except Failure as exc:
            failure = exc
        try:
            self.reset()
            self.check(None)
        except Failure as exc:
            failure = failure or exc
        return failure

    def step(self, op: Op) -> None:
        handler: Callable[[Op], None] = getattr(self, f"_op_{op.kind}")
        if self._progress >= 0:
            line = f"op {op.index} ({op.kind}), {self.ops_run} run before it\n".encode()
            os.pwrite(self._progress, line.ljust(80), 0)
        t0 = time.monotonic()
        self._outcome = {"op": op.index, "kind": op.kind, "errnos": []}
        try:
            handler(op)
        except Failure as exc:
            if not self.record or exc.kind == "kernel":
                raise
            # a data, model or sysfs check failed: part of this driver's outcome
            self._outcome["check"] = exc.kind
        finally:
            count, spent = self.stats.get(op.kind, (0, 0.0))
            self.stats[op.kind] = (count + 1, spent + time.monotonic() - t0)
            if self.record:
                self.outcomes.append(self._outcome)
        self.ops_run += 1

    def skipped(self, op: Op, reason: str) -> bool:
        """Record mode: leave out a call whose outcome is the emulator's own (the reason names
        its FIDELITY row), so both drivers stay in the same state; True when left out."""
        if not self.record:
            return False
        self._outcome["skipped"] = reason
        self.note(op, f"skipped: {reason}")
        return True

    def reply(self, **fields: int) -> None:
        """Record mode: reply fields of the operation's call that do not depend on placement."""
        if self.record:
            self._outcome.update(fields)

    def note(self, op: Op, text: str) -> None:
        line = f"[{op.index}] {op.kind} {text}"
        self.trace.append(line)
        if self.log:
            print(line, flush=True)

    def expect(self, op: Op, what: str, got: int, allowed: set[int]) -> None:
        # Any call made with fault injection armed may fail its allocation, whatever the op
        # (a shmdev open allocates a file): ENOMEM is then allowed; the state checks after the
        # step still prove it left nothing behind.
        allowed = allowed | self.injected(op)
        self.note(op, f"{what} -> {'ok' if got == 0 else errno_name(got)}")
        if self.record:
            errnos = self._outcome.setdefault("errnos", [])
            assert isinstance(errnos, list)
            errnos.append("ok" if got == 0 else errno_name(got))
            return
        if got not in allowed:
            raise Failure(
                op, "errno", f"{what}: got {names([got])}, the model allows {names(allowed)}"
            )

    def armed(self, op: Op) -> contextlib.AbstractContextManager[None]:
        """Fault injection around one call, for one operation in five (when there is any)."""
        if self.faults is not None and op.chance(5, 20):
            return self.faults.armed()
        return contextlib.nullcontext()

    def call(self, op: Op, fn: Callable[[], object]) -> tuple[object, int]:
        """Run ``fn``; (result, 0) or (None, errno)."""
        try:
            with self.armed(op):
                return fn(), 0
        except OSError as exc:
            return None, exc.errno or errno.EIO

    def injected(self, op: Op) -> set[int]:
        """Errnos an injected allocation failure may add."""
        return {errno.ENOMEM} if self.faults is not None and op.chance(5, 20) else set()

    # ---- selection helpers ----

    def pick_region(self, op: Op, w: int, *kinds: str) -> int:
        ids = self.model.ids(*kinds)
        if not ids or op.chance(w, 8):
            bogus = (
                0,
                1,
                MAX_REGION_ID,
                MAX_REGION_ID + 1,
                U64,
                max(self.model.ids(), default=0) + 1,
            )
            return op.pick(w, bogus)
        return ids[op.word(w) % len(ids)]

    def pick_file(self, op: Op, w: int) -> File | None:
        files = [f for f in self.model.files if f.fd >= 0]
        return files[op.word(w) % len(files)] if files else None

    def pick_map(self, op: Op, w: int) -> Map | None:
        maps = self.model.maps
        return maps[op.word(w) % len(maps)] if maps else None

    def blob(self, op: Op, w: int, limit: int) -> tuple[int, object, int]:
        """(length, pointer, errno the driver gives for it) of a priv/vendor_info blob."""
        if not op.chance(w, 15):
            return 0, ffi.NULL, OK
        length = op.pick(w, (1, limit, limit + 1, 0xFFFF))
        if op.chance(w + 1, 30):
            return (
                length,
                ffi.cast("void *", op.pick(w + 1, BAD_POINTERS)),
                (errno.EINVAL if length > limit else errno.EFAULT),
            )
        buf = ffi.new("unsigned char[]", length)
        self._keep = buf
        return length, buf, errno.EINVAL if length > limit else OK

    # ---- export side ----

    def _largest_free_run(self) -> int:
        """Largest free run of the pool once quarantine has passed (live exports only)."""
        base, size = self.fabric.pool_base, self.pool_total
        used = sorted(
            (r.pa - base, r.size) for r in self.model.regions.values() if r.kind == "export"
        )
        best, at = 0, 0
        for start, length in used:
            best = max(best, start - at)
            at = max(at, start + length)
        return max(best, size - at)

    def _op_export(self, op: Op) -> None:
        g = self.fabric.granu
        sizes = (g, g, 2 * g, 3 * g, 0, SZ_4K, g + SZ_4K, self.pool_total,
                 self.pool_total + g, 1 << 40, U64 & ~(g - 1), U64)  # fmt: skip
        cmd = abi.new("struct obmm_cmd_export")
        cmd.size[0] = op.pick(0, sizes[:4]) if not op.chance(0, 25) else op.pick(1, sizes)
        cmd.length = 1 if not op.chance(1, 10) else op.pick(1, (0, 2, 16, 17))
        if cmd.length >= 2 and op.chance(2, 50):
            cmd.size[1] = g
        cmd.flags = op.pick(2, (1, 1, 1, 3, 0)) if not op.chance(3, 5) else op.pick(3, (4, U64))
        cmd.pxm_numa = 0 if not op.chance(4, 5) else op.pick(4, (1, 16, 17, -1))
        priv_len, cmd.priv, priv_err = self.blob(op, 5, abi.OBMM_MAX_PRIV_LEN)
        cmd.priv_len = priv_len & 0xFFFF
        vlen, cmd.vendor_info, vendor_err = self.blob(op, 6, abi.OBMM_MAX_VENDOR_LEN)
        cmd.vendor_len = vlen & 0xFFFF
        sz = [int(cmd.size[i]) for i in range(16)]
        n = int(cmd.length)
        total = sum(sz[:n]) if n <= 16 else 0
        if n > 16:
            want = {errno.E2BIG}
        elif not 0 <= int(cmd.pxm_numa) <= 16 or any(s % g for s in sz[:n]):
            want = {errno.EINVAL}
        elif any(sz[i] for i in range(1, n)):
            want = {errno.ENODEV}  # only node 0 is online in a testbed guest
        elif total == 0 or int(cmd.pxm_numa) != 0 or int(cmd.flags) & ~3:
            want = {errno.EINVAL}
        elif priv_err or vendor_err:
            want = {priv_err or vendor_err}
        elif total > self._largest_free_run():
            want = {errno.ENOMEM}
            free = self.pool_total - self.model.pool_used()
            if total <= free and self.skipped(op, "pool placement: obmm_emu needs one free run"):
                return
        else:
            want = {OK}
            if self.peers:
                want.add(errno.EBUSY)  # memory a stopped peer has not acknowledged
            if int(cmd.flags) & abi.OBMM_EXPORT_FLAG_FAST:
                want.add(errno.ENOMEM)  # FAST takes only memory already cleared
        want |= self.injected(op)
        fast = bool(int(cmd.flags) & abi.OBMM_EXPORT_FLAG_FAST)
        if self.record and fast and not target.settle_pool(self.pool_total, timeout=SETTLE_S):
            # FAST takes only cleared memory, which the real driver's pool refills and clears in
            # the background (every mempool_refill_timeout): both start from a whole, cleared
            # pool, so the outcome does not depend on timing.  A pool that does not get there
            # in time is said as such, never recorded as the driver's ENOMEM (fuzz-diff seed 1,
            # op 279: ENOMEM on the real driver after a 5 s wait on a loaded host).
            raise Failure(
                op, "state", f"the pool was not whole and cleared within {SETTLE_S:.0f} s "
                "(a FAST EXPORT's outcome would depend on the background refill's timing)"
            )  # fmt: skip
        if op.index in self.skip_exports and self.skipped(op, SCATTERED):
            return
        _, err = self.call(op, lambda: self.dev.ioctl("OBMM_CMD_EXPORT", cmd))
        self.expect(op, f"size={sz[0]:#x} length={n} flags={int(cmd.flags):#x}", err, want)
        if err:
            return
        mem_id = int(cmd.mem_id)
        if self.record and self._scattered(mem_id, total):
            return
        self.reply(mem_id=mem_id)
        pa = self.dev.query_pa_by_memid(mem_id)
        self.model.regions[mem_id] = Region(
            mem_id, "export", total, pa, int(cmd.tokenid),
            allow_mmap=bool(int(cmd.flags) & 1), zeroed=True,
        )  # fmt: skip

    def _scattered(self, mem_id: int, size: int) -> bool:
        """Record mode: an export whose granules are not one ascending physical run (the real
        driver's pool; obmm_emu's never) is unexported again and left out, marked so that
        fuzz-diff leaves the operation out on the other driver too: on the testbed it has no
        UBA an import reaches (kmod/ub_compat/README.md), on a UB host the UMMU gives it one."""
        g = self.fabric.granu
        pas = [self.dev.query_pa_by_memid(mem_id, off) for off in range(0, size, g)]
        if all(b == a + g for a, b in zip(pas, pas[1:])):
            return False
        cmd = abi.new("struct obmm_cmd_unexport")
        cmd.mem_id = mem_id
        try:
            self.dev.ioctl("OBMM_CMD_UNEXPORT", cmd)
        except OSError:
            return False  # kept: the difference shows where it is imported
        self._outcome = {"op": self._outcome["op"], "kind": self._outcome["kind"],
                         "errnos": [], "skipped": SCATTERED, "scattered": True}  # fmt: skip
        return True

    def _op_export_pid(self, op: Op) -> None:
        cmd = abi.new("struct obmm_cmd_export_pid")
        bufs = self.buffers
        choice = op.word(0) % (len(bufs) + 3)
        buf = bufs[choice] if choice < len(bufs) else None
        va = buf.addr if buf else (0, 1 << 46, U64 & ~(SZ_2M - 1))[choice - len(bufs)]
        cmd.va = ffi.cast("void *", va)
        cmd.length = (
            SZ_2M
            if not op.chance(1, 25)
            else op.pick(1, (0, SZ_4K, 2 * SZ_2M, 1 << 40, U64 & ~(SZ_2M - 1)))
        )
        length = int(cmd.length)
        cmd.flags = 0 if not op.chance(2, 10) else op.pick(2, (1, 2, 4))
        pid = 0 if not op.chance(3, 15) else op.pick(3, (os.getpid(), 4194304, -1))
        cmd.pid = pid
        priv_len, cmd.priv, priv_err = self.blob(op, 4, abi.OBMM_MAX_PRIV_LEN)
        cmd.priv_len = priv_len & 0xFFFF
        if int(cmd.flags) or not length or length % SZ_2M:
            want = {errno.EINVAL}
        elif priv_err:
            want = {priv_err}
        elif pid in (4194304, -1):
            want = {errno.ESRCH}
        elif length >> 12 > os.sysconf("SC_PHYS_PAGES"):
            want = {errno.ENOMEM}
        elif buf is not None and length == SZ_2M:
            want = {OK} if buf.huge else {errno.EOPNOTSUPP}
        elif buf is not None:
            want = {errno.EFAULT, errno.ENOMEM, errno.EOPNOTSUPP, errno.EINVAL, OK}
        else:
            want = {errno.EFAULT, errno.ENOMEM}
        want |= self.injected(op)
        # the real driver sizes its page array from length first: a kernel WARN (kvmalloc over
        # INT_MAX) from 1 TiB on
        too_long = want == {errno.ENOMEM} and length >> 12 > os.sysconf("SC_PHYS_PAGES")
        if too_long and self.skipped(op, "EXPORT_PID length over RAM: real WARNs (FIDELITY)"):
            return
        _, err = self.call(op, lambda: self.dev.ioctl("OBMM_CMD_EXPORT_PID", cmd))
        self.expect(op, f"va={va:#x} length={length:#x} pid={pid}", err, want)
        if err:
            return
        mem_id = int(cmd.mem_id)
        self.reply(mem_id=mem_id)
        segs = tuple(self.dev.query_pa_by_memid(mem_id, o) for o in range(0, length, SZ_2M))
        self.model.regions[mem_id] = Region(
            mem_id, "pid", length, segs[0], int(cmd.tokenid), allow_mmap=False,
            mappable=False, segments=segs,
        )  # fmt: skip

    def _deactivate(self, op: Op, kind: str) -> None:
        exp = kind == "export"
        mem_id = (
            self.pick_region(op, 0, "export", "pid") if exp else self.pick_region(op, 0, "import")
        )
        if op.chance(1, 5):
            mem_id = self.pick_region(op, 1)  # maybe of the other type
        flags = 0 if not op.chance(2, 8) else op.pick(2, (1, U64))
        r = self.model.regions.get(mem_id)
        if not 1 <= mem_id <= MAX_REGION_ID:
            want = {errno.ENOENT}
        elif flags:
            want = {errno.EINVAL}
        elif r is None:
            want = {errno.ENOENT}
        elif self.model.busy(mem_id):
            want = {errno.EBUSY}
        elif r.is_export != exp:
            want = {errno.EINVAL}
        else:
            want = {OK}
        importers = exp and any(i.dep == mem_id for i in self.model.regions.values())
        if self.record and exp and r is not None and not r.scattered:
            # any import over the export's window range, NUMA ones too (they have no dep): one
            # that outlives its export keeps its PA range, and a later export the other driver's
            # pool places there would make an import EEXIST on one driver only
            at = self.fabric.own_base + r.pa
            importers = importers or any(
                i.kind == "import" and i.pa < at + r.size and at < i.pa + i.size
                for i in self.model.regions.values()
            )
        if want == {OK} and importers and self.skipped(op, "UNEXPORT under an import: revokes"):
            return  # obmm_emu revokes a loopback import (FIDELITY); real: the UMMU would fault
        cmd = abi.new("struct obmm_cmd_unexport" if exp else "struct obmm_cmd_unimport")
        cmd.mem_id = mem_id
        cmd.flags = flags
        name = "OBMM_CMD_UNEXPORT" if exp else "OBMM_CMD_UNIMPORT"
        _, err = self.call(op, lambda: self.dev.ioctl(name, cmd))
        self.expect(op, f"mem_id={mem_id} flags={flags:#x}", err, want)
        if err or r is None:
            return
        del self.model.regions[mem_id]
        if r.is_export:
            self.model.forget(r.pa, r.size)
            for imp in self.model.regions.values():
                if imp.dep == mem_id:
                    imp.revoked = True  # synchronously, inside UNEXPORT

    def _op_unexport(self, op: Op) -> None:
        self._deactivate(op, "export")

    def _op_unimport(self, op: Op) -> None:
        self._deactivate(op, "import")

    # ---- import side ----

    def _covering_export(self, addr: int, length: int) -> Region | None:
        """The live export an import of [addr, +length) reaches (IMPORT ignores tokenid)."""
        off = addr - self.fabric.own_base
        for r in sorted(self.model.regions.values(), key=lambda r: r.mem_id):
            if r.scattered or not r.is_export:
                continue  # a scattered EXPORT_PID's [pa, pa + size) is not the export
            if r.pa <= off and off + length <= r.pa + r.size:
                return r
        return None

    def _op_import(self, op: Op) -> None:
        fab = self.fabric
        exports = [self.model.regions[i] for i in self.model.ids("export", "pid")]
        target = exports[op.word(0) % len(exports)] if exports else None
        length = target.size if target else SZ_2M
        derived = target is not None and not op.chance(1, 30)
        if derived:
            assert target is not None
            off = SZ_2M if target.size > SZ_2M and op.chance(2, 30) else 0
            addr = fab.own_base + target.pa + off
            length = target.size - off
        else:
            peer = fab.windows[self.peers[0]][0] if self.peers else fab.own_base
            addr = op.pick(1, (0, fab.own_base, fab.own_base + fab.own_size - SZ_2M, peer,
                               1 << 40, U64 & ~(SZ_2M - 1), fab.own_base + SZ_4K,
                               fab.pool_base))  # fmt: skip
        if op.chance(3, 20):
            length = op.pick(3, (SZ_2M, 0, SZ_4K, 1 << 40, fab.own_size, length + SZ_2M,
                                 U64 & ~(SZ_2M - 1)))  # fmt: skip
        flags = abi.OBMM_IMPORT_FLAG_ALLOW_MMAP
        if op.chance(4, 10):
            flags = op.pick(4, (0, 2, 3, 4, 5, 6, 7, 8, U64))
        token = target.tokenid if target else 0
        if op.chance(5, 10):
            token = op.pick(5, (0, token ^ 1))
        scna = fab.cna if not op.chance(0, 5) else fab.cna + 1
        cmd = abi.new("struct obmm_cmd_import")
        cmd.flags, cmd.addr, cmd.length, cmd.tokenid, cmd.scna = flags, addr, length, token, scna
        cmd.numa_id = -1
        cmd.base_dist = 0 if not flags & 4 else op.pick(5, (0, 5, 10, 11))
        priv_len, cmd.priv, priv_err = self.blob(op, 2, abi.OBMM_MAX_PRIV_LEN)
        cmd.priv_len = priv_len & 0xFFFF
        mmap_f, numa, pre = bool(flags & 1), bool(flags & 4), bool(flags & 2)
        # a share import may not overlap another import nor a declared preimport range
        ranges = [(r.pa, r.size) for r in self.model.regions.values() if r.kind == "import"]
        ranges += sorted(self.model.preimports)
        covering = self._covering_export(addr, length)
        if fab.window_of(addr, length) != fab.node_id:
            covering = None  # a peer's window: at its base, never exported
        if flags & ~7 or mmap_f == numa or (pre and not numa):
            want = {errno.EINVAL}
        elif priv_err:
            want = {priv_err}
        elif (
            not length
            or addr % SZ_2M
            or length % SZ_2M
            or not addr
            or addr + length > U64
            or (numa and not pre and 1 <= int(cmd.base_dist) <= 10)
        ):
            want = {errno.EINVAL}
        elif scna != fab.cna:
            want = {errno.ENODEV}
        elif not pre and any(a < addr + length and addr < a + s for a, s in ranges):
            want = {errno.EEXIST}
        elif fab.window_of(addr, length) is None:
            want = {errno.EINVAL}
        elif numa:
            # the NUMA_REMOTE path (memory hot-add) is emulated elsewhere; any clean answer
            want = {OK, errno.EOPNOTSUPP, errno.EPERM, errno.ENOMEM, errno.EFAULT, errno.EBUSY,
                    errno.EINVAL, errno.ENODEV, errno.EACCES}  # fmt: skip
        else:
            want = {OK}  # with no export behind it: made, and revoked from the start
        # an address from an export's placement, a length past that export: what it overlaps
        # depends on where each driver's pool put the exports (seed 1, op 1180)
        placed = derived and covering is None and want & {OK, errno.EEXIST, errno.EINVAL}
        if placed and self.skipped(op, "IMPORT past its export: overlap depends on placement"):
            return
        unexported = want == {OK} and not numa and covering is None
        if unexported and self.skipped(op, "IMPORT nobody exported: ub_compat refuses (FIDELITY)"):
            return  # obmm_emu makes it, revoked (FIDELITY); ub_compat's decoder check: EINVAL
        want |= self.injected(op)
        _, err = self.call(op, lambda: self.dev.ioctl("OBMM_CMD_IMPORT", cmd))
        self.expect(op, f"addr={addr:#x} length={length:#x} flags={flags:#x}", err, want)
        if err:
            return
        mem_id = int(cmd.mem_id)
        self.reply(mem_id=mem_id, numa_id=int(cmd.numa_id))
        self.model.regions[mem_id] = Region(
            mem_id, "import", length, addr, token, allow_mmap=not numa, numa=numa,
            dep=covering.mem_id if covering and not numa else None,
            revoked=covering is None and not numa,
        )  # fmt: skip

    # ---- queries, preimport, bad ioctls ----

    def _op_addr_query(self, op: Op) -> None:
        cmd = abi.new("struct obmm_cmd_addr_query")
        regions = [self.model.regions[i] for i in self.model.ids()]
        key = op.pick(0, (0, 1, 1, 0, 2))
        cmd.key_type = key
        if key == 0:
            r = regions[op.word(1) % len(regions)] if regions else None
            pa = r.pa + op.pick(2, (0, SZ_4K, r.size - 1)) if r else 0
            if op.chance(3, 20) or r is None:
                pa = op.pick(3, (0, U64, self.fabric.pool_base, self.fabric.own_base))
            cmd.pa = pa
            hit = next((x for x in regions if x.offset_of(pa) is not None), None)
            want = {OK} if hit else {errno.ENOENT}
        elif key == 1:
            mem_id = self.pick_region(op, 1)
            r = self.model.regions.get(mem_id)
            size = r.size if r else SZ_2M
            offset = op.pick(2, (0, SZ_4K, size - 1, size, U64))
            cmd.mem_id, cmd.offset = mem_id, offset
            want = {errno.ENOENT} if r is None else {errno.EINVAL} if offset >= size else {OK}
        else:
            want = {errno.EINVAL}
        _, err = self.call(op, lambda: self.dev.ioctl("OBMM_CMD_ADDR_QUERY", cmd))
        self.expect(op, f"key={key}", err, want)
        if err:
            return
        if key == 0:
            self.reply(mem_id=int(cmd.mem_id), offset=int(cmd.offset))
        if key == 0 and hit is not None:
            got = (int(cmd.mem_id), int(cmd.offset))
            if got != (hit.mem_id, hit.offset_of(pa)):
                raise Failure(op, "model", f"query of pa {pa:#x}: {got}, model {hit.mem_id}")
        if key == 1 and r is not None and int(cmd.pa) != r.pa_at(int(cmd.offset)):
            raise Failure(op, "model", f"query of {mem_id}+{offset:#x}: pa {int(cmd.pa):#x}")

    def _op_preimport(self, op: Op) -> None:
        fab = self.fabric
        cmd = abi.new("struct obmm_cmd_preimport")
        cmd.pa = op.pick(0, (fab.own_base, 0, fab.own_base + SZ_4K, U64 & ~(SZ_2M - 1), 1 << 40))
        cmd.length = op.pick(1, (128 << 20, 0, SZ_2M, 1 << 40, U64 & ~(SZ_2M - 1)))
        cmd.flags = 0 if not op.chance(2, 10) else 1
        cmd.scna = fab.cna if not op.chance(3, 10) else fab.cna + 1
        cmd.numa_id = -1
        cmd.base_dist = op.pick(4, (20, 0, 5, 255))
        declare = not op.chance(5, 40)
        name = "OBMM_CMD_DECLARE_PREIMPORT" if declare else "OBMM_CMD_UNDECLARE_PREIMPORT"
        key = (int(cmd.pa), int(cmd.length))
        # DECLARE succeeds since the borrow model; EOPNOTSUPP stays allowed (no remote node)
        want = {errno.EINVAL, errno.ENODEV, errno.EEXIST, errno.EFAULT, errno.EOPNOTSUPP, OK}
        if not declare and key not in self.model.preimports:
            want = {errno.EINVAL, errno.EFAULT}
        _, err = self.call(op, lambda: self.dev.ioctl(name, cmd))
        self.expect(op, f"{name[9:]} pa={key[0]:#x} length={key[1]:#x}", err, want)
        if not err:
            if declare:
                self.reply(numa_id=int(cmd.numa_id))
            (self.model.preimports.add if declare else self.model.preimports.discard)(key)

    def _op_bad_ioctl(self, op: Op) -> None:
        files = [f for f in self.model.files if f.fd >= 0]
        on_shm = bool(files) and op.chance(0, 40)
        fd = files[op.word(1) % len(files)].fd if on_shm else self.dev.fd
        known = [v[0] for k, v in abi.IOCTLS.items() if k.startswith("OBMM_SHMDEV") == on_shm]
        if op.chance(2, 50):
            request = op.pick(3, known)
            want = {errno.EFAULT}
        else:
            request = abi.ioc(3, "x", 8 + op.word(3) % 200, 8)
            want = {errno.ENOTTY}
        self.note(op, "")
        err = target.raw_ioctl(fd, request, op.pick(4, (*BAD_POINTERS, 0)))
        self.expect(op, f"{'shmdev' if on_shm else 'obmm'} cmd={request:#x}", err, want)

    # ---- shmdev files and mappings ----

    def _op_open(self, op: Op) -> None:
        mem_id = self.pick_region(op, 0)
        acc = op.pick(1, (os.O_RDWR,) * 5 + (os.O_RDONLY, os.O_RDONLY, os.O_WRONLY))
        sync = op.chance(2, 35)
        flags = acc | os.O_CLOEXEC | (os.O_SYNC if sync else 0)
        r = self.model.regions.get(mem_id)
        if r is None:
            want = {errno.ENOENT}
        elif not r.mappable:
            want = {errno.EPERM}
        else:
            want = {OK}
        path = f"/dev/obmm_shmdev{mem_id}"
        fd, err = self.call(op, lambda: os.open(path, flags))
        self.expect(op, f"{path} flags={flags:#x}", err, want)
        if err:
            return
        assert isinstance(fd, int)
        self.model.files.append(
            File(self.model.next_fid, fd, mem_id, acc != os.O_WRONLY, acc != os.O_RDONLY, sync)
        )
        self.model.next_fid += 1

    def _op_close(self, op: Op) -> None:
        f = self.pick_file(op, 0)
        if f is None:
            return
        os.close(f.fd)
        self.note(op, f"fd of {f.mem_id}")
        f.fd = -1
        self.model.gc_files()

    def _op_mmap(self, op: Op) -> None:
        f = self.pick_file(op, 0)
        if f is None:
            return
        r = self.model.regions[f.mem_id]
        size = r.size
        length = op.pick(1, (size, size, SZ_2M, SZ_4K, 2 * SZ_2M, 0, size + SZ_4K))
        offset = 0 if not op.chance(2, 30) else op.pick(2, (SZ_4K, SZ_2M, size, size - SZ_2M))
        pmd = op.chance(3, 30)
        prot = op.pick(4, (R | W, R | W, R, W) if f.write or op.chance(4, 30) else (R,))
        shared = not op.chance(5, 5)
        granu = SZ_2M if pmd else SZ_4K
        mode = "nc" if f.sync else "cc"
        if length == 0:
            want = {errno.EINVAL}
        elif not f.read or (shared and prot & W and not f.write):
            want = {errno.EACCES}
        elif not shared:
            want = {errno.EINVAL}
        elif not r.allow_mmap:
            want = {errno.EPERM}
        elif pmd and (length % SZ_2M or offset % SZ_2M):
            want = {errno.EINVAL}
        elif r.granu and r.granu != granu:
            want = {errno.EPERM}
        elif offset >= size or length > size - offset:
            want = {errno.EINVAL}
        elif self.model.mapped(r.mem_id) and r.mode != mode:
            want = {errno.EPERM}
        elif r.revoked:
            want = {errno.ENXIO}
        else:
            want = {OK}
        if want == {OK} and self.injected(op):
            # remap_pfn_range() reports a failed PAT reservation as EINVAL (mm/memory.c), as
            # the PMD granule's reservation does
            want.add(errno.EINVAL)
        want |= self.injected(op)
        raw = offset | (PMD_FLAG if pmd else 0)
        map_flags = target.MAP_SHARED if shared else target.MAP_PRIVATE
        with self.armed(op):
            addr, err = target.mmap(0, length, prot, map_flags, f.fd, raw)
        self.expect(op, f"{r.mem_id} length={length:#x} offset={offset:#x} pmd={pmd}", err, want)
        if err:
            return
        if pmd and addr % SZ_2M:
            raise Failure(op, "model", f"PMD mapping at {addr:#x}, not 2 MiB aligned")
        access = [0x8 if prot & W else 0x0 if prot & R else 0xC] * (length // granu)
        m = Map(addr, length, r.mem_id, f, offset, bool(prot & W), granu, access)
        self.model.maps.append(m)
        r.granu, r.mode = granu, mode
        r.ownership = r.ownership or mode == "cc"

    def _drop_tail(self, m: Map, keep: int) -> None:
        if keep:
            m.length = keep
        else:
            self.model.maps.remove(m)
            self.model.gc_files()

    def _op_munmap(self, op: Op) -> None:
        m = self.pick_map(op, 0)
        if m is None:
            return
        pieces = m.length // m.granu
        if pieces > 1 and op.chance(4, 30):
            self._split(op, m)
            return
        keep = m.granu * (1 + op.word(2) % (pieces - 1)) if pieces > 1 and op.chance(1, 50) else 0
        if keep and op.chance(3, 20) and m.granu == SZ_2M:
            keep += SZ_4K  # a cut inside a PMD granule: may_split refuses it
        # a cut splits the VMA: under fault injection the split may fail (ENOMEM)
        with self.armed(op):
            err = target.munmap(m.addr + keep, m.length - keep)
        allowed = {OK} if keep % m.granu == 0 else {errno.EINVAL}
        self.expect(op, f"{m.mem_id} keep={keep:#x} of {m.length:#x}", err, allowed)
        if not err:
            self._drop_tail(m, keep)
        elif keep and err == errno.ENOMEM:
            # the cut is made before the allocation that failed, and stays (6.1 mm/mmap.c:
            # do_mas_align_munmap: a failed munmap_sidetree() leaves the split)
            m.split = True

    def _split(self, op: Op, m: Map) -> None:
        """madvise() of whole granules inside a mapping: the kernel splits its VMA there, so
        UPDATE_RANGE, munmap and close meet pieces (issue 36: a VM_MAYWRITE changed between
        splits miscounted the region's writable mappings).  Armed, the split's allocation may
        fail: madvise says EAGAIN and the kernel closes the piece it had opened, emptied; a
        range inside the mapping needs two cuts, and when the second fails the first stays
        (6.1 mm/madvise.c:madvise_update_vma), so a failed madvise may have split it too."""
        pieces = m.length // m.granu
        first = op.word(1) % pieces
        count = 1 + op.word(2) % (pieces - first)
        if first == 0 and count == pieces:
            count -= 1  # at least one cut
        advice = op.pick(3, (mmap_mod.MADV_RANDOM, mmap_mod.MADV_SEQUENTIAL))
        with self.armed(op):
            err = target.madvise(m.addr + first * m.granu, count * m.granu, advice)
        allowed = {OK} | ({errno.EAGAIN} if self.injected(op) else set())
        self.expect(op, f"{m.mem_id} madvise({advice}) granules {first}+{count}", err, allowed)
        m.split = True  # done, or (armed) perhaps half done

    def _op_mprotect(self, op: Op) -> None:
        m = self.pick_map(op, 0)
        if m is None:
            return
        length = m.length if op.chance(1, 50) else m.granu
        prot = op.pick(2, (R, R | W, 0))
        # write access a shared mapping of a read-only file may never get: the core says no
        want = errno.EACCES if prot & W and not m.file.write else errno.EOPNOTSUPP
        err = target.mprotect(m.addr, length, prot)
        self.expect(op, f"{m.mem_id} length={length:#x} prot={prot}", err, {want})

    def _op_mremap(self, op: Op) -> None:
        m = self.pick_map(op, 0)
        if m is None:
            return
        how = op.pick(1, ("grow", "shrink", "move"))
        if how == "grow":
            _, err = target.mremap(m.addr, m.length, m.length + m.granu, 0)
            self.expect(op, f"{m.mem_id} grow", err, {errno.EFAULT})
        elif how == "shrink" and m.length > m.granu:
            keep = m.length - m.granu
            _, err = target.mremap(m.addr, m.length, keep, 0)
            self.expect(op, f"{m.mem_id} shrink to {keep:#x}", err, {OK})
            if not err:
                self._drop_tail(m, keep)
        elif how == "move":
            flags = target.MAP_PRIVATE | target.MAP_ANONYMOUS | target.MAP_NORESERVE
            spare, err = target.mmap(0, m.length, 0, flags, -1, 0)
            if err:
                return
            fixed = target.MREMAP_MAYMOVE | target.MREMAP_FIXED
            # armed, copy_vma()'s link or move_page_tables() may run out of memory: the kernel
            # then unmaps the copy without asking .mremap (issue 36, finding 9)
            with self.armed(op):
                _, err = target.mremap(m.addr, m.length, m.length, fixed, spare)
            target.munmap(spare, m.length)
            # a mapping a madvise split is more than the one VMA mremap moves: EFAULT first
            # (unless a munmap of its tail left one VMA again)
            want = {errno.EOPNOTSUPP, errno.EFAULT} if m.split else {errno.EOPNOTSUPP}
            self.expect(op, f"{m.mem_id} move", err, want)

    def _op_update_range(self, op: Op) -> None:
        if op.chance(2, 20) and self._update_sequence(op):
            return
        f = self.pick_file(op, 0)
        mapped = [
            g for g in self.model.files if g.fd >= 0 and not g.sync and self.model.mapped(g.mem_id)
        ]
        if mapped and not op.chance(0, 30):
            f = mapped[op.word(0) % len(mapped)]
        if f is None:
            return
        r = self.model.regions[f.mem_id]
        own = [m for m in self.model.maps if m.mem_id == r.mem_id]
        granu = r.granu or SZ_4K
        if own and not op.chance(1, 10):
            m = own[op.word(1) % len(own)]
            start = m.addr + op.pick(2, (0, 0, SZ_4K, granu))
            end = start + op.pick(3, (granu, m.length, m.length, SZ_4K, 0, m.length + granu))
        else:
            start, end = op.pick(2, (0, SZ_2M, U64 & ~(SZ_2M - 1))), op.pick(3, (SZ_2M, 0, U64))
        state = op.pick(4, (0x9, 0x9, 0x1, 0x5, 0xE, 0xB, 0x0, 0x10, 0xA))
        cache = op.pick(5, (4, 0, 1, 2, 3, 5, 255))
        acc = state & 0xC
        valid = not (
            state & ~0xF
            or state & 3 == 0
            or (acc == 4 and state & 3 != 1)
            or (state & 3 == 2 and acc != 0xC)
        )
        if f.sync or not r.ownership or start >= end or start % granu or end % granu:
            want = {errno.EINVAL}
        elif (acc == 8 and (not f.write or not f.read)) or (acc in (0, 4) and not f.read):
            want = {errno.EPERM}
        elif not valid or cache > 4:
            want = {errno.EINVAL}
        else:
            covered = start
            for m in sorted(own, key=lambda m: m.addr):
                if m.addr <= covered < m.addr + m.length:
                    covered = m.addr + m.length
            want = {OK} if covered >= end else {errno.EFAULT}
        _, err = self.call(
            op, lambda: obmm.ShmDev.update_range(self._as_shm(f), start, end, state, cache)
        )
        self.expect(
            op, f"{r.mem_id} [{start:#x}, {end:#x}) state={state:#x} ops={cache}", err, want
        )
        if not err:  # the range's access is the new one, in every mapping of it
            for m in own:
                for i in range(len(m.access)):
                    if start <= m.addr + i * m.granu < end:
                        m.access[i] = acc

    def _update_sequence(self, op: Op) -> bool:
        """Issue 36's UPDATE_RANGE sequences, whole in one operation, on a region this process
        maps nothing of, through fds of its own: ``ro_fd`` (finding 1) maps two granules
        PROT_READ MAP_SHARED from a read-only fd, makes them READWRITE through a read-write fd
        and touches them (reads); ``split`` (finding 6) maps two granules writable, makes them
        READONLY, splits the VMA (madvise of the second granule), makes them READWRITE, unmaps
        them, then maps the region writable again.  Every call must succeed.  False when no
        region fits (the operation is an ordinary UPDATE_RANGE then)."""
        fits = [
            r for r in self.model.regions.values()
            if r.kind in ("export", "import") and r.mappable and r.allow_mmap and not r.numa
            and not r.revoked and not self.model.mapped(r.mem_id) and r.size >= 2 * SZ_4K
        ]  # fmt: skip
        if not fits:
            return False
        r = fits[op.word(3) % len(fits)]
        granu = r.granu or (SZ_2M if op.chance(3, 30) and r.size % SZ_2M == 0 else SZ_4K)
        if r.size < 2 * granu:
            return False
        how = op.pick(5, ("ro_fd", "split"))
        if how == "ro_fd" and self.skipped(op, RO_FD_WRITABLE):
            return True
        raw = PMD_FLAG if granu == SZ_2M else 0
        length = 2 * granu
        path = f"/dev/obmm_shmdev{r.mem_id}"
        fds: list[int] = []
        mapped: list[tuple[int, int]] = []

        def step(what: str, err: int) -> None:
            self.expect(op, f"{r.mem_id} {how}: {what}", err, {OK})

        def update(fd: int, start: int, end: int, state: int) -> int:
            shm = self._as_shm(File(-1, fd, r.mem_id, True, True, False))
            try:
                obmm.ShmDev.update_range(shm, start, end, state, 4)
            except OSError as exc:
                return exc.errno or errno.EIO
            return OK

        def open_(flags: int) -> int:
            try:
                fds.append(os.open(path, flags | os.O_CLOEXEC))
            except OSError as exc:
                step(f"open flags={flags:#x}", exc.errno or errno.EIO)
            return fds[-1]

        try:
            rw = open_(os.O_RDWR)
            src = open_(os.O_RDONLY) if how == "ro_fd" else rw
            prot = R if how == "ro_fd" else R | W
            addr, err = target.mmap(0, length, prot, target.MAP_SHARED, src, raw)
            step(f"mmap {length:#x} prot={prot} pmd={bool(raw)}", err)
            if err:
                return True
            mapped.append((addr, length))
            r.granu, r.mode, r.ownership = granu, "cc", True
            if how == "ro_fd":
                step("READWRITE through a read-write fd", update(rw, addr, addr + length, 0x9))
                for off in (0, granu):  # a PMD granule is made at its fault
                    target.read_word(addr + off)
                return True
            step("READONLY", update(rw, addr, addr + length, 0x1))
            step("madvise split", target.madvise(addr + granu, granu, mmap_mod.MADV_RANDOM))
            step("READWRITE across the split", update(rw, addr, addr + length, 0x9))
            mapped.clear()
            step("munmap", target.munmap(addr, length))
            again, err = target.mmap(0, length, R | W, target.MAP_SHARED, rw, raw)
            step("writable mmap again", err)
            if not err:
                mapped.append((again, length))
            return True
        finally:
            for addr, size in mapped:
                target.munmap(addr, size)
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _as_shm(f: File) -> obmm.ShmDev:
        shm = obmm.ShmDev.__new__(obmm.ShmDev)
        shm.fd, shm.mem_id, shm.path = f.fd, f.mem_id, ""
        return shm

    # ---- data, /proc/self/mem, fork, sysfs ----

    def _expected_word(self, m: Map, off: int) -> bytes | None:
        phys = self.model.phys_of(m, off, self.fabric.own_base)
        if phys is None:
            return None
        if phys in self.model.data:
            return self.model.data[phys]
        r = self.model.regions[m.mem_id]
        src = r if r.is_export else self.model.regions.get(r.dep) if r.dep else None
        return bytes(8) if src is not None and src.zeroed else None

    def _readable(self, m: Map) -> bool:
        return not self.model.regions[m.mem_id].revoked

    def _op_data(self, op: Op) -> None:
        live = [m for m in self.model.maps if self._readable(m)]
        if not live:
            return
        m = live[op.word(0) % len(live)]
        off = (op.word(1) % m.length) & ~7
        if not m.can_read(off):
            return  # an UPDATE_RANGE took the access away: it would fault (SIGSEGV)
        if m.can_write(off) and op.chance(2, 60):
            word = op.word(3).to_bytes(8, "little")
            target.write_word(m.addr + off, word)
            phys = self.model.phys_of(m, off, self.fabric.own_base)
            if phys is not None:
                self.model.data[phys] = word
            self.note(op, f"write {m.mem_id}+{m.offset + off:#x}")
        phys = self.model.phys_of(m, off, self.fabric.own_base)
        for other in live:
            if phys is None:
                continue
            o_phys0 = self.model.phys_of(other, 0, self.fabric.own_base)
            if o_phys0 is None or not o_phys0 <= phys < o_phys0 + other.length:
                continue
            if not other.can_read(phys - o_phys0):
                continue
            want = self._expected_word(other, phys - o_phys0)
            got = target.read_word(other.addr + phys - o_phys0)
            if want is not None and got != want:
                raise Failure(
                    op, "data",
                    f"{other.mem_id}+{other.offset + phys - o_phys0:#x} reads {got.hex()}, "
                    f"the model says {want.hex()}",
                )  # fmt: skip

    def _op_peek(self, op: Op) -> None:
        m = self.pick_map(op, 0)
        if m is None:
            return
        off = (op.word(1) % m.length) & ~7
        data, err = target.proc_mem_read(m.addr + off, 8)
        revoked = self.model.regions[m.mem_id].revoked or not m.can_read(off)
        self.expect(
            op, f"/proc/self/mem {m.mem_id}+{off:#x}", err, {errno.EIO} if revoked else {OK}
        )
        want = None if revoked else self._expected_word(m, off)
        if want is not None and data != want:
            raise Failure(op, "data", f"/proc/self/mem read {data.hex()}, model {want.hex()}")

    def _op_handoff(self, op: Op) -> None:
        """A mapped address handed to another kernel path (obmm.fuzz.handoff): a futex,
        vmsplice, splice, O_DIRECT, process_vm_*, EXPORT_PID, ptrace, madvise, mlock.  A live
        mapping is touched first, as a program would (a PMD-granule 2 MiB gets its entries
        then), and must hold what the model says before and after."""
        m = self.pick_map(op, 0)
        if m is None:
            return
        r = self.model.regions[m.mem_id]
        names = [*sorted(handoff.PATHS), "ptrace_poke"]
        name = op.pick(1, names)
        off = (op.word(2) % m.length) & ~(SZ_4K - 1)
        addr = m.addr + off
        if not m.can_read(off):
            # PROT_NONE, or an UPDATE_RANGE took the access away: the touch would fault
            self.note(op, f"{name}: {m.mem_id}+{m.offset + off:#x} is not readable here")
            return
        want_word = None if r.revoked else self._expected_word(m, off)
        if not r.revoked:
            got = target.read_word(addr)  # the touch
            if want_word is not None and got != want_word:
                raise Failure(op, "data", f"{m.mem_id}+{m.offset + off:#x} reads {got.hex()} "
                              f"before the handoff, the model says {want_word.hex()}")  # fmt: skip
        if name == "ptrace_poke":
            word = op.word(3).to_bytes(8, "little")
            _, err = handoff.ptrace_peek(addr, poke=word)
            self._count_handoff(name, r.revoked)
            # PTRACE_POKEDATA writes through .access, where the page is writable: an
            # UPDATE_RANGE to READONLY took that away as it did for a store
            allowed = {errno.EIO} if r.revoked or not m.can_write(off) else {OK}
            self.expect(op, f"ptrace poke {m.mem_id}+{m.offset + off:#x}", err, allowed)
            if not err:
                phys = self.model.phys_of(m, off, self.fabric.own_base)
                if phys is not None:
                    self.model.data[phys] = word
                want_word = word
        else:
            answer = handoff.PATHS[name]
            value = None if r.revoked else int.from_bytes(target.read_word(addr)[:4], "little") ^ 1
            fd = m.file.fd
            with self.armed(op) if name == "export_pid" else contextlib.nullcontext():
                got_err = handoff.call(name, m.addr if name.startswith(("madvise", "mlock"))
                                       else addr, m.length, fd=fd, dev=self.dev,
                                       value=0 if r.revoked else value)  # fmt: skip
            if got_err is None:
                self.note(op, f"{name}: not here")
                return
            self._count_handoff(name, r.revoked)
            want = answer.revoked if r.revoked else answer.live
            allowed = {OK if want == "ok" else getattr(errno, want)}
            if name == "export_pid":
                allowed |= self.injected(op)
            self.expect(op, f"{name} {m.mem_id}+{m.offset + off:#x}", got_err, allowed)
        if not r.revoked:
            got = target.read_word(addr)
            if want_word is not None and got != want_word:
                raise Failure(op, "data", f"{m.mem_id}+{m.offset + off:#x} reads {got.hex()} "
                              f"after {name}, the model says {want_word.hex()}")  # fmt: skip

    def _count_handoff(self, name: str, revoked: bool) -> None:
        self.handoffs.setdefault(name, [0, 0])[1 if revoked else 0] += 1

    #: DECLARE_PREIMPORT lengths, block multiples: those whose block bitmap kmalloc cannot give
    #: (above 2^52 bytes with 128 MiB blocks: ENOMEM, the real driver's errno there) and some
    #: that a window cannot hold (EINVAL).
    BIG_LENGTHS = (1 << 57, 1 << 60, 1 << 62, 1 << 53, 1 << 52, 1 << 45, 1 << 40)

    def _op_declare_big(self, op: Op) -> None:
        fab = self.fabric
        block = 128 << 20
        length = op.pick(0, self.BIG_LENGTHS)
        pa = fab.own_base + block * (op.word(1) % 8)
        cmd = abi.new("struct obmm_cmd_preimport")
        cmd.pa, cmd.length, cmd.scna, cmd.numa_id, cmd.base_dist = pa, length, fab.cna, -1, 20
        ranges = [(r.pa, r.size) for r in self.model.regions.values() if r.kind == "import"]
        ranges += sorted(self.model.preimports)
        bitmap = ((length // block + 63) // 64) * 8
        if any(a < pa + length and pa < a + s for a, s in ranges):
            want = {errno.EEXIST}
        elif bitmap > 4 << 20:  # KMALLOC_MAX_SIZE of x86_64 and arm64 with 4 KiB pages
            want = {errno.ENOMEM}
        else:
            want = {errno.EINVAL}  # outside every window
            if bitmap > 1 << 20:
                want.add(errno.ENOMEM)  # a costly allocation may fail
        # the real driver's bitmap_zalloc() asks kmalloc for it without __GFP_NOWARN: a kernel
        # WARN past KMALLOC_MAX_SIZE (obmm_emu refuses first: FIDELITY)
        if want == {errno.ENOMEM} and self.skipped(
            op, "DECLARE_PREIMPORT bitmap over KMALLOC_MAX_SIZE: real WARNs (FIDELITY)"
        ):
            return
        _, err = self.call(op, lambda: self.dev.ioctl("OBMM_CMD_DECLARE_PREIMPORT", cmd))
        self.expect(op, f"pa={pa:#x} length={length:#x}", err, want)
        if not err:
            self.model.preimports.add((pa, length))

    def _op_fork(self, op: Op) -> None:
        pid = os.fork()
        if pid == 0:
            # VM_DONTCOPY: no obmm mapping in the child
            code = 3 if target.mapped_bytes() else 0
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.expect(op, "child sees no mapping", 0 if code == 0 else errno.EEXIST, {OK})

    def _op_sysfs(self, op: Op) -> None:
        ids = self.model.ids()
        dirs = [target.EMU, target.MEMPOOL / f"obmm-{0}"]
        if ids:
            dirs.append(target.SHMDEV_SYSFS / f"obmm_shmdev{ids[op.word(0) % len(ids)]}")
        for d in dirs:
            for p in target.files_in(d):
                try:
                    target.read_bytes(p)
                except OSError as exc:
                    raise Failure(op, "sysfs", f"{p}: {exc}") from exc
        if ids:
            mem_id = ids[op.word(0) % len(ids)]
            size = target.read_int(target.SHMDEV_SYSFS / f"obmm_shmdev{mem_id}" / "size")
            if size != self.model.regions[mem_id].size:
                raise Failure(op, "sysfs", f"obmm_shmdev{mem_id}/size {size:#x}")
        self.note(op, f"{len(dirs)} directories")

    def _op_drain(self, op: Op) -> None:
        """Back to idle through the front door (the model's own teardown), now and then."""
        self.note(op, f"{len(self.model.maps)} maps, {len(self.model.files)} files, "
                  f"{len(self.model.regions)} regions")  # fmt: skip
        self.reset()

    def _op_reload(self, op: Op) -> None:
        if not self.reload_ok:
            self.skipped(op, "module reload: not in record mode")
            return
        idle = self.model.idle()
        self.dev.close()
        ok = self.module.rmmod()
        try:
            self.module.insmod()
        except Exception as exc:
            raise Failure(op, "reload", f"insmod: {exc}") from exc
        self.dev = obmm.Obmm()
        if self.module.last_rmmod_s > self.module.unload_bound():
            raise Failure(op, "reload", f"rmmod took {self.module.last_rmmod_s:.1f} s")
        if ok:
            self.fabric = target.load_fabric()
            self.pool_total = target.pool_total()
        self.base_refcnt = target.module_refcnt() - self.expected_refs()
        self.expect(op, f"rmmod ({'idle' if idle else 'busy'})", OK if ok else errno.EBUSY,
                    {OK} if idle else {errno.EBUSY})  # fmt: skip

    # ---- the model check ----

    def expected_refs(self) -> int:
        """Module references: one per published region, two per open shmdev file (the
        cdev's owner and the file's fops), one per declared preimport range."""
        m = self.model
        return len(m.regions) + 2 * len(m.live_files()) + len(m.preimports)

    def check(self, op: Op | None) -> None:
        if self.record:
            # the model is the emulator's: only the kernel log holds for every driver
            report = self.kmsg.reports()
            if report:
                raise Failure(op, "kernel", report)
            return
        m = self.model
        ids = set(m.regions)
        for what, got in (("/dev nodes", target.shmdev_ids()), ("sysfs", target.sysfs_ids())):
            if got != ids:
                raise Failure(op, "state", f"{what} {sorted(got)}, model {sorted(ids)}")
        used = target.pool_used()
        if used != m.pool_used():
            raise Failure(op, "state", f"pool used {used:#x}, live exports {m.pool_used():#x}")
        iomem = target.iomem()  # one read for its three views: one state, fewer reads
        memids, direct = iomem.memids, iomem.direct
        imports = {i for i, r in m.regions.items() if r.kind == "import" and not r.numa}
        numa = {i for i, r in m.regions.items() if r.numa}
        if not imports <= memids <= imports | numa or direct < len(imports):
            raise Failure(
                op, "state", f"/proc/iomem MEMID {sorted(memids)}, imports {sorted(imports)}"
            )
        declared = iomem.preimports
        if declared != m.preimports:
            raise Failure(
                op, "state", f"/proc/iomem PREIMPORT_UBMEM {sorted(declared)}, declared "
                f"{sorted(m.preimports)}"
            )  # fmt: skip
        others = iomem.others
        if others != self.base_iomem:
            gone = sorted(set(self.base_iomem) - set(others))
            new = sorted(set(others) - set(self.base_iomem))
            raise Failure(op, "state", f"/proc/iomem changed: lost {gone}, gained {new}")
        revoked = {i for i, r in m.regions.items() if r.revoked}
        got_revoked = target.revoked_ids()
        if got_revoked != revoked:
            raise Failure(op, "state", f"revoked {sorted(got_revoked)}, model {sorted(revoked)}")
        refs = target.module_refcnt() - self.base_refcnt
        if refs != self.expected_refs():
            raise Failure(op, "state", f"module refcnt +{refs}, model +{self.expected_refs()}")
        mapped: dict[int, int] = {}
        for mp in m.maps:
            mapped[mp.mem_id] = mapped.get(mp.mem_id, 0) + mp.length
        got_maps = target.mapped_bytes()
        if got_maps != mapped:
            raise Failure(op, "state", f"mapped bytes {got_maps}, model {mapped}")
        lines = target.preimport_lines()
        if lines and lines != 1 + len(m.preimports):
            raise Failure(op, "state", f"preimport_info {lines} lines, model {len(m.preimports)}")
        report = self.kmsg.reports()
        if report:
            raise Failure(op, "kernel", report)

    # ---- back to idle ----

    def reset(self) -> None:
        m = self.model
        for mp in list(m.maps):
            target.munmap(mp.addr, mp.length)
        m.maps.clear()
        for f in m.files:
            if f.fd >= 0:
                os.close(f.fd)
        m.files.clear()
        for key in list(m.preimports):
            cmd = abi.new("struct obmm_cmd_preimport")
            cmd.pa, cmd.length = key
            try:
                self.dev.ioctl("OBMM_CMD_UNDECLARE_PREIMPORT", cmd)
            except OSError as exc:
                raise Failure(None, "cleanup", f"undeclare {key}: {exc}") from exc
        m.preimports.clear()
        self._remove_all()

    def _remove_all(self) -> None:
        m = self.model
        for kind in ("import", "export"):
            for mem_id in list(m.regions):
                r = m.regions[mem_id]
                if (r.kind == "import") != (kind == "import"):
                    continue
                try:
                    if kind == "import":
                        self.dev.unimport(mem_id)
                    else:
                        self.dev.unexport(mem_id)
                except OSError as exc:
                    raise Failure(None, "cleanup", f"{kind} {mem_id}: {exc}") from exc
                del m.regions[mem_id]
        m.data.clear()
