"""The concurrent mode: threads and processes racing the lifetimes of regions, files, the module.

Every round is one scenario with its parameters (delays, counts) drawn from the seed; the
outcome of each racing call must be one the scenario allows, and after the round the node must
be idle again (the single mode's model check with nothing in the model: no region, node, sysfs
entry, pool memory, iomem resource or module reference left, no kernel report).  A seed
replays the same rounds with the same parameters; the interleaving itself is up to the
scheduler, which is the point of racing.

cffi releases the GIL around every C call (ioctl, mmap), so the threads really race in the
kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import obmm
from obmm.errors import errno_name
from obmm.fuzz import target
from obmm.fuzz.engine import Engine, Failure
from obmm.fuzz.model import SZ_2M
from obmm.fuzz.ops import Op

#: How long a round waits for the last round's unexported memory to leave quarantine.
QUARANTINE_S = 30.0


class Skip(Exception):
    """A round's preconditions did not hold (its setup EXPORT found the pool still
    quarantined): the round is not run, and that is no failure."""


def wait_unquarantined(limit: int = 0, seconds: float = QUARANTINE_S) -> bool:
    """Wait until at most ``limit`` bytes are quarantined; False at the deadline."""
    deadline = time.monotonic() + seconds
    while target.quarantined() > limit:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Round:
    index: int
    scenario: str
    rng: random.Random
    engine: Engine
    calls: int = 0
    #: the scenario's preconditions did not hold (no free memory block, no huge page): not run
    skipped: bool = False

    @property
    def op(self) -> Op:
        return Op(self.index, self.scenario, (0,))

    def fail(self, message: str) -> Failure:
        return Failure(self.op, "race", message)

    def delay(self, max_ms: float) -> None:
        time.sleep(self.rng.uniform(0, max_ms) / 1000)

    def errno_of(self, fn: Callable[[], object]) -> int:
        self.calls += 1
        try:
            fn()
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def allow(self, what: str, err: int, allowed: set[int]) -> None:
        if err not in allowed:
            shown = ", ".join("ok" if e == 0 else errno_name(e) for e in sorted(allowed))
            got = "ok" if err == 0 else errno_name(err)
            raise self.fail(f"{what}: {got}, allowed {{{shown}}}")

    @property
    def dev(self) -> obmm.Obmm:
        return self.engine.dev

    def export(self, length: int) -> obmm.Export:
        """A setup EXPORT.  Memory the last round unexported stays quarantined until every live
        peer acknowledged it, and a peer reloading its module or slowed by the debug kernel may
        take longer than EXPORT waits: its EBUSY is then the driver's answer, so the round waits
        for the quarantine and, if it does not drain, is skipped (Skip)."""
        deadline = time.monotonic() + QUARANTINE_S
        while True:
            try:
                return self.dev.export(length)
            except OSError as exc:
                held = target.quarantined()
                if exc.errno != errno.EBUSY or not held:
                    raise
                if time.monotonic() > deadline:
                    raise Skip(f"EXPORT {length:#x}: EBUSY with {held:#x} bytes still "
                               f"quarantined after {QUARANTINE_S:.0f} s") from exc  # fmt: skip
                wait_unquarantined(seconds=1.0)

    def loopback(self, exp: obmm.Export) -> obmm.Import:
        fab = self.engine.fabric
        addr = fab.own_base + self.dev.query_pa_by_memid(exp.mem_id)
        return self.dev.import_(addr, exp.length, scna=fab.cna, tokenid=exp.tokenid)

    def until_ok(self, what: str, fn: Callable[[], object], seconds: float = 10.0) -> None:
        """Retry ``fn`` while it is EBUSY (a racing user still holds the region)."""
        deadline = time.monotonic() + seconds
        while True:
            err = self.errno_of(fn)
            if err == 0:
                return
            self.allow(what, err, {errno.EBUSY})
            if time.monotonic() > deadline:
                raise self.fail(f"{what}: still EBUSY after {seconds} s with nothing racing")
            time.sleep(0.001)


def _run_threads(*targets: Callable[[], None]) -> None:
    """Run targets at once; re-raise the first exception one of them raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                fn()
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


#: open() of a region being torn down: its node is gone (ENOENT), its id is gone (ENXIO), or
#: it is being deactivated (EAGAIN, the real driver's "not active").
GONE = {errno.ENOENT, errno.ENXIO, errno.EAGAIN}


def _map_loop(rd: Round, mem_id: int, rounds: int, gone: set[int]) -> None:
    """Open, map, touch, unmap, close, as fast as possible, until the region is gone."""
    for _ in range(rounds):
        try:
            rd.calls += 1
            shm = obmm.ShmDev(mem_id)
        except OSError as exc:
            rd.allow("open racing the region's end", exc.errno or 0, gone)
            return
        try:
            rd.calls += 1
            with shm.mmap(SZ_2M) as m:
                m.write(0, b"race")
                if m.read(0, 4) != b"race":
                    raise rd.fail("a mapping did not read back what it wrote")
        except OSError as exc:
            rd.allow("mmap racing the region's end", exc.errno or 0, {errno.ENXIO})
        finally:
            shm.close()


def unexport_vs_mmap(rd: Round) -> None:
    exp = rd.export(SZ_2M)
    n = rd.rng.randint(5, 40)

    def kill() -> None:
        rd.delay(5)
        rd.until_ok("UNEXPORT racing open/mmap", lambda: rd.dev.unexport(exp.mem_id))

    _run_threads(lambda: _map_loop(rd, exp.mem_id, n, GONE), kill)


def unimport_vs_mmap(rd: Round) -> None:
    exp = rd.export(SZ_2M)
    imp = rd.loopback(exp)
    n = rd.rng.randint(5, 40)

    def kill() -> None:
        rd.delay(5)
        rd.until_ok("UNIMPORT racing open/mmap", lambda: rd.dev.unimport(imp.mem_id))

    _run_threads(lambda: _map_loop(rd, imp.mem_id, n, GONE), kill)
    rd.dev.unexport(exp.mem_id)


def close_vs_revocation(rd: Round) -> None:
    """A child maps an import, closes the fd and reads on; UNEXPORT revokes it under it."""
    exp = rd.export(SZ_2M)
    imp = rd.loopback(exp)
    ms = rd.rng.uniform(1, 30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        shm = obmm.ShmDev(imp.mem_id)
        m = shm.mmap(SZ_2M)
        shm.close()
        os.write(w, b"1")
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            ctypes.string_at(m.addr, 8)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    rd.delay(ms)
    rd.allow(
        "UNEXPORT under a mapped import", rd.errno_of(lambda: rd.dev.unexport(exp.mem_id)), {0}
    )
    if imp.mem_id not in target.revoked_ids():
        raise rd.fail(f"import {imp.mem_id} not revoked when UNEXPORT returned")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGBUS:
        raise rd.fail(f"reader died of signal {os.WTERMSIG(status)}, not SIGBUS")
    if os.WIFEXITED(status) and os.WEXITSTATUS(status):
        raise rd.fail(f"reader exited {os.WEXITSTATUS(status)}")
    rd.allow(
        "UNIMPORT after the reader ended", rd.errno_of(lambda: rd.dev.unimport(imp.mem_id)), {0}
    )


def export_pid_vs_exit(rd: Round) -> None:
    """EXPORT_PID of a child's memory while the child exits."""
    r, w = os.pipe()
    life = rd.rng.uniform(0, 10)
    huge = rd.rng.random() < 0.7
    pid = os.fork()
    if pid == 0:
        os.close(r)
        flags = target.MAP_PRIVATE | target.MAP_ANONYMOUS | (target.MAP_HUGETLB if huge else 0)
        addr, err = target.mmap(0, 2 * SZ_2M, 3, flags, -1, 0)
        if err:
            os._exit(2)
        start = (addr + SZ_2M - 1) & ~(SZ_2M - 1) if not huge else addr
        target.write_word(start, b"pinned!!")
        os.write(w, start.to_bytes(8, "little"))
        time.sleep(life / 1000)
        os._exit(0)
    os.close(w)
    raw = os.read(r, 8)
    os.close(r)
    if len(raw) != 8:
        os.waitpid(pid, 0)
        rd.skipped = True
        return  # no huge page for the child: nothing to race
    va = int.from_bytes(raw, "little")
    rd.delay(life)
    out: list[obmm.Export] = []

    def export() -> None:
        out.append(rd.dev.export_pid(va, SZ_2M, pid=pid))

    err = rd.errno_of(export)
    allowed = {0, errno.ESRCH, errno.EFAULT, errno.ENOMEM}
    if not huge:
        allowed.add(errno.EOPNOTSUPP)
        allowed.discard(0)
    rd.allow(f"EXPORT_PID of an exiting child ({'huge' if huge else 'small'} pages)", err, allowed)
    os.waitpid(pid, 0)
    for exp in out:
        err = rd.errno_of(lambda e=exp: rd.dev.unexport(e.mem_id))  # type: ignore[misc]
        rd.allow("UNEXPORT after the target exited", err, {0})


def overlapping_imports(rd: Round) -> None:
    """Several threads import overlapping ranges of one export: exactly one wins."""
    exp = rd.export(2 * SZ_2M)
    fab = rd.engine.fabric
    base = fab.own_base + rd.dev.query_pa_by_memid(exp.mem_id)
    lengths = [rd.rng.choice((SZ_2M, 2 * SZ_2M)) for _ in range(rd.rng.randint(2, 4))]
    results: list[tuple[int, obmm.Import | None]] = []
    lock = threading.Lock()

    def one(length: int) -> Callable[[], None]:
        def run() -> None:
            try:
                imp = rd.dev.import_(base, length, scna=fab.cna, tokenid=exp.tokenid)
                res: tuple[int, obmm.Import | None] = (0, imp)
            except OSError as exc:
                res = (exc.errno or 0, None)
            with lock:
                rd.calls += 1
                results.append(res)

        return run

    _run_threads(*(one(n) for n in lengths))
    winners = [imp for err, imp in results if imp is not None]
    for err, _ in results:
        rd.allow("overlapping IMPORT", err, {0, errno.EEXIST})
    for imp in winners:
        rd.dev.unimport(imp.mem_id)
    rd.dev.unexport(exp.mem_id)
    if len(winners) != 1:
        raise rd.fail(f"{len(winners)} of {len(lengths)} overlapping imports succeeded")


def unexport_vs_import(rd: Round) -> None:
    """IMPORT racing UNEXPORT of its export: refused, or made and then revoked."""
    exp = rd.export(SZ_2M)
    fab = rd.engine.fabric
    addr = fab.own_base + rd.dev.query_pa_by_memid(exp.mem_id)
    got: list[obmm.Import] = []
    errs: list[int] = []

    def imp() -> None:
        rd.delay(2)
        try:
            got.append(rd.dev.import_(addr, SZ_2M, scna=fab.cna, tokenid=exp.tokenid))
        except OSError as exc:
            errs.append(exc.errno or 0)

    def kill() -> None:
        rd.delay(2)
        rd.dev.unexport(exp.mem_id)

    _run_threads(imp, kill)
    rd.calls += 2
    for e in errs:
        rd.allow("IMPORT racing UNEXPORT", e, {errno.EACCES})
    for i in got:
        if i.mem_id not in target.revoked_ids():
            raise rd.fail(f"import {i.mem_id} of a withdrawn export is not revoked")
        rd.dev.unimport(i.mem_id)


def rmmod_vs_open(rd: Round) -> None:
    """rmmod while another thread opens and closes /dev/obmm."""
    eng = rd.engine
    if not eng.reload_ok:
        return
    eng.dev.close()
    n = rd.rng.randint(10, 100)
    unloaded: list[bool] = []

    def opener() -> None:
        for _ in range(n):
            rd.calls += 1
            try:
                fd = os.open("/dev/obmm", os.O_RDWR)
            except OSError as exc:
                rd.allow(
                    "open racing rmmod", exc.errno or 0, {errno.ENOENT, errno.ENODEV, errno.ENXIO}
                )
                continue
            os.close(fd)

    def remover() -> None:
        rd.delay(3)
        rd.calls += 1
        unloaded.append(eng.module.rmmod())

    try:
        _run_threads(opener, remover)
    finally:
        eng.module.insmod()
        eng.dev = obmm.Obmm()
    if unloaded and unloaded[0]:
        eng.fabric = target.load_fabric()
        eng.pool_total = target.pool_total()
    eng.base_refcnt = target.module_refcnt()


# ---- mapped addresses faulted, touched and handed off while the region goes ----

#: What the child of fault_vs_unexport runs: map the import (page or PMD granule: the PMD
#: granule installs each 2 MiB at its first touch, in the fault), then touch random words and
#: hand the addresses to GUP paths until revocation kills it (SIGBUS).  Exit 0 after
#: `seconds`; 3 for a read that is not the export's pattern (it wrote nothing).
_TOUCHER = r"""
import os, random, sys, time
import obmm
from obmm.fuzz import handoff
mem_id, size, pmd, seed, seconds = (int(a) for a in sys.argv[1:6])
rng = random.Random(seed)
shm = obmm.ShmDev(mem_id)
m = shm.mmap(size, pmd=bool(pmd))
os.write(1, b"mapped\n")
paths = ["futex_wake", "vmsplice", "process_vm_readv", "o_direct_write", "ptrace_peek"]
end = time.monotonic() + seconds / 1000
while time.monotonic() < end:
    off = rng.randrange(0, size, 4096)
    if m.read(off, 8) != b"pattern!":
        sys.exit(3)
    if rng.random() < 0.2:
        handoff.call(rng.choice(paths), m.addr + off, 4096, fd=shm.fd)
sys.exit(0)
"""


def fault_vs_unexport(rd: Round) -> None:
    """A child faults in and touches an import's mapping, handing its addresses to GUP paths,
    while UNEXPORT revokes the import: the child ends by SIGBUS or in time, reads nothing but
    the export's bytes, and nothing is left."""
    size = rd.rng.choice((SZ_2M, 2 * SZ_2M))
    exp = rd.export(size)
    with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(size) as m:
        for off in range(0, size, 4096):
            m.write(off, b"pattern!")
    imp = rd.loopback(exp)
    pmd = rd.rng.random() < 0.5
    ms = rd.rng.randint(5, 200)
    proc = subprocess.Popen(
        [sys.executable, "-c", _TOUCHER, str(imp.mem_id), str(size), str(int(pmd)),
         str(rd.rng.getrandbits(32)), str(ms)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()
    rd.delay(ms)
    rd.allow("UNEXPORT under a touched, handed-off import",
             rd.errno_of(lambda: rd.dev.unexport(exp.mem_id)), {0})  # fmt: skip
    if imp.mem_id not in target.revoked_ids():
        raise rd.fail(f"import {imp.mem_id} not revoked when UNEXPORT returned")
    status = proc.wait(timeout=120)
    if status not in (0, -signal.SIGBUS):
        raise rd.fail(f"the toucher ended with {status} (3: it read bytes not the export's)")
    rd.until_ok("UNIMPORT after the toucher ended", lambda: rd.dev.unimport(imp.mem_id))


def update_range_vs_mmap(rd: Round) -> None:
    """OBMM_SHMDEV_UPDATE_RANGE over the address range a mapping had, or has, while another
    thread maps and unmaps the region through the same file at either granule: every answer
    is one the checks give (EFAULT once the range is no longer the region's)."""
    exp = rd.export(2 * SZ_2M)
    n = rd.rng.randint(5, 30)
    done = threading.Event()
    where: list[tuple[int, int]] = []
    shm = obmm.ShmDev(exp.mem_id)

    def mapper() -> None:
        try:
            for _ in range(n):
                rd.calls += 1
                try:
                    with shm.mmap(2 * SZ_2M, pmd=rd.rng.random() < 0.5) as m:
                        where.append((m.addr, m.length))
                        m.write(rd.rng.randrange(0, 2 * SZ_2M, 8), b"racing!!")
                except OSError as exc:
                    rd.allow("mmap racing UPDATE_RANGE", exc.errno or 0, {errno.EPERM})
        finally:
            done.set()

    def updater() -> None:
        while not done.is_set():
            if not where:
                time.sleep(0.001)
                continue
            addr, length = where[-1]
            start = addr + rd.rng.choice((0, 4096, SZ_2M))
            end = start + rd.rng.choice((4096, SZ_2M, length))
            rd.calls += 1
            try:
                shm.update_range(start, end, 0x9, 4)
                err = 0
            except OSError as exc:
                err = exc.errno or errno.EIO
            rd.allow("UPDATE_RANGE racing mmap", err, {0, errno.EINVAL, errno.EFAULT})

    try:
        _run_threads(mapper, updater)
    finally:
        shm.close()
    rd.until_ok("UNEXPORT after the race", lambda: rd.dev.unexport(exp.mem_id))


# ---- signals delivered to calls that wait ----


def _on_signal(signum: int, frame: object) -> None:
    """A handled signal (Python installs it without SA_RESTART: a wait it ends is EINTR)."""


def signal_vs_export_wait(rd: Round) -> None:
    """An EXPORT that only quarantined memory could satisfy waits for it, interruptibly: a
    signal ends the wait (EINTR), or it gets the memory; nothing is allocated either way."""
    wait_unquarantined()
    free = target.pool_total() - target.pool_used() - target.quarantined()
    size = (free // SZ_2M // 2) * SZ_2M
    if size < SZ_2M:
        rd.skipped = True
        return
    big = rd.export(size)
    keep = rd.export(free - size) if free - size >= SZ_2M else None
    rd.dev.unexport(big.mem_id)  # quarantined for quarantine_ms: the next EXPORT waits
    got: list[obmm.Export] = []
    errs: list[int] = []
    ident: list[int] = []

    def waiter() -> None:
        ident.append(threading.get_ident())
        try:
            got.append(rd.dev.export(size))
        except OSError as exc:
            errs.append(exc.errno or 0)

    def signaller() -> None:
        rd.delay(400)
        for _ in range(rd.rng.randint(1, 3)):
            if ident and not (got or errs):
                signal.pthread_kill(ident[0], signal.SIGUSR1)
            rd.delay(50)

    old = signal.signal(signal.SIGUSR1, _on_signal)
    try:
        _run_threads(waiter, signaller)
    finally:
        signal.signal(signal.SIGUSR1, old)
    rd.calls += 2
    for e in errs:
        rd.allow("EXPORT waiting for quarantine, signalled", e, {errno.EINTR, errno.EBUSY})
    for exp in got:
        rd.dev.unexport(exp.mem_id)
    if keep is not None:
        rd.dev.unexport(keep.mem_id)


#: The borrowed node's page pinned by a child: it binds a buffer to node sys.argv[1], writes
#: it, holds one page in a pipe (vmsplice), says "pinned" and waits for stdin to close.
_PINNER = r"""
import ctypes, mmap, os, platform, sys
node = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
buf = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
mask = ctypes.c_ulong(1 << node)
nr = {"x86_64": 237, "aarch64": 235}[platform.machine()]
if libc.syscall(nr, ctypes.c_void_p(addr), ctypes.c_ulong(1 << 20), 2, ctypes.byref(mask),
                ctypes.c_ulong(node + 2), 0):
    sys.exit("mbind")
buf[:] = b"p" * (1 << 20)
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
r, w = os.pipe()
if libc.vmsplice(w, ctypes.byref(IoVec(addr, 4096)), 1, 0) != 4096:
    sys.exit("vmsplice")
print("pinned", flush=True)
sys.stdin.read()
"""


BLOCK = 128 << 20
NUMA = obmm.abi.OBMM_IMPORT_FLAG_NUMA_REMOTE
#: How long memory unexported beside a stuck borrow may stay quarantined (quarantine_ms is 1 s).
REUSE_S = 15.0


def _block_export(rd: Round) -> tuple[obmm.Export, int] | None:
    """A memory block export of this node and its window address, or None (rd.skipped): the
    pool has no free block, or gave an unaligned one."""
    wait_unquarantined()
    if target.pool_total() - target.pool_used() - target.quarantined() < BLOCK:
        rd.skipped = True
        return None
    exp = rd.export(BLOCK)
    addr = rd.engine.fabric.own_base + rd.dev.query_pa_by_memid(exp.mem_id)
    if addr % BLOCK:
        rd.dev.unexport(exp.mem_id)
        rd.skipped = True
        return None
    return exp, addr


def signal_vs_borrow_lock(rd: Round) -> None:
    """UNIMPORT of a borrow with a pinned page holds the hot-plug lock, retrying until a
    signal.  A DECLARE_PREIMPORT waits for that lock as the real driver does in
    lock_device_hotplug(): handled signals do not end that wait (no EINTR); once the UNIMPORT
    is signalled (EINTR) the DECLARE goes on.  Then everything goes away."""
    fab = rd.engine.fabric
    got = _block_export(rd)
    if got is None:
        return
    exp, addr = got
    imp = rd.dev.import_(addr, BLOCK, scna=fab.cna, tokenid=exp.tokenid, flags=NUMA)
    pinner = subprocess.Popen([sys.executable, "-c", _PINNER, str(imp.numa_id)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert pinner.stdout is not None and pinner.stdin is not None
    pinned = pinner.stdout.readline().strip() == "pinned"
    results: dict[str, int] = {}
    idents: dict[str, int] = {}
    pa = fab.own_base + BLOCK  # a declaration away from the borrowed range

    def unimporter() -> None:
        idents["unimport"] = threading.get_ident()
        results["unimport"] = rd.errno_of(lambda: rd.dev.unimport(imp.mem_id))

    def declarer() -> None:
        rd.delay(300)  # the UNIMPORT holds the lock by now
        idents["declare"] = threading.get_ident()
        results["declare"] = rd.errno_of(lambda: rd.dev.declare_preimport(pa, BLOCK, scna=fab.cna))

    def signaller() -> None:
        rd.delay(800)
        for _ in range(rd.rng.randint(1, 3)):
            if "declare" in idents and "declare" not in results:
                signal.pthread_kill(idents["declare"], signal.SIGUSR1)
            rd.delay(100)
        if "declare" in results and results["declare"] == errno.EINTR:
            return
        deadline = time.monotonic() + 60
        while "unimport" not in results and time.monotonic() < deadline:
            signal.pthread_kill(idents["unimport"], signal.SIGUSR1)
            time.sleep(0.2)

    old = signal.signal(signal.SIGUSR1, _on_signal)
    try:
        _run_threads(unimporter, declarer, signaller)
    finally:
        signal.signal(signal.SIGUSR1, old)
        pinner.stdin.close()
        pinner.wait(timeout=60)
    failure = None
    if pinned:
        # the UNIMPORT ends with its signal (or in time, if the page moved after all)
        if results.get("unimport") not in (0, errno.EINTR):
            failure = f"UNIMPORT of a pinned borrow: {results.get('unimport')}"
        if results.get("declare") not in (0, errno.EPERM):
            failure = f"DECLARE waiting for the hot-plug lock, signalled: {results.get('declare')}"
    if results.get("declare") == 0:
        rd.dev.undeclare_preimport(pa, BLOCK)
    if results.get("unimport") != 0:
        rd.until_ok("UNIMPORT once the page is let go", lambda: rd.dev.unimport(imp.mem_id), 60)
    rd.dev.unexport(exp.mem_id)
    if failure:
        raise rd.fail(failure)


def borrow_of_mapped_export(rd: Round) -> None:
    """Issue 36, finding 4: a borrow (NUMA_REMOTE) of a block export its exporter maps, in
    page or PMD granule, is EACCES (nothing hot-added); one never mapped, or unmapped again, is
    made.  Another thread maps the export while a borrow of it is made: whichever comes first,
    nothing breaks (the mapping after the borrow is FIDELITY's open case)."""
    got = _block_export(rd)
    if got is None:
        return
    exp, addr = got
    fab = rd.engine.fabric
    how = rd.rng.choice(("never", "page", "pmd", "racing", "unmapped"))
    imported: list[int] = []

    def borrower() -> None:
        rd.delay(20)
        err = rd.errno_of(lambda: imported.append(
            rd.dev.import_(addr, BLOCK, scna=fab.cna, tokenid=exp.tokenid, flags=NUMA).mem_id
        ))  # fmt: skip
        want = {0, errno.EACCES} if how == "racing" else {errno.EACCES} if held else {0}
        rd.allow(f"borrow of a block export mapped: {how}", err, want)

    def mapper(then: Callable[[], None] | None = None) -> None:
        # reads only: a borrow that won the race has this kernel's pages there
        rd.delay(20)
        with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(SZ_2M, pmd=how == "pmd") as m:
            m.read(0, 8)
            if then is not None:
                then()

    held = how in ("page", "pmd")
    try:
        if held:
            mapper(borrower)
        elif how == "unmapped":
            mapper()
            borrower()
        elif how == "racing":
            _run_threads(mapper, borrower)
        else:
            borrower()
    finally:
        for mem_id in imported:
            rd.until_ok("UNIMPORT of the borrow", functools.partial(rd.dev.unimport, mem_id), 60)
        rd.until_ok("UNEXPORT", lambda: rd.dev.unexport(exp.mem_id))


def pinned_borrow_vs_reuse(rd: Round) -> None:
    """Issue 36, finding 5: a loopback borrow whose page a process holds in a pipe it never
    reads cannot be unplugged once its export goes; only that block may stay quarantined.
    Memory the node unexports afterwards comes back as before (it stayed quarantined for good,
    and EXPORTs that needed it ended EBUSY)."""
    got = _block_export(rd)
    if got is None:
        return
    exp, addr = got
    fab = rd.engine.fabric
    imp = rd.dev.import_(addr, BLOCK, scna=fab.cna, tokenid=exp.tokenid, flags=NUMA)
    pinner = subprocess.Popen([sys.executable, "-c", _PINNER, str(imp.numa_id)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert pinner.stdout is not None and pinner.stdin is not None
    failure = None
    try:
        pinner.stdout.readline()
        rd.allow("UNEXPORT under a borrow", rd.errno_of(lambda: rd.dev.unexport(exp.mem_id)), {0})
        for _ in range(rd.rng.randint(1, 3)):
            later = rd.dev.export(SZ_2M)  # EBUSY here is finding 5
            rd.delay(50)
            rd.dev.unexport(later.mem_id)
        if not wait_unquarantined(BLOCK, REUSE_S):
            failure = (f"{target.quarantined():#x} bytes quarantined {REUSE_S} s after, with "
                       f"only the stuck borrow's {BLOCK:#x} held")  # fmt: skip
    finally:
        pinner.stdin.close()
        pinner.wait(timeout=60)
        rd.until_ok("UNIMPORT once the page is let go", lambda: rd.dev.unimport(imp.mem_id), 60)
    if failure:
        raise rd.fail(failure)


def scrub(dev: obmm.Obmm) -> None:
    """After a failed round: remove whatever regions it left (imports first)."""
    for kind in ("import", "export"):
        for mem_id in sorted(target.sysfs_ids()):
            path = target.SHMDEV_SYSFS / f"obmm_shmdev{mem_id}" / "type"
            try:
                if path.read_text().strip() != kind:
                    continue
                (dev.unimport if kind == "import" else dev.unexport)(mem_id)
            except OSError as exc:
                print(f"fuzz: cleanup of {kind} {mem_id}: {exc}", flush=True)


SCENARIOS: dict[str, Callable[[Round], None]] = {
    "fault_vs_unexport": fault_vs_unexport,
    "update_range_vs_mmap": update_range_vs_mmap,
    "signal_vs_export_wait": signal_vs_export_wait,
    "signal_vs_borrow_lock": signal_vs_borrow_lock,
    "borrow_of_mapped_export": borrow_of_mapped_export,
    "pinned_borrow_vs_reuse": pinned_borrow_vs_reuse,
    "unexport_vs_mmap": unexport_vs_mmap,
    "unimport_vs_mmap": unimport_vs_mmap,
    "close_vs_revocation": close_vs_revocation,
    "export_pid_vs_exit": export_pid_vs_exit,
    "overlapping_imports": overlapping_imports,
    "unexport_vs_import": unexport_vs_import,
    "rmmod_vs_open": rmmod_vs_open,
}


def main(
    seed: int, rounds: int, *, reload: bool = True, only: Sequence[str] = (), seconds: float = 0
) -> int:
    """``rounds`` rounds of scenarios drawn from ``seed`` (from ``only`` when given); none
    starts after ``seconds`` (0: no limit)."""
    engine = Engine(reload=reload, faults_on=False)
    with contextlib.suppress(OSError):
        target.NR_HUGEPAGES.write_text(str(target.read_int(target.NR_HUGEPAGES) + 2))
    master = random.Random(seed)
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        raise RuntimeError(f"no such scenario: {', '.join(sorted(unknown))}")
    names = sorted(only or SCENARIOS)
    print(f"fuzz: seed {seed}, {rounds} race rounds over {', '.join(names)}, "
          f"module reload {'on' if engine.reload_ok else 'off'}", flush=True)  # fmt: skip
    t0 = time.monotonic()
    calls = 0
    status = 0
    done = 0
    ran: dict[str, int] = {}  # scenario -> rounds whose preconditions held
    skipped: dict[str, int] = {}  # scenario -> rounds not run (Skip: a precondition failed)
    for i in range(rounds):
        if seconds > 0 and time.monotonic() - t0 >= seconds:
            break
        name = master.choice(names)
        rd = Round(i, name, random.Random(master.getrandbits(64)), engine)
        try:
            try:
                SCENARIOS[name](rd)
            except Skip as exc:
                print(f"fuzz: round {i} ({name}) not run: {exc}", flush=True)
                rd.skipped = True
                scrub(engine.dev)
            except OSError as exc:  # a call the scenario does not race: no errno is allowed
                raise rd.fail(f"unexpected {exc}") from exc
            engine.check(rd.op)
        except Failure as exc:
            print(f"FUZZ FAILURE: {exc}", flush=True)
            print(f"replay: python3 -m obmm.fuzz --mode concurrent --seed {seed} --ops {i + 1}"
                  f"  (round {i}, {name}; the interleaving is the scheduler's)")  # fmt: skip
            status = 1
            scrub(engine.dev)
            break
        calls += rd.calls
        done += 1
        ran[name] = ran.get(name, 0) + (0 if rd.skipped else 1)
        if rd.skipped:
            skipped[name] = skipped.get(name, 0) + 1
    elapsed = time.monotonic() - t0
    engine.close()
    figures = {"mode": "concurrent", "seed": seed, "rounds": done,
               "ops": calls, "seconds": round(elapsed, 2),
               "ops_per_s": round(calls / elapsed, 1) if elapsed else 0.0,
               "failed": status != 0, "rounds_run": dict(sorted(ran.items())),
               "rounds_skipped": dict(sorted(skipped.items()))}  # fmt: skip
    print("fuzz-result " + json.dumps(figures), flush=True)
    return status
