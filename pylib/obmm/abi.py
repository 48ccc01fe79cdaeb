"""cffi bindings of `uapi/ub/obmm.h`, in ABI mode: no C compiler needed at run time.

Real UB hosts often have python3 and cffi but no compiler, so the layouts
here are declared, not compiled.  `tests/host/runtime/test_abi.py` proves that every
size, alignment, field offset and ioctl number equals what gcc computes from
the header, and equals the reference table.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, cast

import cffi

if TYPE_CHECKING:
    from pathlib import Path

_TYPES = """
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
"""

# Field order, types and names exactly as in uapi/ub/obmm.h.  Every struct
# there is aligned(8), which is also its natural alignment (it holds a __u64),
# so the default layout rules give the same result.
_STRUCTS = """
struct obmm_cmd_export {
    __u64 size[16];
    __u64 length;
    __u64 flags;
    __u64 uba;
    __u64 mem_id;
    __u32 tokenid;
    __s32 pxm_numa;
    __u16 priv_len;
    __u16 vendor_len;
    __u8 deid[16];
    __u8 seid[16];
    const void *vendor_info;
    const void *priv;
};

struct obmm_cmd_export_pid {
    void *va;
    __u64 length;
    __u64 flags;
    __u64 uba;
    __u64 mem_id;
    __u32 tokenid;
    __s32 pid;
    __s32 pxm_numa;
    __u16 priv_len;
    __u16 vendor_len;
    __u8 deid[16];
    __u8 seid[16];
    const void *priv;
    const void *vendor_info;
};

struct obmm_cmd_unexport {
    __u64 mem_id;
    __u64 flags;
};

enum obmm_query_key_type {
    OBMM_QUERY_BY_PA = 0,
    OBMM_QUERY_BY_ID_OFFSET = 1
};

struct obmm_cmd_addr_query {
    enum obmm_query_key_type key_type;
    __u64 mem_id;
    __u64 offset;
    __u64 pa;
};

struct obmm_cmd_import {
    __u64 flags;
    __u64 mem_id;
    __u64 addr;
    __u64 length;
    __u32 tokenid;
    __u32 scna;
    __u32 dcna;
    __s32 numa_id;
    __u16 priv_len;
    __u8 base_dist;
    __u8 deid[16];
    __u8 seid[16];
    const void *priv;
};

struct obmm_cmd_unimport {
    __u64 mem_id;
    __u64 flags;
};

struct obmm_cmd_update_range {
    __u64 start;
    __u64 end;
    __u8 mem_state;
    __u8 cache_ops;
};
"""

# The header declares this one __attribute__((aligned(16), packed)): packed
# puts priv at offset 71 (79 bytes of fields) and aligned(16) pads the size
# to 80.  cdef can say "packed" but not "aligned(16)", so the tail padding is
# spelled out as a member of our own; ALIGNMENT_OVERRIDES restores the 16.
_PACKED_STRUCTS = """
struct obmm_cmd_preimport {
    __u64 pa;
    __u64 length;
    __u64 flags;
    __u32 scna;
    __u32 dcna;
    __s32 numa_id;
    __u16 priv_len;
    __u8 base_dist;
    __u8 deid[16];
    __u8 seid[16];
    const void *priv;
    __u8 _obmm_tail_pad[1];
};
"""

_LIBC = """
int ioctl(int fd, unsigned long request, ...);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
"""

#: Members the binding adds that the header does not have (padding made explicit).
BINDING_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "struct obmm_cmd_preimport": ("_obmm_tail_pad",),
}

#: C alignment where cffi's own rules cannot express the header's attribute.
ALIGNMENT_OVERRIDES: dict[str, int] = {"struct obmm_cmd_preimport": 16}

STRUCT_NAMES: tuple[str, ...] = (
    "struct obmm_cmd_export",
    "struct obmm_cmd_export_pid",
    "struct obmm_cmd_unexport",
    "struct obmm_cmd_addr_query",
    "struct obmm_cmd_import",
    "struct obmm_cmd_unimport",
    "struct obmm_cmd_update_range",
    "struct obmm_cmd_preimport",
)


#: The out-of-line module :func:`emit_precompiled` writes (cffi's "out-of-line ABI mode"): the
#: declarations above, already parsed.  Parsing them takes pycparser about 0.5 s of CPU under
#: TCG, paid by every guest process that imports obmm; loading this module about 0.04 s.  The
#: testbed's payload carries one made on the host; a checkout or an installed wheel has none.
PRECOMPILED_MODULE = "_abi_ffi"


def _declarations() -> tuple[tuple[str, bool], ...]:
    """(cdef text, packed) in the order they are declared."""
    return ((_TYPES, False), (_STRUCTS, False), (_PACKED_STRUCTS, True), (_LIBC, False))


def declarations_text() -> str:
    """What a precompiled module must have been made from (it records this text)."""
    return "".join(f"/* packed={packed} */\n{text}" for text, packed in _declarations())


def parse_ffi() -> cffi.FFI:
    """The declarations parsed by cffi (pycparser): always right, slow on a TCG guest."""
    parsed = cffi.FFI()
    for text, packed in _declarations():
        parsed.cdef(text, packed=packed)
    return parsed


def emit_precompiled(path: Path) -> None:
    """Write the precompiled module for these declarations to `path` (cffi's own generator)."""
    import io

    builder = parse_ffi()
    builder.set_source(f"obmm.{PRECOMPILED_MODULE}", None, compiler_verbose=False)
    text = io.StringIO()
    builder.emit_python_code(text)
    text.write(f"\nDECLARATIONS = {declarations_text()!r}\n")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text.getvalue())
    os.replace(tmp, path)


def _precompiled_ffi() -> cffi.FFI | None:
    """The precompiled module's ffi if there is one made from these very declarations and
    this cffi can load it; else None (the caller parses)."""
    import importlib

    try:
        module = importlib.import_module(f"obmm.{PRECOMPILED_MODULE}")
    except Exception:  # none here, or another cffi's format this backend refuses
        return None
    if getattr(module, "DECLARATIONS", None) != declarations_text():
        return None
    # A _cffi_backend.FFI: the same API as cffi.FFI for everything but cdef.
    return cast(cffi.FFI, module.ffi)


def _build_ffi() -> tuple[cffi.FFI, str]:
    precompiled = _precompiled_ffi()
    if precompiled is not None:
        return precompiled, "precompiled"
    return parse_ffi(), "parsed"


ffi, FFI_ORIGIN = _build_ffi()

# ---- constants (uapi/ub/obmm.h) ----
OBMM_MAX_LOCAL_NUMA_NODES = 16
MAX_NUMA_DIST = 255
OBMM_MAX_PRIV_LEN = 512
OBMM_MAX_VENDOR_LEN = 128

OBMM_EXPORT_FLAG_ALLOW_MMAP = 0x1
OBMM_EXPORT_FLAG_FAST = 0x2
OBMM_EXPORT_FLAG_MASK = 0x3
OBMM_UNEXPORT_FLAG_MASK = 0x0

OBMM_QUERY_BY_PA = 0
OBMM_QUERY_BY_ID_OFFSET = 1

OBMM_IMPORT_FLAG_ALLOW_MMAP = 0x1
OBMM_IMPORT_FLAG_PREIMPORT = 0x2
OBMM_IMPORT_FLAG_NUMA_REMOTE = 0x4
OBMM_IMPORT_FLAG_MASK = 0x7
OBMM_UNIMPORT_FLAG_MASK = 0x0

OBMM_SHM_MEM_CACHE_RESV = 0x0
OBMM_SHM_MEM_NORMAL = 0x1
OBMM_SHM_MEM_NORMAL_NC = 0x2
OBMM_SHM_MEM_DEVICE = 0x3
OBMM_SHM_MEM_CACHE_MASK = 0b11

OBMM_SHM_MEM_READONLY = 0x0
OBMM_SHM_MEM_READEXEC = 0x4
OBMM_SHM_MEM_READWRITE = 0x8
OBMM_SHM_MEM_NO_ACCESS = 0xC
OBMM_SHM_MEM_ACCESS_MASK = 0b1100

OBMM_SHM_CACHE_NONE = 0x0
OBMM_SHM_CACHE_INVAL = 0x1
OBMM_SHM_CACHE_WB_INVAL = 0x2
OBMM_SHM_CACHE_WB_ONLY = 0x3
OBMM_SHM_CACHE_INFER = 0x4

OBMM_PREIMPORT_FLAG_MASK = 0x0
OBMM_UNPREIMPORT_FLAG_MASK = 0x0

OBMM_MMAP_FLAG_HUGETLB_PMD = 1 << 63

# ---- ioctl encoding: asm-generic/ioctl.h, shared by x86_64 and arm64 ----
_IOC_NRBITS = 8
_IOC_TYPEBITS = 8
_IOC_SIZEBITS = 14
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_WRITE = 1
_IOC_READ = 2


def ioc(direction: int, ioc_type: str, nr: int, size: int) -> int:
    """The `_IOC()` macro of asm-generic/ioctl.h."""
    if size >= 1 << _IOC_SIZEBITS:
        raise ValueError(f"ioctl argument size {size} does not fit in {_IOC_SIZEBITS} bits")
    return (
        (direction << _IOC_DIRSHIFT)
        | (ord(ioc_type) << _IOC_TYPESHIFT)
        | (nr << _IOC_NRSHIFT)
        | (size << _IOC_SIZESHIFT)
    )


def _iow(ioc_type: str, nr: int, struct: str) -> int:
    return ioc(_IOC_WRITE, ioc_type, nr, ffi.sizeof(struct))


def _iowr(ioc_type: str, nr: int, struct: str) -> int:
    return ioc(_IOC_READ | _IOC_WRITE, ioc_type, nr, ffi.sizeof(struct))


OBMM_CMD_EXPORT = _iowr("x", 0, "struct obmm_cmd_export")
OBMM_CMD_IMPORT = _iowr("x", 1, "struct obmm_cmd_import")
OBMM_CMD_UNEXPORT = _iow("x", 2, "struct obmm_cmd_unexport")
OBMM_CMD_UNIMPORT = _iow("x", 3, "struct obmm_cmd_unimport")
OBMM_CMD_ADDR_QUERY = _iowr("x", 4, "struct obmm_cmd_addr_query")
OBMM_CMD_EXPORT_PID = _iowr("x", 5, "struct obmm_cmd_export_pid")
OBMM_CMD_DECLARE_PREIMPORT = _iowr("x", 6, "struct obmm_cmd_preimport")
OBMM_CMD_UNDECLARE_PREIMPORT = _iow("x", 7, "struct obmm_cmd_preimport")
OBMM_SHMDEV_UPDATE_RANGE = _iow("X", 0, "struct obmm_cmd_update_range")

#: ioctl name -> (request number, argument struct, operation name used in errors).
IOCTLS: dict[str, tuple[int, str, str]] = {
    "OBMM_CMD_EXPORT": (OBMM_CMD_EXPORT, "struct obmm_cmd_export", "EXPORT"),
    "OBMM_CMD_IMPORT": (OBMM_CMD_IMPORT, "struct obmm_cmd_import", "IMPORT"),
    "OBMM_CMD_UNEXPORT": (OBMM_CMD_UNEXPORT, "struct obmm_cmd_unexport", "UNEXPORT"),
    "OBMM_CMD_UNIMPORT": (OBMM_CMD_UNIMPORT, "struct obmm_cmd_unimport", "UNIMPORT"),
    "OBMM_CMD_ADDR_QUERY": (OBMM_CMD_ADDR_QUERY, "struct obmm_cmd_addr_query", "ADDR_QUERY"),
    "OBMM_CMD_EXPORT_PID": (OBMM_CMD_EXPORT_PID, "struct obmm_cmd_export_pid", "EXPORT_PID"),
    "OBMM_CMD_DECLARE_PREIMPORT": (
        OBMM_CMD_DECLARE_PREIMPORT,
        "struct obmm_cmd_preimport",
        "DECLARE_PREIMPORT",
    ),
    "OBMM_CMD_UNDECLARE_PREIMPORT": (
        OBMM_CMD_UNDECLARE_PREIMPORT,
        "struct obmm_cmd_preimport",
        "UNDECLARE_PREIMPORT",
    ),
    "OBMM_SHMDEV_UPDATE_RANGE": (
        OBMM_SHMDEV_UPDATE_RANGE,
        "struct obmm_cmd_update_range",
        "UPDATE_RANGE",
    ),
}

# The cdata type is dynamic; Any keeps callers free of casts.
CData = Any


def sizeof(struct: str) -> int:
    return int(ffi.sizeof(struct))


def alignof(struct: str) -> int:
    return ALIGNMENT_OVERRIDES.get(struct, int(ffi.alignof(struct)))


def offsetof(struct: str, field: str) -> int:
    return int(ffi.offsetof(struct, field))


def fields(struct: str) -> list[str]:
    """Member names of a struct as the header declares them (binding padding left out)."""
    extra = BINDING_ONLY_FIELDS.get(struct, ())
    return [name for name, _ in ffi.typeof(struct).fields if name not in extra]


def field_size(struct: str, field: str) -> int:
    for name, fld in ffi.typeof(struct).fields:
        if name == field:
            return int(ffi.sizeof(fld.type))
    raise KeyError(f"{struct} has no field {field!r}")


def new(struct: str) -> CData:
    """A zeroed instance of one of the header's structs (`struct obmm_cmd_export` ...)."""
    if struct not in STRUCT_NAMES:
        raise KeyError(f"{struct!r} is not a struct of uapi/ub/obmm.h")
    return ffi.new(f"{struct} *")


@functools.cache
def libc() -> Any:
    """The C library, opened on first use (ioctl, mmap, munmap)."""
    return ffi.dlopen(None)


def ioctl(fd: int, name: str, arg: CData) -> int:
    """Issue one ioctl of the header on `fd`; raise ObmmError on failure."""
    from obmm.errors import ObmmError

    request, struct, op = IOCTLS[name]
    if ffi.typeof(arg) != ffi.typeof(f"{struct} *"):
        raise TypeError(f"{name} takes a '{struct} *', got {ffi.typeof(arg).cname}")
    ret = int(libc().ioctl(fd, ffi.cast("unsigned long", request), ffi.cast("void *", arg)))
    if ret < 0:
        raise ObmmError(op, ffi.errno)
    return ret
