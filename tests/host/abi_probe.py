"""Compile a probe against uapi/ub/obmm.h and read back what gcc computed.

Layouts come from the probe's DWARF (pyelftools), so every member the header
declares is seen, including ones the bindings might miss; alignments and ioctl
numbers come from running the probe.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

REPO = Path(__file__).resolve().parents[2]
HEADER_DIR = REPO / "uapi"

IOCTL_NAMES = (
    "OBMM_CMD_EXPORT",
    "OBMM_CMD_IMPORT",
    "OBMM_CMD_UNEXPORT",
    "OBMM_CMD_UNIMPORT",
    "OBMM_CMD_ADDR_QUERY",
    "OBMM_CMD_EXPORT_PID",
    "OBMM_CMD_DECLARE_PREIMPORT",
    "OBMM_CMD_UNDECLARE_PREIMPORT",
    "OBMM_SHMDEV_UPDATE_RANGE",
)

INT_CONSTANTS = (
    "OBMM_MAX_LOCAL_NUMA_NODES",
    "MAX_NUMA_DIST",
    "OBMM_MAX_PRIV_LEN",
    "OBMM_MAX_VENDOR_LEN",
    "OBMM_EXPORT_FLAG_ALLOW_MMAP",
    "OBMM_EXPORT_FLAG_FAST",
    "OBMM_EXPORT_FLAG_MASK",
    "OBMM_UNEXPORT_FLAG_MASK",
    "OBMM_QUERY_BY_PA",
    "OBMM_QUERY_BY_ID_OFFSET",
    "OBMM_IMPORT_FLAG_ALLOW_MMAP",
    "OBMM_IMPORT_FLAG_PREIMPORT",
    "OBMM_IMPORT_FLAG_NUMA_REMOTE",
    "OBMM_IMPORT_FLAG_MASK",
    "OBMM_UNIMPORT_FLAG_MASK",
    "OBMM_SHM_MEM_CACHE_RESV",
    "OBMM_SHM_MEM_NORMAL",
    "OBMM_SHM_MEM_NORMAL_NC",
    "OBMM_SHM_MEM_DEVICE",
    "OBMM_SHM_MEM_CACHE_MASK",
    "OBMM_SHM_MEM_READONLY",
    "OBMM_SHM_MEM_READEXEC",
    "OBMM_SHM_MEM_READWRITE",
    "OBMM_SHM_MEM_NO_ACCESS",
    "OBMM_SHM_MEM_ACCESS_MASK",
    "OBMM_SHM_CACHE_NONE",
    "OBMM_SHM_CACHE_INVAL",
    "OBMM_SHM_CACHE_WB_INVAL",
    "OBMM_SHM_CACHE_WB_ONLY",
    "OBMM_SHM_CACHE_INFER",
    "OBMM_PREIMPORT_FLAG_MASK",
    "OBMM_UNPREIMPORT_FLAG_MASK",
    "OBMM_MMAP_FLAG_HUGETLB_PMD",
)


@dataclass
class CStruct:
    name: str
    size: int
    align: int = 0
    # member name -> (offset, size), in declaration order
    members: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Probe:
    structs: dict[str, CStruct]
    ioctls: dict[str, int]
    constants: dict[str, int]


def _probe_source(struct_names: list[str]) -> str:
    lines = [
        "#include <stdio.h>",
        "#include <sys/ioctl.h>",
        "#include <ub/obmm.h>",
    ]
    # One global per struct forces its full type into the DWARF.
    lines += [f"{s} probe_{i};" for i, s in enumerate(struct_names)]
    lines.append("int main(void)\n{")
    for s in struct_names:
        lines.append(f'\tprintf("align {s.split()[-1]} %zu\\n", _Alignof({s}));')
    for name in IOCTL_NAMES:
        lines.append(f'\tprintf("ioctl {name} %lu\\n", (unsigned long)({name}));')
    for name in INT_CONSTANTS:
        lines.append(f'\tprintf("const {name} %lld\\n", (long long)({name}));')
    lines.append("\treturn 0;\n}")
    return "\n".join(lines) + "\n"


def _strip(die: Any) -> Any:
    """Follow typedef/const/volatile to the type that has a size."""
    while die.tag in ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type"):
        die = die.get_DIE_from_attribute("DW_AT_type")
    return die


def _type_size(die: Any) -> int:
    die = _strip(die)
    if "DW_AT_byte_size" in die.attributes:
        return int(die.attributes["DW_AT_byte_size"].value)
    if die.tag == "DW_TAG_array_type":
        count = 1
        for sub in die.iter_children():
            if sub.tag == "DW_TAG_subrange_type":
                if "DW_AT_count" in sub.attributes:
                    count *= int(sub.attributes["DW_AT_count"].value)
                else:
                    count *= int(sub.attributes["DW_AT_upper_bound"].value) + 1
        return count * _type_size(die.get_DIE_from_attribute("DW_AT_type"))
    raise ValueError(f"no size for DWARF type {die.tag}")


def _dwarf_structs(binary: Path) -> dict[str, CStruct]:
    structs: dict[str, CStruct] = {}
    with binary.open("rb") as fh:
        dwarf = ELFFile(fh).get_dwarf_info()
        for cu in dwarf.iter_CUs():
            for die in cu.iter_DIEs():
                if die.tag != "DW_TAG_structure_type" or "DW_AT_name" not in die.attributes:
                    continue
                name = "struct " + die.attributes["DW_AT_name"].value.decode()
                if not name.startswith("struct obmm_") or "DW_AT_byte_size" not in die.attributes:
                    continue
                st = CStruct(name, int(die.attributes["DW_AT_byte_size"].value))
                for member in die.iter_children():
                    if member.tag != "DW_TAG_member":
                        continue
                    mname = member.attributes["DW_AT_name"].value.decode()
                    offset = int(member.attributes["DW_AT_data_member_location"].value)
                    msize = _type_size(member.get_DIE_from_attribute("DW_AT_type"))
                    st.members[mname] = (offset, msize)
                structs[name] = st
    return structs


def compile_probe(
    workdir: Path, struct_names: list[str], header_dir: Path = HEADER_DIR, cc: str = "gcc"
) -> Probe:
    """Build and run the probe against `header_dir/ub/obmm.h`."""
    if shutil.which(cc) is None:
        raise RuntimeError(f"{cc} not found: the ABI probe needs a C compiler")
    src = workdir / "abi_probe.c"
    binary = workdir / "abi_probe"
    src.write_text(_probe_source(struct_names))
    subprocess.run(
        [cc, "-std=gnu11", "-g", "-O0", "-Wall", "-Werror", f"-I{header_dir}", "-o", binary, src],
        check=True,
        capture_output=True,
        text=True,
    )
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    structs = _dwarf_structs(binary)
    ioctls: dict[str, int] = {}
    constants: dict[str, int] = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        if kind == "align":
            structs[f"struct {name}"].align = int(value)
        elif kind == "ioctl":
            ioctls[name] = int(value)
        else:
            constants[name] = int(value) & 0xFFFFFFFFFFFFFFFF
    return Probe(structs, ioctls, constants)


def abi_mismatches(probe: Probe) -> list[str]:
    """Every way the cffi bindings differ from what gcc computed from the header."""
    from obmm import abi

    problems: list[str] = []
    for struct in abi.STRUCT_NAMES:
        c = probe.structs.get(struct)
        if c is None:
            problems.append(f"{struct}: not in the header")
            continue
        if abi.sizeof(struct) != c.size:
            problems.append(f"{struct}: size {abi.sizeof(struct)} != gcc {c.size}")
        if abi.alignof(struct) != c.align:
            problems.append(f"{struct}: align {abi.alignof(struct)} != gcc {c.align}")
        if abi.fields(struct) != list(c.members):
            problems.append(f"{struct}: fields {abi.fields(struct)} != gcc {list(c.members)}")
        for name, (offset, size) in c.members.items():
            if name not in abi.fields(struct):
                continue
            if abi.offsetof(struct, name) != offset:
                problems.append(
                    f"{struct}.{name}: offset {abi.offsetof(struct, name)} != gcc {offset}"
                )
            if abi.field_size(struct, name) != size:
                problems.append(
                    f"{struct}.{name}: size {abi.field_size(struct, name)} != gcc {size}"
                )
    for name in IOCTL_NAMES:
        ours = abi.IOCTLS[name][0]
        if probe.ioctls.get(name) != ours:
            problems.append(f"{name}: {ours:#x} != gcc {probe.ioctls.get(name, 0):#x}")
    for name in INT_CONSTANTS:
        if probe.constants.get(name) != getattr(abi, name):
            problems.append(f"{name}: {getattr(abi, name)} != gcc {probe.constants.get(name)}")
    return problems
