"""Kernel paths a user's program hands a mapped address to, beyond loads and stores.

A mapping of ``/dev/obmm_shmdev<id>`` is a pfn mapping (VM_PFNMAP | VM_IO): the kernel has no
struct page behind it.  Code that looks pages up from an address (get_user_pages and its
lock-free fast path, the page-table walkers, ptrace) must take it for what it is.  Each call here
is one such path, as a program reaches it, and answers ``0`` or an errno; none may make the
kernel report anything, and the mapping must still read and write afterwards.

* :func:`futex_wake`, :func:`futex_wait` (shared futexes resolve the page: GUP-fast),
* :func:`vmsplice`, :func:`splice_from` (pipe buffers take page references),
* :func:`direct_io` (``O_DIRECT`` pins the user buffer),
* :func:`process_vm` (``process_vm_readv/writev``, remote GUP),
* :func:`ptrace_peek` (``PTRACE_PEEKDATA`` of this process by a child: ``access_process_vm``),
* :func:`madvise`, :func:`mlock`,
* EXPORT_PID of the address (the driver pins user pages with pin_user_pages_fast).

:data:`PATHS` says what each path answers for a live and for a revoked mapping, as a correct
kernel does (measured on the Debian 6.1 guests; tests/guest/test_handoff.py, the fuzzer's
``handoff`` operation); :func:`call` makes one of them by name.

Standard library and the package's own bindings only: it runs in the guests.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import tempfile
import time
from collections.abc import Iterator
from typing import NamedTuple

import obmm

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.vmsplice.restype = ctypes.c_ssize_t
_libc.vmsplice.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
_libc.splice.restype = ctypes.c_ssize_t
_libc.splice.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_size_t, ctypes.c_uint]  # fmt: skip
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_writev.restype = ctypes.c_ssize_t
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT = 0
FUTEX_WAKE = 1
FUTEX_PRIVATE_FLAG = 128
PAGE = 4096

MADV_NORMAL = 0
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_DONTFORK = 10
MADV_DOFORK = 11
MADV_HUGEPAGE = 14
MADV_COLD = 20
MADV_PAGEOUT = 21
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
ADVICE = {
    "normal": MADV_NORMAL,
    "willneed": MADV_WILLNEED,
    "dontneed": MADV_DONTNEED,
    "dontfork": MADV_DONTFORK,
    "dofork": MADV_DOFORK,
    "hugepage": MADV_HUGEPAGE,
    "cold": MADV_COLD,
    "pageout": MADV_PAGEOUT,
    "populate_read": MADV_POPULATE_READ,
    "populate_write": MADV_POPULATE_WRITE,
}

PTRACE_PEEKDATA = 2
PTRACE_POKEDATA = 5
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _err() -> int:
    return ctypes.get_errno() or errno.EIO


def futex_wake(addr: int, private: bool = False) -> int:
    """FUTEX_WAKE on ``addr``: a shared futex looks its page up (get_user_pages_fast)."""
    op = FUTEX_WAKE | (FUTEX_PRIVATE_FLAG if private else 0)
    nr = _SYS_FUTEX[platform.machine()]
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_void_p(addr), op, 1, None, None, 0)
    return 0 if ret >= 0 else _err()


def futex_wait(addr: int, private: bool = False, value: int | None = None) -> int:
    """FUTEX_WAIT on ``addr`` for ``value`` (default: one it does not hold, so EAGAIN once the
    kernel read the word), with a 1 ms timeout in case it does hold it."""
    op = FUTEX_WAIT | (FUTEX_PRIVATE_FLAG if private else 0)
    nr = _SYS_FUTEX[platform.machine()]
    if value is None:
        value = ctypes.c_uint32.from_address(addr).value ^ 1
    timeout = (ctypes.c_long * 2)(0, 1_000_000)
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_void_p(addr), op,
                        ctypes.c_uint32(value), timeout, None, 0)  # fmt: skip
    return 0 if ret >= 0 else _err()


def vmsplice(addr: int, length: int = PAGE) -> int:
    """vmsplice of ``[addr, +length)`` into a pipe (page references into the pipe)."""
    r, w = os.pipe()
    try:
        iov = IoVec(addr, length)
        ret = _libc.vmsplice(w, ctypes.byref(iov), 1, 0)
        return 0 if ret >= 0 else _err()
    finally:
        os.close(r)
        os.close(w)


def splice_from(fd: int, length: int = PAGE) -> int:
    """splice from file ``fd`` (a shmdev file) into a pipe."""
    r, w = os.pipe()
    try:
        ret = _libc.splice(fd, None, w, None, length, 0)
        return 0 if ret >= 0 else _err()
    finally:
        os.close(r)
        os.close(w)


#: A directory on a block-device file system (O_DIRECT needs one; the guests' /tmp is tmpfs).
DIRECT_DIRS = ("/var/tmp", "/opt/obmm-testbed", "/root")


@contextlib.contextmanager
def direct_file(size: int = 2 << 20) -> Iterator[int | None]:
    """An O_DIRECT file of ``size`` bytes, or None where no file system takes O_DIRECT."""
    for d in DIRECT_DIRS:
        if not os.path.isdir(d):
            continue
        try:
            fd, path = tempfile.mkstemp(prefix="obmm-direct-", dir=d)
        except OSError:
            continue
        os.close(fd)
        try:
            with open(path, "wb") as fh:
                fh.write(b"\0" * size)
            try:
                fd = os.open(path, os.O_RDWR | os.O_DIRECT)
            except OSError:
                continue
            try:
                yield fd
            finally:
                os.close(fd)
            return
        finally:
            os.unlink(path)
    yield None


def direct_io(fd: int, addr: int, length: int, write: bool) -> int:
    """An O_DIRECT pwrite from (or pread into) ``[addr, +length)``: the buffer is pinned."""
    buf = (ctypes.c_char * length).from_address(addr)
    try:
        if write:
            os.pwrite(fd, memoryview(buf).cast("B"), 0)
        else:
            os.preadv(fd, [memoryview(buf).cast("B")], 0)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def process_vm(addr: int, length: int, write: bool, pid: int = 0) -> int:
    """process_vm_writev / readv of this process (or ``pid``) with ``[addr, +length)`` as the
    remote side: the remote pages are looked up with get_user_pages_remote."""
    local = ctypes.create_string_buffer(length)
    liov = IoVec(ctypes.addressof(local), length)
    riov = IoVec(addr, length)
    fn = _libc.process_vm_writev if write else _libc.process_vm_readv
    ret = fn(pid or os.getpid(), ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
    return 0 if ret >= 0 else _err()


def madvise(addr: int, length: int, advice: int) -> int:
    return 0 if _libc.madvise(addr, length, advice) == 0 else _err()


def mlock(addr: int, length: int) -> int:
    """mlock then munlock of ``[addr, +length)``: the first errno, or 0."""
    if _libc.mlock(addr, length) != 0:
        return _err()
    return 0 if _libc.munlock(addr, length) == 0 else _err()


def ptrace_peek(addr: int, poke: bytes | None = None, timeout: float = 10.0) -> tuple[bytes, int]:
    """PTRACE_PEEKDATA (and POKEDATA of ``poke`` first, 8 bytes) of this process's ``addr``, by
    a child that seizes and stops this process: ``(word, 0)`` or ``(b"", errno)``.  Every
    thread of this process is stopped meanwhile."""
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the tracer
        os.close(r)
        out = b""
        err = 0
        try:
            if _libc.ptrace(PTRACE_SEIZE, parent, None, None) != 0:
                err = _err()
            else:
                _libc.ptrace(PTRACE_INTERRUPT, parent, None, None)
                os.waitpid(parent, 0x40000000)  # __WALL: the tracee's stop
                if poke is not None:
                    word = ctypes.c_long.from_buffer_copy(poke[:8].ljust(8, b"\0")).value
                    ctypes.set_errno(0)
                    if _libc.ptrace(PTRACE_POKEDATA, parent, ctypes.c_void_p(addr),
                                    ctypes.c_void_p(word)) != 0:  # fmt: skip
                        err = _err()
                if not err:
                    ctypes.set_errno(0)
                    value = _libc.ptrace(PTRACE_PEEKDATA, parent, ctypes.c_void_p(addr), None)
                    err = ctypes.get_errno() if value == -1 else 0
                    out = ctypes.c_long(value).value.to_bytes(8, "little", signed=True)
                _libc.ptrace(PTRACE_DETACH, parent, None, None)
        except BaseException:  # the child must never return into the caller's code
            err = err or errno.EIO
        os.write(w, err.to_bytes(4, "little") + out)
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while time.monotonic() < deadline:
            chunk = os.read(r, 12)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if len(data) < 4:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return b"", errno.EIO
    err = int.from_bytes(data[:4], "little")
    return (b"", err) if err else (data[4:12], 0)


class Answer(NamedTuple):
    """What a path answers ("ok" or an errno name) for a live and for a revoked mapping."""

    live: str
    revoked: str


#: Every path, by name: its answer for a pfn mapping.  A shared futex, vmsplice, O_DIRECT,
#: process_vm_* and EXPORT_PID look the page up (get_user_pages): there is none, EFAULT; a
#: private futex only hashes the address (WAKE) or reads the word (WAIT: EAGAIN for a value it
#: does not hold; EFAULT once revoked); shmdev files have no splice_read; ptrace goes through
#: the VMA's .access (EIO once revoked); madvise refuses what a VM_LOCKED | VM_IO | VM_PFNMAP
#: VMA cannot do and mlock skips it.
PATHS: dict[str, Answer] = {
    "futex_wake": Answer("EFAULT", "EFAULT"),
    "futex_wait": Answer("EFAULT", "EFAULT"),
    "futex_wake_private": Answer("ok", "ok"),
    "futex_wait_private": Answer("EAGAIN", "EFAULT"),
    "vmsplice": Answer("EFAULT", "EFAULT"),
    "splice": Answer("EINVAL", "EINVAL"),
    "o_direct_write": Answer("EFAULT", "EFAULT"),
    "o_direct_read": Answer("EFAULT", "EFAULT"),
    "process_vm_readv": Answer("EFAULT", "EFAULT"),
    "process_vm_writev": Answer("EFAULT", "EFAULT"),
    "export_pid": Answer("EFAULT", "EFAULT"),
    "ptrace_peek": Answer("ok", "EIO"),
    "madvise_dontneed": Answer("EINVAL", "EINVAL"),
    "madvise_willneed": Answer("ok", "ok"),
    "madvise_dofork": Answer("EINVAL", "EINVAL"),
    "madvise_dontfork": Answer("ok", "ok"),
    "madvise_cold": Answer("EINVAL", "EINVAL"),
    "madvise_pageout": Answer("EINVAL", "EINVAL"),
    "madvise_populate_write": Answer("EINVAL", "EINVAL"),
    "mlock": Answer("ok", "ok"),
}

#: Paths that are no call at all where there is no O_DIRECT file system (None from call()).
NEEDS_DIRECT_FILE = ("o_direct_write", "o_direct_read")


def errname(err: int) -> str:
    return errno.errorcode.get(err, str(err)) if err else "ok"


def call(
    name: str,
    addr: int,
    length: int,
    *,
    fd: int = -1,
    dev: obmm.Obmm | None = None,
    value: int | None = None,
) -> int | None:
    """Hand ``[addr, +length)`` (a whole mapping for madvise and mlock; its first word, page
    or 2 MiB for the others) to path ``name``: 0 or the errno, None where the path cannot be
    made here (no O_DIRECT file system, no shmdev file for splice).  ``value``: the word a
    private FUTEX_WAIT expects (default: read from ``addr``, which a revoked mapping would
    answer with SIGBUS)."""
    if name == "futex_wake":
        return futex_wake(addr)
    if name == "futex_wait":
        return futex_wait(addr, value=value if value is not None else 0)
    if name == "futex_wake_private":
        return futex_wake(addr, private=True)
    if name == "futex_wait_private":
        return futex_wait(addr, private=True, value=value)
    if name == "vmsplice":
        return vmsplice(addr)
    if name == "splice":
        return splice_from(fd) if fd >= 0 else None
    if name in NEEDS_DIRECT_FILE:
        with direct_file() as dfd:
            if dfd is None:
                return None
            return direct_io(dfd, addr, PAGE, write=name == "o_direct_write")
    if name.startswith("process_vm_"):
        return process_vm(addr, 8, write=name.endswith("writev"))
    if name == "export_pid":
        assert dev is not None
        try:
            exp = dev.export_pid(addr, 2 << 20)
        except OSError as exc:
            return exc.errno or errno.EIO
        dev.unexport(exp.mem_id)
        return 0
    if name == "ptrace_peek":
        return ptrace_peek(addr)[1]
    if name.startswith("madvise_"):
        return madvise(addr, length, ADVICE[name.removeprefix("madvise_")])
    if name == "mlock":
        return mlock(addr, length)
    raise ValueError(f"no such path: {name}")
