"""The stock kernel without its decompression: the ELF inside a bzImage, booted at its PVH entry.

A distribution's bzImage is a small decompressor and the compressed kernel (Debian's amd64: xz).
Under TCG the decompressor runs emulated, seconds of every cold boot before the kernel's clock
starts.  The payload is the kernel's own ELF (vmlinux); a kernel built with CONFIG_PVH carries a
Xen PHYS32_ENTRY note, and QEMU's -kernel given such an ELF loads its segments and starts it
there (qboot and SeaBIOS both can), passing the command line and the initrd as it does for a
bzImage.  :func:`pvh_kernel` decompresses the payload once on the host (the same kernel, byte
for byte the code the decompressor would produce) into the cache, keyed by the bzImage's
content; None when the kernel has no PVH entry or a payload format the standard library cannot
read (then the bzImage boots as before).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import logging
import lzma
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

#: The bzImage header fields (Documentation/arch/x86/boot.rst): setup_sects at 0x1f1,
#: "HdrS" at 0x202, the protocol version at 0x206, payload_offset/length at 0x248/0x24c.
_SETUP_SECTS = 0x1F1
_MAGIC_AT = 0x202
_VERSION_AT = 0x206
_PAYLOAD_AT = 0x248
_MIN_VERSION = 0x208  # payload fields exist from boot protocol 2.08
#: Xen's ELF note type of the 32-bit PVH entry point (include/xen/interface/elfnote.h).
XEN_ELFNOTE_PHYS32_ENTRY = 18
_PT_NOTE = 4


class PvhError(ValueError):
    """The file is not a bzImage whose payload can be unpacked here."""


def payload(bzimage: bytes) -> bytes:
    """The decompressed payload of a bzImage (the kernel's ELF)."""
    if bzimage[_MAGIC_AT : _MAGIC_AT + 4] != b"HdrS":
        raise PvhError("not a bzImage (no HdrS header)")
    (version,) = struct.unpack_from("<H", bzimage, _VERSION_AT)
    if version < _MIN_VERSION:
        raise PvhError(f"boot protocol {version:#x} has no payload fields")
    setup_sects = bzimage[_SETUP_SECTS] or 4
    offset, length = struct.unpack_from("<II", bzimage, _PAYLOAD_AT)
    start = (setup_sects + 1) * 512 + offset
    data = bzimage[start : start + length]
    if data.startswith(b"\xfd7zXZ\x00"):
        # The kernel's xz stream may be followed by the decompressor's own size field.
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.decompress(data)
    if data.startswith(b"BZh"):
        return bz2.decompress(data)
    raise PvhError(f"payload format {data[:4].hex()} is not one the standard library reads")


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF carries Xen's PHYS32_ENTRY note."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return False
    phoff, phentsize, phnum = (
        struct.unpack_from("<Q", elf, 0x20)[0],
        *struct.unpack_from("<HH", elf, 0x36),
    )
    for i in range(phnum):
        p_type, _flags, p_offset, _v, _p, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize
        )
        if p_type != _PT_NOTE:
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + _align4(namesz) + _align4(descsz)
    return False


def _align4(n: int) -> int:
    return (n + 3) & ~3


def pvh_kernel(bzimage: Path, cache: Path) -> Path | None:
    """The kernel ELF of `bzimage` in `cache` (made once), or None if it cannot boot that way."""
    data = bzimage.read_bytes()
    if data[_MAGIC_AT : _MAGIC_AT + 4] != b"HdrS":
        return None  # not a bzImage (a test's stand-in): nothing to unpack or remember
    digest = hashlib.sha256(data).hexdigest()[:24]
    out = cache / f"vmlinux-{digest}"
    refused = cache / f"vmlinux-{digest}.not-pvh"
    if out.is_file():
        return out
    if refused.exists():
        return None
    cache.mkdir(parents=True, exist_ok=True)
    try:
        elf = payload(data)
        if not has_pvh_entry(elf):
            raise PvhError("the kernel has no PVH entry note (CONFIG_PVH)")
    except (PvhError, lzma.LZMAError, OSError, EOFError, struct.error) as exc:
        log.info("%s: booted as a bzImage: %s", bzimage, exc)
        with contextlib.suppress(OSError):
            refused.write_text(f"{exc}\n")
        return None
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_bytes(elf)
    os.replace(tmp, out)
    return out
