"""obmm.testbed.builds.elfcheck on real .ko files built from kmod/obmm_testhook, and
doctored copies.

The first run downloads the guest kernel's headers from Debian's mirror
(~15 MB, into ~/.cache/obmm-testbed/kheaders); later runs use the cache.
"""

from __future__ import annotations

import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from obmm.testbed.builds import elfcheck, kbuild, kheaders

REPO = Path(__file__).resolve().parents[3]
ARCH = "amd64"
#: e_machine is the u16 at offset 18 of the ELF header.
E_MACHINE_OFFSET = 18
EM_AARCH64 = 183


@dataclass(frozen=True)
class Built:
    release: str
    headers: Path
    symvers: Path
    ko: Path


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if shutil.which("apt-get") is None or shutil.which("make") is None:
        pytest.skip("needs apt-get and make (a Debian host) to fetch headers and build")
    release = kheaders.debian_kernel_release(ARCH)
    headers = kheaders.fetch_headers(release, ARCH)
    out = tmp_path_factory.mktemp("kmod-out")
    (ko,) = kbuild.build_modules(headers, REPO / "kmod", out, modules=["obmm_testhook"])
    return Built(release, headers, headers / "Module.symvers", ko)


def _check(built: Built, ko: Path, **overrides: object) -> list[str]:
    kwargs: dict[str, object] = {
        "kernel_release": built.release,
        "arch": ARCH,
        "symvers_path": built.symvers,
    }
    kwargs.update(overrides)
    return [str(p) for p in elfcheck.check_module(ko, **kwargs)]  # type: ignore[arg-type]


def _patched(src: Path, dest: Path, old: bytes, new: bytes) -> Path:
    assert len(old) == len(new), "patches keep section sizes"
    data = src.read_bytes()
    assert data.count(old) == 1, f"{old!r} must occur once in {src.name}"
    dest.write_bytes(data.replace(old, new))
    return dest


def _other_release(release: str) -> str:
    """Same-length release with another ABI number: 6.1.0-57-amd64 -> 6.1.0-56-amd64."""
    m = re.match(r"^(\d+\.\d+\.\d+-)(\d+)(-.*)$", release)
    assert m, release
    abi = int(m.group(2))
    other = str(abi - 1) if len(str(abi - 1)) == len(m.group(2)) else str(abi + 1)
    return m.group(1) + other + m.group(3)


def _edit_symvers(src: Path, dest: Path, symbol: str, fields: list[str] | None) -> Path:
    """Copy Module.symvers replacing ``symbol``'s line (fields = None drops it)."""
    lines = []
    for line in src.read_text().splitlines(keepends=True):
        if line.split("\t")[1] == symbol:
            if fields is not None:
                lines.append("\t".join(fields) + "\n")
            continue
        lines.append(line)
    dest.write_text("".join(lines))
    return dest


def test_built_module_passes(built: Built) -> None:
    assert _check(built, built.ko) == []
    elfcheck.require_loadable(
        built.ko, kernel_release=built.release, arch=ARCH, symvers_path=built.symvers
    )


def test_modinfo_and_imports_read_from_the_real_module(built: Built) -> None:
    info = elfcheck.modinfo(built.ko)
    assert info["license"] == ["GPL"]
    assert info["name"] == ["obmm_testhook"]
    assert info["vermagic"][0].split()[0] == built.release
    assert elfcheck.module_exports(built.ko) == set()
    with built.ko.open("rb") as fh:
        from elftools.elf.elffile import ELFFile

        elf = ELFFile(fh)
        imports = elfcheck.undefined_symbols(elf)
        versions = dict(elfcheck.read_modversions(elf))
    assert {"misc_register", "misc_deregister", "panic", "__warn_printk"} <= imports
    symvers = elfcheck.Symvers.load(built.symvers)
    assert versions["misc_register"] == symvers.exports["misc_register"].crc


def test_wrong_vermagic(built: Built, tmp_path: Path) -> None:
    other = _other_release(built.release)
    ko = _patched(
        built.ko,
        tmp_path / "vermagic.ko",
        b"vermagic=" + built.release.encode(),
        b"vermagic=" + other.encode(),
    )
    assert _check(built, ko) == [f"vermagic: module built for {other}, guest runs {built.release}"]


def test_unexported_symbol(built: Built, tmp_path: Path) -> None:
    symvers = _edit_symvers(built.symvers, tmp_path / "Module.symvers", "misc_register", None)
    assert _check(built, built.ko, symvers_path=symvers) == [
        f"undefined symbol misc_register not exported by {built.release} (Module.symvers)"
    ]


def test_symbol_from_a_module_loaded_together_is_accepted(built: Built, tmp_path: Path) -> None:
    symvers = _edit_symvers(built.symvers, tmp_path / "Module.symvers", "misc_register", None)
    assert _check(built, built.ko, symvers_path=symvers, extra_exports={"misc_register"}) == []


def test_non_gpl_license(built: Built, tmp_path: Path) -> None:
    ko = _patched(built.ko, tmp_path / "mit.ko", b"license=GPL\0", b"license=MIT\0")
    assert _check(built, ko) == [
        "license: 'MIT' is not GPL-compatible (taints the kernel; GPL-only exports refused)"
    ]


def test_gpl_only_export_refused_to_non_gpl_module(built: Built, tmp_path: Path) -> None:
    ko = _patched(built.ko, tmp_path / "mit.ko", b"license=GPL\0", b"license=MIT\0")
    crc = f"0x{elfcheck.Symvers.load(built.symvers).exports['misc_register'].crc:08x}"
    symvers = _edit_symvers(
        built.symvers,
        tmp_path / "Module.symvers",
        "misc_register",
        [crc, "misc_register", "vmlinux", "EXPORT_SYMBOL_GPL", ""],
    )
    assert _check(built, ko, symvers_path=symvers) == [
        "license: 'MIT' is not GPL-compatible (taints the kernel; GPL-only exports refused)",
        f"undefined symbol misc_register is EXPORT_SYMBOL_GPL in {built.release}, "
        "module license 'MIT' is not GPL-compatible",
    ]


def test_namespaced_export_needs_import_ns(built: Built, tmp_path: Path) -> None:
    crc = f"0x{elfcheck.Symvers.load(built.symvers).exports['misc_register'].crc:08x}"
    symvers = _edit_symvers(
        built.symvers,
        tmp_path / "Module.symvers",
        "misc_register",
        [crc, "misc_register", "vmlinux", "EXPORT_SYMBOL", "OBMM_TEST_NS"],
    )
    assert _check(built, built.ko, symvers_path=symvers) == [
        "undefined symbol misc_register is in namespace OBMM_TEST_NS, "
        "module lacks MODULE_IMPORT_NS(OBMM_TEST_NS)"
    ]


def test_wrong_machine(built: Built, tmp_path: Path) -> None:
    data = bytearray(built.ko.read_bytes())
    struct.pack_into("<H", data, E_MACHINE_OFFSET, EM_AARCH64)
    ko = tmp_path / "arm.ko"
    ko.write_bytes(bytes(data))
    assert _check(built, ko) == ["machine: module is EM_AARCH64, guest arch amd64 needs EM_X86_64"]


def test_module_for_another_guest_arch(built: Built) -> None:
    assert _check(built, built.ko, arch="arm64") == [
        "machine: module is EM_X86_64, guest arch arm64 needs EM_AARCH64"
    ]


def test_modversion_crc_mismatch(built: Built, tmp_path: Path) -> None:
    crc = elfcheck.Symvers.load(built.symvers).exports["misc_register"].crc
    symvers = _edit_symvers(
        built.symvers,
        tmp_path / "Module.symvers",
        "misc_register",
        ["0x00000001", "misc_register", "vmlinux", "EXPORT_SYMBOL", ""],
    )
    assert _check(built, built.ko, symvers_path=symvers) == [
        f"modversion: misc_register CRC 0x{crc:08x} in module, {built.release} has "
        "0x00000001 (Module.symvers)"
    ]


def test_all_problems_reported_together(built: Built, tmp_path: Path) -> None:
    other = _other_release(built.release)
    step = _patched(
        built.ko,
        tmp_path / "step.ko",
        b"vermagic=" + built.release.encode(),
        b"vermagic=" + other.encode(),
    )
    ko = _patched(step, tmp_path / "both.ko", b"license=GPL\0", b"license=MIT\0")
    with pytest.raises(elfcheck.ModuleCheckError) as info:
        elfcheck.require_loadable(
            ko, kernel_release=built.release, arch=ARCH, symvers_path=built.symvers
        )
    assert [str(p) for p in info.value.problems] == [
        "license: 'MIT' is not GPL-compatible (taints the kernel; GPL-only exports refused)",
        f"vermagic: module built for {other}, guest runs {built.release}",
    ]
    assert str(info.value).startswith("both.ko: 2 pre-flight problem(s):\n  - license: 'MIT'")
    assert [p.field for p in info.value.problems] == ["license", "vermagic"]


def test_not_an_elf_file(built: Built, tmp_path: Path) -> None:
    junk = tmp_path / "junk.ko"
    junk.write_bytes(b"not a module at all\n")
    (problem,) = _check(built, junk)
    assert problem.startswith("elf: junk.ko is not an ELF file (")


def test_preloaded_symvers_gives_the_same_answer(built: Built) -> None:
    symvers = elfcheck.Symvers.load(built.symvers)
    assert len(symvers.exports) > 10000  # the whole of vmlinux plus in-tree modules
    assert _check(built, built.ko, symvers_path=symvers) == []
    assert _check(built, built.ko, symvers_path=symvers, kernel_release="x") == [
        f"vermagic: module built for {built.release}, guest runs x"
    ]


def test_unknown_arch_is_a_caller_error(built: Built) -> None:
    with pytest.raises(ValueError, match="unknown arch 'sparc'"):
        _check(built, built.ko, arch="sparc")
