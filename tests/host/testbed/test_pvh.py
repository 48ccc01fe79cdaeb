"""The kernel ELF unpacked from a bzImage for a PVH start: found, checked, cached, refused."""

from __future__ import annotations

import gzip
import lzma
import struct
from pathlib import Path

import pytest

from obmm.testbed.vm import pvh


def _elf(note_type: int) -> bytes:
    """A 64-bit ELF with one PT_NOTE segment holding a Xen note of `note_type`."""
    desc = struct.pack("<Q", 0x1000850)
    note = struct.pack("<III", 4, len(desc), note_type) + b"Xen\0" + desc
    ehdr_size, phdr_size = 64, 56
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, 62, 1, 0, ehdr_size, 0, 0, ehdr_size, phdr_size, 1, 0, 0, 0
    )
    phdr = struct.pack("<IIQQQQQQ", 4, 4, ehdr_size + phdr_size, 0, 0, len(note), len(note), 4)
    return ehdr + phdr + note


def _bzimage(payload: bytes, version: int = 0x20F) -> bytes:
    setup_sects = 1
    image = bytearray((setup_sects + 1) * 512)
    image[0x1F1] = setup_sects
    image[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", image, 0x206, version)
    struct.pack_into("<II", image, 0x248, 16, len(payload))
    return bytes(image) + bytes(16) + payload + b"\x00\x10\x00\x00"  # + a trailing size word


def test_the_payload_is_unpacked_from_xz_and_gzip_and_its_pvh_note_found() -> None:
    elf = _elf(pvh.XEN_ELFNOTE_PHYS32_ENTRY)
    assert pvh.payload(_bzimage(lzma.compress(elf, format=lzma.FORMAT_XZ))) == elf
    assert pvh.payload(_bzimage(gzip.compress(elf))) == elf
    assert pvh.has_pvh_entry(elf)
    assert not pvh.has_pvh_entry(_elf(5))  # another Xen note only
    assert not pvh.has_pvh_entry(b"not an elf")


def test_what_cannot_be_unpacked_is_refused() -> None:
    with pytest.raises(pvh.PvhError, match="not a bzImage"):
        pvh.payload(bytes(1024))
    with pytest.raises(pvh.PvhError, match="payload fields"):
        pvh.payload(_bzimage(b"", version=0x207))
    with pytest.raises(pvh.PvhError, match="payload format"):
        pvh.payload(_bzimage(b"\x28\xb5\x2f\xfdzstd"))


def test_the_elf_is_made_once_and_a_kernel_without_pvh_boots_as_a_bzimage(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "kernels"
    good = tmp_path / "vmlinuz"
    good.write_bytes(_bzimage(lzma.compress(_elf(pvh.XEN_ELFNOTE_PHYS32_ENTRY))))
    out = pvh.pvh_kernel(good, cache)
    assert out is not None and out.read_bytes() == _elf(pvh.XEN_ELFNOTE_PHYS32_ENTRY)
    stamp = out.stat().st_mtime_ns
    assert pvh.pvh_kernel(good, cache) == out and out.stat().st_mtime_ns == stamp
    plain = tmp_path / "vmlinuz-nopvh"
    plain.write_bytes(_bzimage(lzma.compress(_elf(5))))
    assert pvh.pvh_kernel(plain, cache) is None
    assert len(list(cache.glob("*.not-pvh"))) == 1  # not unpacked again next time
    stand_in = tmp_path / "fake-kernel"
    stand_in.write_bytes(b"fake")
    assert pvh.pvh_kernel(stand_in, cache) is None
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [out.name, next(cache.glob("*.not-pvh")).name]
    )
