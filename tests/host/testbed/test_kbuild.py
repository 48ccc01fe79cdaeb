"""obmm.testbed.builds.kbuild: apt output parsing, the cached headers tree, and W=1 builds.

Builds run against the guest kernel's headers, fetched once from Debian's
mirror into ~/.cache/obmm-testbed/kheaders (the cache serves later runs).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from obmm.testbed.builds import kbuild, kheaders

REPO = Path(__file__).resolve().parents[3]

POLICY = """\
linux-image-amd64:
  Installed: (none)
  Candidate: 6.1.192-3
  Version table:
     6.1.192-3 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
 *** 6.1.176-1 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
        100 /var/lib/dpkg/status
     6.12.38-1~bpo12+1 100
        100 http://deb.debian.org/debian bookworm-backports/main amd64 Packages
"""

GOOD_MODULE = """\
// SPDX-License-Identifier: GPL-2.0
#include <linux/module.h>

static int __init good_init(void)
{
\treturn 0;
}

static void __exit good_exit(void)
{
}

module_init(good_init);
module_exit(good_exit);
MODULE_DESCRIPTION("kbuild test module");
MODULE_LICENSE("GPL");
"""

WARNING_MODULE = GOOD_MODULE.replace(
    "\treturn 0;", "\tint unused_for_test;\n\n\treturn 0;"
).replace("good_", "noisy_")


def test_parse_policy_keeps_apt_order_and_suites() -> None:
    assert kheaders.parse_policy(POLICY) == [
        ("6.1.192-3", ["bookworm-security"]),
        ("6.1.176-1", ["bookworm"]),
        ("6.12.38-1~bpo12+1", ["bookworm-backports"]),
    ]


def test_parse_depends_takes_first_alternative_and_constraint() -> None:
    field = (
        "linux-headers-6.1.0-57-common (= 6.1.192-3), linux-kbuild-6.1 (>= 6.1.192-3), "
        "linux-compiler-gcc-12-x86, gcc-12:native | gcc"
    )
    assert kheaders.parse_depends(field) == [
        ("linux-headers-6.1.0-57-common", "= 6.1.192-3"),
        ("linux-kbuild-6.1", ">= 6.1.192-3"),
        ("linux-compiler-gcc-12-x86", None),
        ("gcc-12", None),
    ]


def test_find_warnings_catches_gcc_modpost_and_ld() -> None:
    log = "\n".join(
        [
            "  CC [M]  /b/x.o",
            "/b/x.c:5:13: warning: unused variable 'y' [-Wunused-variable]",
            "WARNING: modpost: /b/x.o: section mismatch in reference: f (section: .text)",
            "ld: warning: creating DT_TEXTREL in a PIE",
            "Skipping BTF generation for /b/x.ko due to unavailability of vmlinux",
        ]
    )
    assert kbuild.find_warnings(log) == log.splitlines()[1:4]


needs_debian = pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("make") is None,
    reason="needs apt-get and make (a Debian host)",
)


@pytest.fixture(scope="module")
def headers() -> Path:
    release = kheaders.debian_kernel_release("amd64")
    return kheaders.fetch_headers(release, "amd64")


def _module_tree(root: Path, name: str, source: str) -> Path:
    mod = root / "kmod" / name
    mod.mkdir(parents=True)
    (mod / f"{name}.c").write_text(source)
    (mod / "Kbuild").write_text(f"obj-m := {name}.o\n")
    return root / "kmod"


@needs_debian
def test_release_is_what_the_metapackage_depends_on() -> None:
    release = kheaders.debian_kernel_release("amd64")
    assert release.endswith("-amd64")
    assert release.split(".")[0].isdigit()


@needs_debian
def test_headers_tree_is_self_contained(headers: Path) -> None:
    root = headers.parents[2]
    assert (root / ".obmm-kheaders.json").is_file()
    assert (headers / "Module.symvers").is_file()
    assert (headers / "scripts" / "mod" / "modpost").is_file()  # via the relative link
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                assert not os.readlink(path).startswith("/"), path
    assert "include /" not in (headers / "Makefile").read_text()
    # Second call is a cache hit and returns the same tree.
    assert kheaders.fetch_headers(headers.name.removeprefix("linux-headers-"), "amd64") == headers


@needs_debian
def test_missing_release_fails_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(kbuild.KbuildError) as info:
        kheaders.fetch_headers("6.1.0-999-amd64", "amd64", tmp_path)
    assert str(info.value).startswith("cannot find headers for kernel 6.1.0-999-amd64 (amd64): ")
    assert list(tmp_path.iterdir()) == []


@needs_debian
def test_build_copies_ko_and_keeps_sources_clean(headers: Path, tmp_path: Path) -> None:
    kmod = _module_tree(tmp_path / "src", "kb_good", GOOD_MODULE)
    out = tmp_path / "out"
    assert kbuild.build_modules(headers, kmod, out) == [out / "kb_good.ko"]
    assert sorted(p.name for p in (kmod / "kb_good").iterdir()) == ["Kbuild", "kb_good.c"]
    assert (out / ".build" / "kmod" / "kb_good" / "kb_good.o").is_file()


@needs_debian
def test_a_second_build_recompiles_only_what_changed(headers: Path, tmp_path: Path) -> None:
    """The inner loop: an edited file is compiled again, the untouched ones are not, and an
    edit that went back to older text (an older mtime) is still rebuilt."""
    kmod = _module_tree(tmp_path / "src", "kb_good", GOOD_MODULE)
    (kmod / "kb_good" / "Kbuild").write_text("obj-m := kb_good.o\nkb_good-y := a.o b.o\n")
    (kmod / "kb_good" / "kb_good.c").rename(kmod / "kb_good" / "a.c")
    (kmod / "kb_good" / "b.c").write_text("int kb_b(void);\nint kb_b(void) { return 1; }\n")
    out = tmp_path / "out"
    kbuild.build_modules(headers, kmod, out)
    objs = out / ".build" / "kmod" / "kb_good"
    before = {name: (objs / name).stat().st_mtime_ns for name in ("a.o", "b.o")}
    old_b = (kmod / "kb_good" / "b.c").read_text()
    (kmod / "kb_good" / "b.c").write_text(old_b.replace("return 1", "return 2"))
    kbuild.build_modules(headers, kmod, out)
    assert (objs / "a.o").stat().st_mtime_ns == before["a.o"]
    assert (objs / "b.o").stat().st_mtime_ns > before["b.o"]
    rebuilt = (objs / "b.o").stat().st_mtime_ns
    (kmod / "kb_good" / "b.c").write_text(old_b)
    os.utime(kmod / "kb_good" / "b.c", ns=(before["b.o"] - 10**9,) * 2)
    kbuild.build_modules(headers, kmod, out)
    assert (objs / "b.o").stat().st_mtime_ns > rebuilt


def test_sync_keeps_build_output_and_drops_removed_sources(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    (src / "sub").mkdir(parents=True)
    (src / "a.c").write_text("a")
    (src / "sub" / "b.h").write_text("b")
    assert kbuild.sync_sources(src, copy) == 2
    (copy / "a.o").write_text("object")
    (copy / "gone.c").write_text("old")
    assert kbuild.sync_sources(src, copy) == 0  # nothing changed: nothing written
    assert sorted(p.name for p in copy.iterdir()) == ["a.c", "a.o", "sub"]
    (src / "a.c").write_text("a2")
    assert kbuild.sync_sources(src, copy) == 1
    assert (copy / "a.c").read_text() == "a2" and (copy / "a.o").exists()


@needs_debian
def test_a_failed_build_leaves_no_objects_for_the_next(headers: Path, tmp_path: Path) -> None:
    kmod = _module_tree(tmp_path / "src", "kb_noisy", WARNING_MODULE)
    for _ in range(2):  # the second build warns again: nothing of the first was kept
        with pytest.raises(kbuild.BuildWarningsError):
            kbuild.build_modules(headers, kmod, tmp_path / "out")


@needs_debian
def test_concurrent_builds_into_one_out_dir_take_turns(headers: Path, tmp_path: Path) -> None:
    # make test and make bench both build into results/kmod/<release>: the shared build copies
    # must not be removed under a running make, and each gets a whole .ko.
    kmod = _module_tree(tmp_path / "src", "kb_good", GOOD_MODULE)
    out = tmp_path / "out"
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: kbuild.build_modules(headers, kmod, out), range(3)))
    assert results == [[out / "kb_good.ko"]] * 3
    assert sorted(p.name for p in out.iterdir()) == [".build", ".build.lock", "kb_good.ko"]


@needs_debian
def test_warning_fails_the_build_and_shows_it(headers: Path, tmp_path: Path) -> None:
    kmod = _module_tree(tmp_path / "src", "kb_noisy", WARNING_MODULE)
    with pytest.raises(kbuild.BuildWarningsError) as info:
        kbuild.build_modules(headers, kmod, tmp_path / "out")
    (warning,) = info.value.warnings
    assert warning.endswith("warning: unused variable 'unused_for_test' [-Wunused-variable]")
    assert str(info.value).startswith("kb_noisy: build printed 1 warning(s)")
    assert warning in str(info.value)
    # Without -Werror semantics the same module builds.
    kos = kbuild.build_modules(headers, kmod, tmp_path / "out", warnings_as_errors=False)
    assert [k.name for k in kos] == ["kb_noisy.ko"]


@needs_debian
def test_extra_cflags_reach_the_compiler(headers: Path, tmp_path: Path) -> None:
    source = GOOD_MODULE.replace(
        "#include <linux/module.h>\n",
        '#include <linux/module.h>\n\n#ifndef KB_FROM_TEST\n#error "KCFLAGS not passed"\n#endif\n',
    )
    kmod = _module_tree(tmp_path / "src", "kb_flags", source)
    with pytest.raises(kbuild.KbuildError, match="KCFLAGS not passed"):
        kbuild.build_modules(headers, kmod, tmp_path / "out")
    kos = kbuild.build_modules(headers, kmod, tmp_path / "out", extra_cflags=["-DKB_FROM_TEST=1"])
    assert [k.name for k in kos] == ["kb_flags.ko"]


@needs_debian
def test_relative_paths_to_kmod_siblings_resolve(headers: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "uapi").mkdir(parents=True)
    (src / "uapi" / "kb_shared.h").write_text("#define KB_SHARED_RET 0\n")
    source = GOOD_MODULE.replace(
        "#include <linux/module.h>\n", '#include <linux/module.h>\n#include "kb_shared.h"\n'
    ).replace("return 0;", "return KB_SHARED_RET;")
    kmod = _module_tree(src, "kb_sib", source)
    (kmod / "kb_sib" / "Kbuild").write_text("ccflags-y += -I$(src)/../../uapi\nobj-m := kb_sib.o\n")
    assert [k.name for k in kbuild.build_modules(headers, kmod, tmp_path / "out")] == ["kb_sib.ko"]


@needs_debian
def test_testhook_builds_without_warnings(headers: Path, tmp_path: Path) -> None:
    kos = kbuild.build_modules(headers, REPO / "kmod", tmp_path, modules=["obmm_testhook"])
    assert [k.name for k in kos] == ["obmm_testhook.ko"]


def test_unknown_module_name_is_rejected(tmp_path: Path) -> None:
    kmod = _module_tree(tmp_path, "kb_x", GOOD_MODULE)
    (tmp_path / "hdr").mkdir()
    (tmp_path / "hdr" / "Makefile").write_text("")
    with pytest.raises(kbuild.KbuildError, match=r"no such module dir under .*: kb_y"):
        kbuild.build_modules(tmp_path / "hdr", kmod, tmp_path / "out", modules=["kb_y"])


def test_kernel_release_is_kept_until_the_package_lists_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test session asks for the release: apt-cache runs again only after the lists
    (or the apt configuration) changed."""
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text("a")
    monkeypatch.setattr(kheaders, "APT_STATE_GLOBS", (f"{lists}/*Packages*",))
    monkeypatch.setenv("OBMM_TESTBED_CACHE", str(tmp_path / "cache"))
    asked: list[str] = []

    def fake(arch: str, suite: str, apt_config: Path | None) -> str:
        asked.append(arch)
        return f"6.1.0-{len(asked)}-amd64"

    monkeypatch.setattr(kheaders, "_debian_kernel_release", fake)
    assert kheaders.debian_kernel_release("amd64") == "6.1.0-1-amd64"
    assert kheaders.debian_kernel_release("amd64") == "6.1.0-1-amd64"
    assert len(asked) == 1
    (lists / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text("ab")
    assert kheaders.debian_kernel_release("amd64") == "6.1.0-2-amd64"
    # a private apt configuration (a matrix lane) is always asked
    assert kheaders.debian_kernel_release("amd64", apt_config=tmp_path / "apt.conf") == (
        "6.1.0-3-amd64"
    )
    # the source version the debug kernel is built from is kept the same way
    versions: list[str] = []

    def version(package: str, suite: str, env: object) -> str:
        versions.append(package)
        return "6.1.99-1"

    monkeypatch.setattr(kheaders, "_suite_version", version)
    assert kheaders.suite_version("linux-source-6.1") == kheaders.suite_version("linux-source-6.1")
    assert versions == ["linux-source-6.1"]


@pytest.mark.parametrize("style", ["absolute .ko (6.1)", "relative .o (6.2+)"])
def test_built_modules_are_what_kbuild_listed_not_every_ko_left(tmp_path: Path, style: str) -> None:
    """An incremental build directory kept obmm_emu.ko from before the module became obmm.ko;
    a glob handed both to the loader, and two drivers claimed /dev/obmm."""
    (tmp_path / "obmm_emu.ko").write_bytes(b"stale")
    (tmp_path / "obmm.ko").write_bytes(b"new")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper.ko").write_bytes(b"new")
    if style.startswith("absolute"):
        lines = [str(tmp_path / "obmm.ko"), str(tmp_path / "sub" / "helper.ko")]
    else:
        lines = ["obmm.o", "sub/helper.o"]
    (tmp_path / "modules.order").write_text("\n".join(lines) + "\n")
    assert kbuild.built_modules(tmp_path) == [tmp_path / "obmm.ko", tmp_path / "sub" / "helper.ko"]


UNEXPORTED_MODULE = GOOD_MODULE.replace(
    "\treturn 0;", "\tdump_mm(current->mm);\n\treturn 0;"
).replace(
    "#include <linux/module.h>",
    "#include <linux/module.h>\n#include <linux/mmdebug.h>\n#include <linux/sched.h>",
)


@needs_debian
def test_a_failed_link_names_its_cause_in_the_summary(headers: Path, tmp_path: Path) -> None:
    """A module calling a symbol the kernel does not export (ub_compat's mmap_assert_locked on a
    CONFIG_DEBUG_VM kernel did): the one line the CLI prints names modpost's error, not only
    "make exited 2:"."""
    kmod = _module_tree(tmp_path / "src", "kb_link", UNEXPORTED_MODULE)
    with pytest.raises(kbuild.KbuildError) as info:
        kbuild.build_modules(headers, kmod, tmp_path / "out")
    assert info.value.summary.startswith("kb_link: make exited 2: ERROR: modpost: ")
    assert '"dump_mm"' in info.value.summary


def test_the_first_error_line_is_the_summary() -> None:
    output = "  CC [M]  x.o\nx.c:3:1: error: expected ';'\nmake[2]: *** [x.o] Error 1"
    assert kbuild.first_error(output) == "x.c:3:1: error: expected ';'"
    assert kbuild.first_error("only a line") == "only a line"
    assert kbuild.first_error("") == "no output"
