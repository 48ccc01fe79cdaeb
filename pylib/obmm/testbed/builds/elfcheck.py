"""Pre-flight checks of a kernel module (.ko) before any guest boots.

An insmod that fails inside a VM costs a boot and a log dig; the same
mismatch read from the ELF on the host costs milliseconds.  Checked, with the
field or symbol named in each problem:

* ELF header: relocatable object for the guest's machine (EM_X86_64 / EM_AARCH64);
* ``.modinfo``: a GPL-compatible ``license=`` and a ``vermagic=`` for the guest release;
* every undefined symbol is exported by the guest kernel (its ``Module.symvers``)
  or by a module loaded together, GPL-only exports only to GPL modules,
  namespaced exports only with ``import_ns=``;
* modversion CRCs (``__versions``, or ``__version_ext_*`` on newer kernels)
  equal the kernel's.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Union

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from obmm.testbed.errors import TestbedError

#: Debian arch (and uname -m spelling) -> ELF e_machine the guest kernel loads.
MACHINES: Mapping[str, str] = {
    "amd64": "EM_X86_64",
    "x86_64": "EM_X86_64",
    "arm64": "EM_AARCH64",
    "aarch64": "EM_AARCH64",
}

#: include/linux/license.h: license_is_gpl_compatible().
GPL_COMPATIBLE_LICENSES = frozenset(
    {
        "GPL",
        "GPL v2",
        "GPL and additional rights",
        "Dual BSD/GPL",
        "Dual MIT/GPL",
        "Dual MPL/GPL",
    }
)

#: struct modversion_info: unsigned long crc + char name[64 - sizeof(long)].
_MODVERSION_RECORD = 64
#: Linker-provided names that are never kernel exports.
_NOT_IMPORTS = frozenset({"_GLOBAL_OFFSET_TABLE_", ".TOC."})


@dataclass(frozen=True)
class Problem:
    """One reason the module would not load (or would taint) on the guest kernel."""

    field: str  # "elf", "machine", "modinfo", "license", "vermagic", "symbol", "modversion"
    message: str
    symbol: str | None = None

    def __str__(self) -> str:
        return self.message


class ModuleCheckError(TestbedError):
    """Raised by require_loadable(); ``problems`` holds every problem found."""

    def __init__(self, ko_path: Path, problems: Iterable[Problem]) -> None:
        self.ko_path = ko_path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{ko_path.name}: {len(self.problems)} pre-flight problem(s):\n{lines}")


@dataclass(frozen=True)
class Export:
    """One line of Module.symvers."""

    crc: int
    module: str
    export_type: str  # EXPORT_SYMBOL, EXPORT_SYMBOL_GPL, ...
    namespace: str


@dataclass(frozen=True)
class Symvers:
    """A parsed Module.symvers: symbol -> Export.  Load once, check many modules."""

    path: Path
    exports: Mapping[str, Export]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Symvers:
        exports: dict[str, Export] = {}
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                # <CRC> <Symbol> <Module> <Export Type> [<Namespace>], tab-separated.
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 4:
                    continue
                namespace = fields[4] if len(fields) > 4 else ""
                exports[fields[1]] = Export(int(fields[0], 16), fields[2], fields[3], namespace)
        return cls(Path(path), exports)


SymversSource = Union[str, "os.PathLike[str]", Symvers]


def _open_elf(fh: BinaryIO) -> Any:
    return ELFFile(fh)


def read_modinfo(elf: Any) -> dict[str, list[str]] | None:
    """``.modinfo`` as key -> values (keys like alias repeat); None if the section is absent."""
    section = elf.get_section_by_name(".modinfo")
    if section is None:
        return None
    info: dict[str, list[str]] = {}
    for record in bytes(section.data()).split(b"\0"):
        key, sep, value = record.decode("utf-8", "replace").partition("=")
        if sep:
            info.setdefault(key, []).append(value)
    return info


def modinfo(ko_path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The ``.modinfo`` records of a .ko file (empty if it has none)."""
    with open(ko_path, "rb") as fh:
        return read_modinfo(_open_elf(fh)) or {}


def section_size(ko_path: str | os.PathLike[str], name: str) -> int | None:
    """The size of section `name` of a .ko file, None if it has no such section."""
    with open(ko_path, "rb") as fh:
        section = _open_elf(fh).get_section_by_name(name)
        return None if section is None else int(section["sh_size"])


def _symbols(elf: Any) -> Iterable[Any]:
    symtab = elf.get_section_by_name(".symtab")
    if not isinstance(symtab, SymbolTableSection):
        return ()
    return symtab.iter_symbols()


def undefined_symbols(elf: Any) -> set[str]:
    """Names the module imports: undefined entries of ``.symtab``."""
    return {
        sym.name
        for sym in _symbols(elf)
        if sym.name and sym["st_shndx"] == "SHN_UNDEF" and sym.name not in _NOT_IMPORTS
    }


def module_exports(ko_path: str | os.PathLike[str]) -> set[str]:
    """Symbols a .ko exports (its ``__ksymtab_<name>`` entries), for extra_exports."""
    prefix = "__ksymtab_"
    with open(ko_path, "rb") as fh:
        elf = _open_elf(fh)
        return {
            sym.name[len(prefix) :]
            for sym in _symbols(elf)
            if sym.name.startswith(prefix) and sym["st_shndx"] != "SHN_UNDEF"
        }


def read_modversions(elf: Any) -> list[tuple[str, int]]:
    """(symbol, CRC) pairs the module was built against; empty without CONFIG_MODVERSIONS."""
    order = "<" if elf.little_endian else ">"
    pairs: list[tuple[str, int]] = []
    versions = elf.get_section_by_name("__versions")
    if versions is not None:
        data = bytes(versions.data())
        crc_fmt = order + ("Q" if elf.elfclass == 64 else "I")
        crc_size = struct.calcsize(crc_fmt)
        for off in range(0, len(data) - _MODVERSION_RECORD + 1, _MODVERSION_RECORD):
            (crc,) = struct.unpack_from(crc_fmt, data, off)
            raw = data[off + crc_size : off + _MODVERSION_RECORD]
            name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            if name:
                pairs.append((name, crc & 0xFFFFFFFF))
    # Extended modversions (Linux 6.13+): parallel arrays of u32 CRCs and names.
    ext_crcs = elf.get_section_by_name("__version_ext_crcs")
    ext_names = elf.get_section_by_name("__version_ext_names")
    if ext_crcs is not None and ext_names is not None:
        crc_data = bytes(ext_crcs.data())
        crcs = struct.unpack(f"{order}{len(crc_data) // 4}I", crc_data[: len(crc_data) // 4 * 4])
        names = [n.decode("utf-8", "replace") for n in bytes(ext_names.data()).split(b"\0") if n]
        known = {name for name, _ in pairs}
        pairs.extend((n, c) for n, c in zip(names, crcs) if n not in known)
    return pairs


def _check_header(elf: Any, arch: str) -> list[Problem]:
    problems: list[Problem] = []
    expected = MACHINES[arch]
    machine = elf["e_machine"]
    if machine != expected:
        problems.append(
            Problem("machine", f"machine: module is {machine}, guest arch {arch} needs {expected}")
        )
    if elf["e_type"] != "ET_REL":
        problems.append(
            Problem("elf", f"elf: module is {elf['e_type']}, a loadable module must be ET_REL")
        )
    if elf.get_section_by_name(".gnu.linkonce.this_module") is None:
        problems.append(
            Problem("elf", "elf: no .gnu.linkonce.this_module section (not a kernel module)")
        )
    return problems


def _check_modinfo(
    info: Mapping[str, list[str]] | None, kernel_release: str
) -> tuple[list[Problem], str | None]:
    """Problems in license= and vermagic=, plus the license (None if absent)."""
    if info is None:
        return [Problem("modinfo", "modinfo: no .modinfo section (not a kernel module)")], None
    problems: list[Problem] = []
    license_ = info.get("license", [None])[0]
    if license_ is None:
        problems.append(
            Problem("license", "license: no license= in .modinfo (would taint the kernel)")
        )
    elif license_ not in GPL_COMPATIBLE_LICENSES:
        problems.append(
            Problem(
                "license",
                f"license: {license_!r} is not GPL-compatible "
                "(taints the kernel; GPL-only exports refused)",
            )
        )
    vermagic = info.get("vermagic", [None])[0]
    if vermagic is None:
        problems.append(Problem("vermagic", "vermagic: no vermagic= in .modinfo"))
    else:
        built_for = vermagic.split()[0] if vermagic.split() else "(empty)"
        if built_for != kernel_release:
            problems.append(
                Problem(
                    "vermagic",
                    f"vermagic: module built for {built_for}, guest runs {kernel_release}",
                )
            )
    return problems, license_


def check_module(
    ko_path: str | os.PathLike[str],
    *,
    kernel_release: str,
    arch: str,
    symvers_path: SymversSource,
    extra_exports: Iterable[str] = (),
) -> list[Problem]:
    """Every reason ``ko_path`` would fail to load cleanly on ``kernel_release`` / ``arch``.

    ``symvers_path`` is the kernel's Module.symvers (or an already loaded
    Symvers, to check many modules quickly); ``extra_exports`` are symbols
    provided by other modules loaded together.  An empty list means loadable.
    """
    if arch not in MACHINES:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(sorted(MACHINES))}")
    symvers = symvers_path if isinstance(symvers_path, Symvers) else Symvers.load(symvers_path)
    symvers_name = symvers.path.name
    others = set(extra_exports)
    path = Path(ko_path)
    with open(path, "rb") as fh:
        try:
            elf = _open_elf(fh)
        except ELFError as exc:
            return [Problem("elf", f"elf: {path.name} is not an ELF file ({exc})")]
        problems = _check_header(elf, arch)
        raw_info = read_modinfo(elf)
        info_problems, license_ = _check_modinfo(raw_info, kernel_release)
        problems += info_problems
        info = raw_info or {}
        imports = undefined_symbols(elf)
        modversions = read_modversions(elf)

    gpl_ok = license_ in GPL_COMPATIBLE_LICENSES
    imported_ns = set(info.get("import_ns", []))
    for name in sorted(imports - others):
        export = symvers.exports.get(name)
        if export is None:
            problems.append(
                Problem(
                    "symbol",
                    f"undefined symbol {name} not exported by {kernel_release} ({symvers_name})",
                    name,
                )
            )
            continue
        if export.export_type.endswith("_GPL") and not gpl_ok:
            problems.append(
                Problem(
                    "symbol",
                    f"undefined symbol {name} is {export.export_type} in {kernel_release}, "
                    f"module license {license_!r} is not GPL-compatible",
                    name,
                )
            )
        if export.namespace and export.namespace not in imported_ns:
            problems.append(
                Problem(
                    "symbol",
                    f"undefined symbol {name} is in namespace {export.namespace}, "
                    f"module lacks MODULE_IMPORT_NS({export.namespace})",
                    name,
                )
            )

    for name, crc in modversions:
        if name in others:
            continue
        export = symvers.exports.get(name)
        if export is None:
            if name not in imports:  # an import is already reported above
                problems.append(
                    Problem(
                        "modversion",
                        f"modversion: {name} in __versions not exported by {kernel_release} "
                        f"({symvers_name})",
                        name,
                    )
                )
        elif crc != export.crc:
            problems.append(
                Problem(
                    "modversion",
                    f"modversion: {name} CRC 0x{crc:08x} in module, {kernel_release} has "
                    f"0x{export.crc:08x} ({symvers_name})",
                    name,
                )
            )
    return problems


def require_loadable(
    ko_path: str | os.PathLike[str],
    *,
    kernel_release: str,
    arch: str,
    symvers_path: SymversSource,
    extra_exports: Iterable[str] = (),
) -> None:
    """check_module(), raising ModuleCheckError listing every problem if there is any."""
    problems = check_module(
        ko_path,
        kernel_release=kernel_release,
        arch=arch,
        symvers_path=symvers_path,
        extra_exports=extra_exports,
    )
    if problems:
        raise ModuleCheckError(Path(ko_path), problems)
