"""obmm.testbed.stages.matrix: private apt trees, cells, the glibc shim, and a per-cell API break.

The full three-cell build of kmod/ is the ``ci/kmod-matrix.sh`` stage (``make kmod-matrix``);
here a small module that uses an API Debian 13's kernel changed proves that a break shows as
exactly that cell failing (headers come from the cache, fetched once from deb.debian.org).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from obmm.testbed.builds import aptlists, kbuild
from obmm.testbed.stages import matrix


def test_cells_and_their_make_variables() -> None:
    assert [c.name for c in matrix.CELLS] == ["debian12-amd64", "debian13-amd64", "debian12-arm64"]
    assert matrix.cell_by_name("debian12-amd64").make_vars == {}
    assert matrix.cell_by_name("debian12-arm64").make_vars == {
        "ARCH": "arm64",
        "CROSS_COMPILE": "aarch64-linux-gnu-",
    }
    assert matrix.cell_by_name("debian13-amd64").make_vars == {
        "CC": "gcc-12",
        "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT": "",
        "CONFIG_DEBUG_INFO_BTF_MODULES": "",
    }


def test_unknown_cell_names_the_known_ones() -> None:
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.cell_by_name("debian11-amd64")
    assert str(exc.value) == (
        "unknown matrix cell 'debian11-amd64'; known: debian12-amd64, debian13-amd64, "
        "debian12-arm64"
    )


def test_sources_list_is_debian_only_with_updates_and_security() -> None:
    text = matrix.sources_list(
        "trixie", ["amd64", "arm64"], matrix.DEFAULT_MIRROR, matrix.DEFAULT_SECURITY_MIRROR
    )
    opts = f"[arch=amd64,arm64 signed-by={matrix.KEYRING}]"
    assert text.splitlines() == [
        f"deb {opts} http://deb.debian.org/debian trixie main",
        f"deb {opts} http://deb.debian.org/debian trixie-updates main",
        f"deb {opts} http://deb.debian.org/debian-security trixie-security main",
    ]


def test_apt_conf_keeps_every_path_in_the_private_tree(tmp_path: Path) -> None:
    text = matrix.apt_conf(tmp_path, ["amd64", "arm64"], "amd64")
    for line in text.splitlines():
        if line.startswith("Dir::"):
            assert f'"{tmp_path}/' in line, line
    assert 'APT::Architecture "amd64";' in text
    assert 'APT::Architectures { "amd64"; "arm64"; };' in text


def test_private_config_is_written_once_and_refreshed_when_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    updates: list[Path] = []
    monkeypatch.setattr(aptlists, "update_lists", lambda conf, what: updates.append(conf))
    cell = matrix.cell_by_name("debian12-arm64")
    conf = matrix.private_apt_config(cell, cache=tmp_path, native="amd64")
    root = tmp_path / "apt" / "bookworm-arm64"
    assert conf == root / "apt.conf"
    assert (root / "state" / "status").read_text() == ""  # nothing "installed"
    assert "[arch=amd64,arm64 " in (root / "sources.list").read_text()
    assert updates == [conf]
    matrix.private_apt_config(cell, cache=tmp_path, native="amd64")
    assert updates == [conf]  # fresh lists: no second update
    os.utime(root / matrix.STAMP, (0, 0))
    matrix.private_apt_config(cell, cache=tmp_path, native="amd64")
    assert updates == [conf, conf]
    matrix.private_apt_config(cell, cache=tmp_path, native="amd64", mirror="http://m/debian")
    assert len(updates) == 3  # the sources changed


def test_only_the_guests_cell_uses_the_hosts_apt_lists() -> None:
    flags = {c.name: matrix.uses_host_lists(c, native="amd64") for c in matrix.CELLS}
    assert flags == {"debian12-amd64": True, "debian13-amd64": False, "debian12-arm64": False}


def test_missing_cross_compiler_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(matrix.MatrixError) as exc:
        matrix.require_compiler(matrix.cell_by_name("debian12-arm64"))
    assert str(exc.value) == (
        "debian12-arm64: compiler aarch64-linux-gnu-gcc not found "
        "(apt-get install gcc-aarch64-linux-gnu)"
    )


def test_glibc_shim_wraps_tools_needing_a_newer_glibc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_ld = Path("/lib64/ld-linux-x86-64.so.2")
    if not host_ld.exists():
        pytest.skip("needs an x86_64 glibc host")
    assert matrix.needed_glibc(Path("/bin/echo")) is not None
    assert matrix.needed_glibc(Path("/bin/echo")) <= matrix.host_glibc()  # type: ignore[operator]
    tool = tmp_path / "usr" / "lib" / "linux-kbuild-x" / "echo-tool"
    tool.parent.mkdir(parents=True)
    shutil.copy2("/bin/echo", tool)
    # A "suite runtime" made of the host's own loader and libc, already unpacked.
    runtime = tmp_path / matrix.RUNTIME_DIR
    (runtime / "lib64").mkdir(parents=True)
    (runtime / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    shutil.copy2(host_ld.resolve(), runtime / "lib64" / "ld-linux-x86-64.so.2")
    shutil.copy2(
        Path("/lib/x86_64-linux-gnu/libc.so.6").resolve(),
        runtime / "lib" / "x86_64-linux-gnu" / "libc.so.6",
    )
    (runtime / ".complete").touch()
    monkeypatch.setattr(matrix, "host_glibc", lambda: (2, 0))  # every tool is "too new"
    assert matrix.shim_newer_glibc_tools(tmp_path, None, name="t") == [tool]
    assert tool.read_text().startswith("#!/bin/sh\n")
    assert (tool.parent / ("echo-tool" + matrix.SHIM_SUFFIX)).is_file()
    out = subprocess.run([str(tool), "via", "shim"], capture_output=True, text=True, check=True)
    assert out.stdout == "via shim\n"
    assert matrix.shim_newer_glibc_tools(tmp_path, None, name="t") == []  # idempotent


# Builds on 6.1 (class_create(owner, name)); Linux 6.4 dropped the owner argument, so
# Debian 13's 6.12 must fail: an API break shows as that one cell failing.
API_BREAK_MODULE = """\
// SPDX-License-Identifier: GPL-2.0
#include <linux/module.h>
#include <linux/device.h>
#include <linux/err.h>

static struct class *probe_class;

static int __init probe_init(void)
{
\tprobe_class = class_create(THIS_MODULE, "obmm_matrix_probe");
\treturn PTR_ERR_OR_ZERO(probe_class);
}

static void __exit probe_exit(void)
{
\tclass_destroy(probe_class);
}

module_init(probe_init);
module_exit(probe_exit);
MODULE_DESCRIPTION("matrix API-break probe");
MODULE_LICENSE("GPL");
"""


@pytest.mark.slow
def test_an_api_break_fails_only_that_cell(tmp_path: Path) -> None:
    kmod = tmp_path / "kmod"
    mod = kmod / "apiprobe"
    mod.mkdir(parents=True)
    (mod / "apiprobe.c").write_text(API_BREAK_MODULE)
    (mod / "Kbuild").write_text("obj-m := apiprobe.o\n")
    results = {}
    for name in ("debian12-amd64", "debian13-amd64"):
        try:
            results[name] = matrix.run_cell(
                matrix.cell_by_name(name), kmod_dir=kmod, out=tmp_path / "out"
            )
        except kbuild.KbuildError as exc:  # pragma: no cover - run_cell reports, never raises
            pytest.fail(str(exc))
    good, broken = results["debian12-amd64"], results["debian13-amd64"]
    assert good.ok, good.error
    assert good.modules == ["apiprobe.ko"]
    assert good.line().startswith(f"PASS debian12-amd64: {good.release}: apiprobe.ko (")
    assert not broken.ok
    assert broken.release.endswith("+deb13-amd64")
    assert broken.line().startswith(
        f"FAIL debian13-amd64: {broken.release}: apiprobe: make exited 2:"
    )
    assert "class_create" in broken.error
