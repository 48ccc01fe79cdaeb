"""The bindings' ABI equals gcc's reading of uapi/ub/obmm.h, and both equal the reference."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from abi_probe import HEADER_DIR, Probe, abi_mismatches, compile_probe

from obmm import abi

pytestmark = pytest.mark.needs_gcc

# docs/obmm-driver.md section 2.4 (x86_64 gcc; arm64 identical).
REFERENCE_SIZES = {
    "struct obmm_cmd_export": 224,
    "struct obmm_cmd_export_pid": 104,
    "struct obmm_cmd_unexport": 16,
    "struct obmm_cmd_unimport": 16,
    "struct obmm_cmd_addr_query": 32,
    "struct obmm_cmd_import": 96,
    "struct obmm_cmd_update_range": 24,
    "struct obmm_cmd_preimport": 80,
}
REFERENCE_ALIGN = {name: 8 for name in REFERENCE_SIZES} | {"struct obmm_cmd_preimport": 16}
REFERENCE_OFFSETS = {
    "struct obmm_cmd_export": {
        "size": 0, "length": 128, "flags": 136, "uba": 144, "mem_id": 152, "tokenid": 160,
        "pxm_numa": 164, "priv_len": 168, "vendor_len": 170, "deid": 172, "seid": 188,
        "vendor_info": 208, "priv": 216,
    },
    "struct obmm_cmd_export_pid": {
        "va": 0, "length": 8, "flags": 16, "uba": 24, "mem_id": 32, "tokenid": 40, "pid": 44,
        "pxm_numa": 48, "priv_len": 52, "vendor_len": 54, "deid": 56, "seid": 72, "priv": 88,
        "vendor_info": 96,
    },
    "struct obmm_cmd_unexport": {"mem_id": 0, "flags": 8},
    "struct obmm_cmd_unimport": {"mem_id": 0, "flags": 8},
    "struct obmm_cmd_addr_query": {"key_type": 0, "mem_id": 8, "offset": 16, "pa": 24},
    "struct obmm_cmd_import": {
        "flags": 0, "mem_id": 8, "addr": 16, "length": 24, "tokenid": 32, "scna": 36,
        "dcna": 40, "numa_id": 44, "priv_len": 48, "base_dist": 50, "deid": 51, "seid": 67,
        "priv": 88,
    },
    "struct obmm_cmd_update_range": {"start": 0, "end": 8, "mem_state": 16, "cache_ops": 17},
    "struct obmm_cmd_preimport": {
        "pa": 0, "length": 8, "flags": 16, "scna": 24, "dcna": 28, "numa_id": 32,
        "priv_len": 36, "base_dist": 38, "deid": 39, "seid": 55, "priv": 71,
    },
}  # fmt: skip
REFERENCE_IOCTLS = {
    "OBMM_CMD_EXPORT": 0xC0E07800,
    "OBMM_CMD_IMPORT": 0xC0607801,
    "OBMM_CMD_UNEXPORT": 0x40107802,
    "OBMM_CMD_UNIMPORT": 0x40107803,
    "OBMM_CMD_ADDR_QUERY": 0xC0207804,
    "OBMM_CMD_EXPORT_PID": 0xC0687805,
    "OBMM_CMD_DECLARE_PREIMPORT": 0xC0507806,
    "OBMM_CMD_UNDECLARE_PREIMPORT": 0x40507807,
    "OBMM_SHMDEV_UPDATE_RANGE": 0x40185800,
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Probe:
    return compile_probe(tmp_path_factory.mktemp("probe"), list(abi.STRUCT_NAMES))


def test_bindings_equal_gcc(probe: Probe) -> None:
    assert abi_mismatches(probe) == []


@pytest.mark.parametrize("struct", abi.STRUCT_NAMES)
def test_gcc_layout_equals_reference(probe: Probe, struct: str) -> None:
    c = probe.structs[struct]
    assert c.size == REFERENCE_SIZES[struct]
    assert c.align == REFERENCE_ALIGN[struct]
    assert {name: off for name, (off, _) in c.members.items()} == REFERENCE_OFFSETS[struct]


@pytest.mark.parametrize("struct", abi.STRUCT_NAMES)
def test_binding_layout_equals_reference(struct: str) -> None:
    assert abi.sizeof(struct) == REFERENCE_SIZES[struct]
    assert abi.alignof(struct) == REFERENCE_ALIGN[struct]
    ours = {name: abi.offsetof(struct, name) for name in abi.fields(struct)}
    assert ours == REFERENCE_OFFSETS[struct]


@pytest.mark.parametrize("name", sorted(REFERENCE_IOCTLS))
def test_ioctl_numbers_equal_reference(probe: Probe, name: str) -> None:
    assert probe.ioctls[name] == REFERENCE_IOCTLS[name]
    assert abi.IOCTLS[name][0] == REFERENCE_IOCTLS[name]


def test_header_has_no_fork_only_ioctls() -> None:
    text = (HEADER_DIR / "ub" / "obmm.h").read_text()
    numbers = re.findall(r"_IOW?R?\('([xX])',\s*(\d+)", text)
    assert sorted(numbers) == sorted([("x", str(n)) for n in range(8)] + [("X", "0")])
    for fork_only in ("GSVA", "BOOTSTRAP", "SYNC_IMPORT_RANGE", "SYNC_REMOTE_RANGE"):
        assert fork_only not in text


def test_header_spdx_and_guard() -> None:
    lines = (HEADER_DIR / "ub" / "obmm.h").read_text().splitlines()
    assert lines[0] == "/* SPDX-License-Identifier: GPL-2.0+ WITH Linux-syscall-note */"
    assert "#ifndef UAPI_OBMM_H" in lines
    assert "#include <linux/types.h>" in lines


def test_header_compiles_as_cxx(tmp_path: Path) -> None:
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    src = tmp_path / "use.cc"
    src.write_text(
        "#include <sys/ioctl.h>\n#include <ub/obmm.h>\n"
        'static_assert(sizeof(obmm_cmd_export) == 224, "export");\n'
        'static_assert(alignof(obmm_cmd_preimport) == 16, "preimport");\n'
        "int main() { return OBMM_CMD_EXPORT == 0xc0e07800UL ? 0 : 1; }\n"
    )
    binary = tmp_path / "use"
    subprocess.run(
        ["g++", "-std=c++11", "-Wall", "-Werror", f"-I{HEADER_DIR}", "-o", binary, src],
        check=True,
    )
    assert subprocess.run([str(binary)]).returncode == 0


def _mutated_header(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the header with one edit, as tmp/ub/obmm.h."""
    text = (HEADER_DIR / "ub" / "obmm.h").read_text()
    assert text.count(old) == 1, f"edit anchor {old!r} must be unique"
    (tmp_path / "ub").mkdir()
    (tmp_path / "ub" / "obmm.h").write_text(text.replace(old, new))
    return tmp_path


def test_removed_field_is_caught(tmp_path: Path) -> None:
    header_dir = _mutated_header(tmp_path, "\t__u32 tokenid;\n\t__s32 pxm_numa;\n\t__u16 priv_len;",
                                 "\t__u32 tokenid;\n\t__u16 priv_len;")  # fmt: skip
    problems = abi_mismatches(compile_probe(tmp_path, list(abi.STRUCT_NAMES), header_dir))
    assert any(p.startswith("struct obmm_cmd_export: fields") for p in problems), problems
    assert any("OBMM_CMD_EXPORT:" in p for p in problems), problems


def test_reordered_field_is_caught(tmp_path: Path) -> None:
    header_dir = _mutated_header(
        tmp_path,
        "\t__u32 scna;\n\t__u32 dcna;\n\t__s32 numa_id;\n\t__u16 priv_len;\n\t__u8 base_dist;\n"
        "\t__u8 deid[16];\n\t__u8 seid[16];\n\tconst void *priv;\n} __attribute__((aligned(8)));",
        "\t__u32 dcna;\n\t__u32 scna;\n\t__s32 numa_id;\n\t__u16 priv_len;\n\t__u8 base_dist;\n"
        "\t__u8 deid[16];\n\t__u8 seid[16];\n\tconst void *priv;\n} __attribute__((aligned(8)));",
    )
    problems = abi_mismatches(compile_probe(tmp_path, list(abi.STRUCT_NAMES), header_dir))
    assert "struct obmm_cmd_import.scna: offset 36 != gcc 40" in problems
    assert "struct obmm_cmd_import.dcna: offset 40 != gcc 36" in problems


def test_dropped_packed_attribute_is_caught(tmp_path: Path) -> None:
    header_dir = _mutated_header(tmp_path, "__attribute__((aligned(16), packed))",
                                 "__attribute__((aligned(16)))")  # fmt: skip
    problems = abi_mismatches(compile_probe(tmp_path, list(abi.STRUCT_NAMES), header_dir))
    assert "struct obmm_cmd_preimport.priv: offset 71 != gcc 72" in problems


def _load_precompiled(tmp_path: Path) -> Any:
    import importlib.util

    path = tmp_path / f"{abi.PRECOMPILED_MODULE}.py"
    abi.emit_precompiled(path)
    spec = importlib.util.spec_from_file_location(f"obmm.{abi.PRECOMPILED_MODULE}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_precompiled_bindings_equal_gcc(
    probe: Probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guests load the declarations precompiled (abi.emit_precompiled): the same layouts."""
    module = _load_precompiled(tmp_path)
    assert abi.declarations_text() == module.DECLARATIONS
    precompiled = module.ffi
    parsed = abi.parse_ffi()
    for name in ("ioctl", "mmap", "munmap"):
        assert str(precompiled.typeof(getattr(precompiled.dlopen(None), name))) == str(
            parsed.typeof(getattr(parsed.dlopen(None), name))
        )
    monkeypatch.setattr(abi, "ffi", precompiled)
    assert abi_mismatches(probe) == []
