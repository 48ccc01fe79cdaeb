"""The node the fuzzer runs on (its target): fabric, pool, module, kernel log, libc calls."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from obmm import decoder, envvars
from obmm.tools import logscan

EMU = Path("/sys/kernel/obmm_emu")
MEMPOOL = Path("/sys/kernel/obmm_mempool")
SHMDEV_SYSFS = Path("/sys/devices/obmm")
MODULE = "obmm"
MODULE_SYSFS = Path("/sys/module") / MODULE
KO_DEFAULT = Path("/opt/obmm-testbed/kmod") / f"{MODULE}.ko"
RELOAD_PARAMS = ("node_id", "pool_base", "pool_size", "ubc_dev")
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
MEMID_RE = re.compile(r"MEMID_(\d+)$")


def read_bytes(path: Path | str) -> bytes:
    """A /proc or sysfs file's content in as few system calls as it takes (open, reads until
    EOF, close): the model check reads several after every operation, under TCG and on a debug
    kernel where each call of Path.read_text's longer sequence costs."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: Path | str) -> str:
    return read_bytes(path).decode()


def _pread_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 65536, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


_kept: dict[tuple[int, str], int] = {}
_kept_lock = threading.Lock()


def read_kept(path: Path | str) -> bytes:
    """A file the model check reads after every operation, from a descriptor kept open and
    read from offset 0 (where a seq_file or sysfs attribute shows afresh): on a debug kernel
    the open and the close cost more than the read.  Only for a fixed set of paths (one
    descriptor each, per process: /proc/self is the opener's).  A descriptor whose kernel
    object went away (the module reloaded: ENODEV, EIO) is opened again; an error of the
    fresh one is raised."""
    key = (os.getpid(), str(path))
    with _kept_lock:
        fd = _kept.pop(key, None)
        if fd is not None:
            try:
                data = _pread_all(fd)
            except OSError:
                os.close(fd)
            else:
                _kept[key] = fd
                return data
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = _pread_all(fd)
        except BaseException:
            os.close(fd)
            raise
        _kept[key] = fd
        return data


def close_kept() -> None:
    """Close what read_kept keeps open (the next read opens again)."""
    with _kept_lock:
        for fd in _kept.values():
            os.close(fd)
        _kept.clear()


def read_kept_int(path: Path | str) -> int:
    return int(read_kept(path).strip(), 0)


def files_in(directory: Path | str) -> list[str]:
    """Paths of the files (symbolic links followed) in `directory`, sorted; none if it is
    not a directory.  One scandir: its entries' types come with the listing."""
    try:
        with os.scandir(directory) as entries:
            return sorted(e.path for e in entries if e.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_int(path: Path | str) -> int:
    return int(read_text(path).strip(), 0)


@dataclass
class Fabric:
    node_id: int
    cna: int
    windows: dict[int, tuple[int, int]]
    pool_base: int
    pool_size: int
    granu: int

    @property
    def own_base(self) -> int:
        return self.windows[self.node_id][0]

    @property
    def own_size(self) -> int:
        return self.windows[self.node_id][1]

    def window_of(self, addr: int, length: int) -> int | None:
        for node, (base, size) in self.windows.items():
            if base <= addr < base + size and length <= size - (addr - base):
                return node
        return None


def _granu(param: Path) -> int:
    """The memseg size: mem_allocator_granu (memparse syntax) or its 2 MiB default."""
    text = param.read_text().strip().upper() if param.is_file() else ""
    units = {"K": 10, "M": 20, "G": 30}
    try:
        if text and text[-1] in units:
            return int(text[:-1], 0) << units[text[-1]]
        return int(text, 0) if text else 2 << 20
    except ValueError:
        return 2 << 20


def load_fabric() -> Fabric:
    """The fabric as obmm_emu publishes it, or (the real obmm.ko) its compat layer."""
    root = Path(decoder.fabric_sysfs())
    if root == EMU and (not EMU.is_dir() or read_int(EMU / "enabled") != 1):
        raise RuntimeError(f"{EMU}: the emulated obmm is not loaded with its fabric enabled")
    windows = {}
    for w in sorted((root / "windows").iterdir()):
        windows[read_int(w / "node")] = (read_int(w / "base"), read_int(w / "size"))
    granu = _granu(MODULE_SYSFS / "parameters" / "mem_allocator_granu")
    return Fabric(
        node_id=read_int(root / "node_id"),
        cna=read_int(root / "cna"),
        windows=windows,
        pool_base=read_int(root / "pool_base"),
        pool_size=read_int(root / "pool_size"),
        granu=granu,
    )


def pool_dirs() -> list[str]:
    """/sys/kernel/obmm_mempool/obmm-*: one directory per pool."""
    try:
        names = os.listdir(MEMPOOL)
    except FileNotFoundError:
        return []
    return [f"{MEMPOOL}/{n}" for n in names if n.startswith("obmm-")]


def pool_used() -> int:
    return sum(read_kept_int(f"{d}/used") for d in pool_dirs())


def quarantined() -> int:
    """Bytes of unexported memory not yet reusable (/sys/kernel/obmm_emu/quarantined)."""
    return read_int(EMU / "quarantined")


def pool_total() -> int:
    return sum(read_int(f"{d}/total") for d in pool_dirs())


def settle_pool(want: int, timeout: float = 5.0) -> bool:
    """Wait until the pool holds `want` bytes and all it does not use is cleared: at once on
    obmm_emu, whose pool is always whole; the real obmm.ko refills and clears in the background
    (after an unexport, a failed export).  False at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        dirs = pool_dirs()
        total = sum(read_int(f"{d}/total") for d in dirs)
        used = sum(read_int(f"{d}/used") for d in dirs)
        cleared = sum(read_int(f"{d}/available_cleared") for d in dirs)
        if dirs and total >= want and cleared == total - used:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def shmdev_ids() -> set[int]:
    return {int(n[11:]) for n in os.listdir("/dev") if n.startswith("obmm_shmdev")}


def sysfs_ids() -> set[int]:
    try:
        names = os.listdir(SHMDEV_SYSFS)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return {int(n[11:]) for n in names if n.startswith("obmm_shmdev")}


# Lines the model accounts for itself: imports, declared preimport ranges, borrowed memory.
OWN_IOMEM = (" : DIRECT_IMPORT_UBMEM", " : PREIMPORT_UBMEM", " : System RAM (Remote)")


@dataclass
class Iomem:
    """What the model check reads in /proc/iomem, from one read of it."""

    #: ids of the MEMID_<id> resources
    memids: set[int]
    #: count of the DIRECT_IMPORT_UBMEM resources
    direct: int
    #: (pa, length) of every PREIMPORT_UBMEM resource (a declared preimport range)
    preimports: set[tuple[int, int]]
    #: the lines that are no import's, declaration's or borrow's (what no operation may change)
    others: list[str]


def parse_iomem(text: str) -> Iomem:
    view = Iomem(set(), 0, set(), [])
    for line in text.splitlines():
        # every line of the first three views names MEMID_, UBMEM or (Remote): the rest are
        # the others, without the regular expressions
        if "MEMID_" not in line and "UBMEM" not in line and "(Remote)" not in line:
            view.others.append(line)
            continue
        name = line.rpartition(" : ")[2]
        m = MEMID_RE.match(name)
        if m:
            view.memids.add(int(m.group(1)))
        elif name == "DIRECT_IMPORT_UBMEM":
            view.direct += 1
        span, _, first_name = line.strip().partition(" : ")
        if first_name == "PREIMPORT_UBMEM":
            start, _, end = span.partition("-")
            view.preimports.add((int(start, 16), int(end, 16) - int(start, 16) + 1))
        if not line.endswith(OWN_IOMEM) and not MEMID_RE.search(line):
            view.others.append(line)
    return view


def iomem() -> Iomem:
    return parse_iomem(read_kept("/proc/iomem").decode())


def iomem_memids() -> tuple[set[int], int]:
    """Ids of the MEMID_<id> resources and the count of DIRECT_IMPORT_UBMEM ones."""
    view = iomem()
    return view.memids, view.direct


def iomem_others() -> list[str]:
    """/proc/iomem without the lines of imports, declarations and borrows."""
    return iomem().others


def iomem_preimports() -> set[tuple[int, int]]:
    """(pa, length) of every PREIMPORT_UBMEM resource (a declared preimport range)."""
    return iomem().preimports


def revoked_ids() -> set[int]:
    text = read_kept(EMU / "revoked").decode().split()
    return {int(t) for t in text if t.isdigit()}


def module_refcnt() -> int:
    return read_kept_int(MODULE_SYSFS / "refcnt")


def mapped_bytes() -> dict[int, int]:
    """Bytes of this process mapped from each /dev/obmm_shmdev<id>."""
    out: dict[int, int] = {}
    for line in read_kept("/proc/self/maps").decode().splitlines():
        if "obmm_shmdev" not in line:
            continue
        parts = line.split()
        if len(parts) < 6 or "obmm_shmdev" not in parts[5]:
            continue
        start, _, end = parts[0].partition("-")
        mem_id = int(parts[5].rpartition("obmm_shmdev")[2])
        out[mem_id] = out.get(mem_id, 0) + int(end, 16) - int(start, 16)
    return out


def preimport_lines() -> int:
    try:
        return len(read_kept("/proc/obmm/preimport_info").splitlines())
    except FileNotFoundError:
        return 0


class KernelLog:
    """New kernel messages since the last look, scanned for reports."""

    def __init__(self, allow: tuple[logscan.AllowRule, ...] = ()) -> None:
        self.allow = logscan.DEFAULT_ALLOW + allow
        self.watcher: logscan.KmsgWatcher | None
        try:
            self.watcher = logscan.KmsgWatcher()
        except OSError:
            self.watcher = None

    def reports(self) -> str:
        if self.watcher is None:
            return ""
        found = logscan.scan(self.watcher.read_new(), allow=self.allow)
        return logscan.format_reports(found) if found else ""

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()


class Module:
    """rmmod / insmod of the emulated obmm with the parameters it was loaded with."""

    def __init__(self, ko: Path = KO_DEFAULT) -> None:
        self.ko = ko
        self.args = [
            f"{p}={(MODULE_SYSFS / 'parameters' / p).read_text().strip()}"
            for p in RELOAD_PARAMS
            if (MODULE_SYSFS / "parameters" / p).is_file()
        ]

    @property
    def reloadable(self) -> bool:
        return self.ko.is_file()

    #: rmmod returns within this (an idle module: no worker may keep it; busy: EBUSY at once),
    #: times $OBMM_TESTBED_TIMEOUT_SCALE (unload_bound).  An idle unload takes a fraction of a
    #: second; one that waits for background work takes minutes (the zero worker's 127
    #: granules); a busy host stretched the idle one to 7 s.  Whether unload cuts the workers
    #: short is shown by events (tests/guest/test_reload.py), not by this bound.
    UNLOAD_S = 30.0

    @classmethod
    def unload_bound(cls, environ: Mapping[str, str] | None = None) -> float:
        return cls.UNLOAD_S * float(envvars.TIMEOUT_SCALE.get(environ))

    def rmmod(self) -> bool:
        """rmmod; whether it unloaded.  The seconds it took are in ``last_rmmod_s``."""
        t0 = time.monotonic()
        done = delete_module(MODULE) == 0
        self.last_rmmod_s = time.monotonic() - t0
        return done

    def insmod(self) -> None:
        if not MODULE_SYSFS.is_dir():
            err = finit_module(self.ko, " ".join(self.args))
            if err:
                raise OSError(err, f"finit_module {self.ko}: {os.strerror(err)}")

    @staticmethod
    def loaded() -> bool:
        return (MODULE_SYSFS / "initstate").is_file()


# ---- libc calls the bindings do not wrap ----

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
]  # fmt: skip
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
MAP_FAILED = (1 << 64) - 1
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000
MAP_HUGETLB = 0x40000
MREMAP_MAYMOVE = 1
MREMAP_FIXED = 2


def _err() -> int:
    return ctypes.get_errno() or errno.EIO


# The module calls rmmod and insmod make (kmod: delete_module with O_NONBLOCK, finit_module),
# made here without their exec: a reload is one of the fuzzer's operations, and two program
# starts under TCG cost more than the calls.
_libc.delete_module.argtypes = [ctypes.c_char_p, ctypes.c_uint]
_libc.syscall.restype = ctypes.c_long
SYS_FINIT_MODULE = {"x86_64": 313, "aarch64": 273}


def delete_module(name: str) -> int:
    """0, or the errno (EWOULDBLOCK: still in use, as rmmod reports it)."""
    return 0 if _libc.delete_module(name.encode(), os.O_NONBLOCK) == 0 else _err()


def finit_module(ko: Path, params: str) -> int:
    """0, or the errno; insmod's way where this architecture's call number is known."""
    nr = SYS_FINIT_MODULE.get(os.uname().machine)
    if nr is None:
        done = subprocess.run(["insmod", str(ko), *params.split()], capture_output=True)
        return 0 if done.returncode == 0 else errno.EINVAL
    fd = os.open(ko, os.O_RDONLY | os.O_CLOEXEC)
    try:
        ret = _libc.syscall(
            ctypes.c_long(nr), ctypes.c_int(fd), ctypes.c_char_p(params.encode()), ctypes.c_int(0)
        )
        return 0 if ret == 0 else _err()
    finally:
        os.close(fd)


def mmap(addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> tuple[int, int]:
    """(address, 0) or (0, errno); offset is the unsigned file offset (bit 63 allowed)."""
    signed = offset - (1 << 64) if offset >= 1 << 63 else offset
    ret = _libc.mmap(addr or None, length, prot, flags, fd, signed)
    if ret is None or ret == MAP_FAILED:
        return 0, _err()
    return int(ret), 0


def munmap(addr: int, length: int) -> int:
    return 0 if _libc.munmap(addr, length) == 0 else _err()


def mprotect(addr: int, length: int, prot: int) -> int:
    return 0 if _libc.mprotect(addr, length, prot) == 0 else _err()


def madvise(addr: int, length: int, advice: int) -> int:
    return 0 if _libc.madvise(addr, length, advice) == 0 else _err()


def mremap(addr: int, old: int, new: int, flags: int, new_addr: int = 0) -> tuple[int, int]:
    ret = _libc.mremap(addr, old, new, flags, new_addr or None)
    if ret is None or ret == MAP_FAILED:
        return 0, _err()
    return int(ret), 0


def raw_ioctl(fd: int, request: int, arg: int) -> int:
    return 0 if _libc.ioctl(fd, request, arg or None) == 0 else _err()


def read_word(addr: int) -> bytes:
    return ctypes.string_at(addr, 8)


def write_word(addr: int, data: bytes) -> None:
    ctypes.memmove(addr, data, len(data))


def proc_mem_read(addr: int, size: int) -> tuple[bytes, int]:
    """Read this process's memory through /proc/self/mem (the VMA's .access)."""
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        return os.pread(fd, size, addr), 0
    except OSError as exc:
        return b"", exc.errno or errno.EIO
    finally:
        os.close(fd)
