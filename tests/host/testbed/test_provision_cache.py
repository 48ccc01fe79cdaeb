"""Guest modules are built once per source state: a second build with the same kmod/ reuses
the .ko files; a changed source, or a missing .ko, builds again."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed import arch as arch_table
from obmm.testbed import provision
from obmm.testbed.builds import elfcheck, kbuild, kheaders
from obmm.testbed.cli import kmod as kmod_cli


class FakeImage:
    kernel_release = "6.1.0-0-amd64"
    kdir = None  # Debian's headers (the debug kernel has its own build tree)
    arch = arch_table.X86_64


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    kmod = tmp_path / "src" / "kmod" / "m"
    kmod.mkdir(parents=True)
    (kmod / "m.c").write_text("int x;\n")
    monkeypatch.setattr(provision, "kmod_dir", lambda: kmod.parent)
    builds: list[int] = []

    def fake_build(headers: Path, src: Path, out: Path, **kw: object) -> list[Path]:
        builds.append(1)
        out.mkdir(parents=True, exist_ok=True)
        ko = out / "m.ko"
        ko.write_bytes(b"ko%d" % len(builds))
        return [ko]

    monkeypatch.setattr(kheaders, "fetch_headers", lambda release, *a, **kw: tmp_path)
    monkeypatch.setattr(kbuild, "build_modules", fake_build)
    monkeypatch.setattr(elfcheck.Symvers, "load", staticmethod(lambda path: None))
    monkeypatch.setattr(elfcheck, "module_exports", lambda ko: set())
    monkeypatch.setattr(elfcheck, "require_loadable", lambda *a, **kw: None)
    return kmod, builds


def test_unchanged_sources_reuse_the_last_build(
    tree: tuple[Path, list[int]], tmp_path: Path
) -> None:
    _kmod, builds = tree
    out = tmp_path / "out"
    first = provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    again = provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    assert builds == [1]
    assert again == first and again[0].read_bytes() == b"ko1"


def test_a_changed_source_or_a_missing_ko_builds_again(
    tree: tuple[Path, list[int]], tmp_path: Path
) -> None:
    kmod, builds = tree
    out = tmp_path / "out"
    provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    (kmod / "m.c").write_text("int y;\n")
    provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    assert len(builds) == 2
    (out / FakeImage.kernel_release / "m.ko").unlink()
    kos = provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    assert len(builds) == 3 and kos[0].is_file()


def test_the_suites_build_has_the_test_hooks_and_its_own_place(
    tree: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suites load obmm_emu built with OBMM_EMU_TEST=y (its test-only parameters); users'
    bring-ups load the module without them.  Both builds live side by side, each reused."""
    _kmod, builds = tree
    seen: list[object] = []
    fake = kbuild.build_modules

    def spy(headers: Path, src: Path, out: Path, **kw: object) -> list[Path]:
        seen.append(kw.get("make_vars"))
        return fake(headers, src, out, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(kbuild, "build_modules", spy)
    out = tmp_path / "out"
    users = provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    suites = provision.build_guest_modules(FakeImage(), out, test_hooks=True)  # type: ignore[arg-type]
    assert seen == [None, {"OBMM_EMU_TEST": "y"}]
    assert users[0].parent == out / FakeImage.kernel_release
    assert suites[0].parent == out / "test-hooks" / FakeImage.kernel_release
    provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    provision.build_guest_modules(FakeImage(), out, test_hooks=True)  # type: ignore[arg-type]
    assert len(builds) == 2


def _kmod_command(kmod: Path, out: Path, *extra: str) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    kmod_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--release", FakeImage.kernel_release, "--kmod", str(kmod), "--out", str(out), *extra]
    )
    return kmod_cli.command(args)


@pytest.fixture
def command_tree(
    tree: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, list[int]]:
    """`obmm-testbed kmod` over the fake tree: its kmod/ dir and the builds made."""
    kmod, builds = tree
    monkeypatch.setattr(elfcheck, "check_module", lambda *a, **kw: [])
    return kmod.parent, builds


def test_kmod_reuse_skips_only_a_build_of_the_same_sources(
    command_tree: tuple[Path, list[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kmod, builds = command_tree
    out = tmp_path / "kout"
    assert _kmod_command(kmod, out, "--reuse") == 0  # nothing built yet: builds
    assert _kmod_command(kmod, out, "--reuse") == 0
    assert len(builds) == 1
    assert f"kbuild: modules unchanged since their last build, reusing {out}" in (
        capsys.readouterr().out
    )
    assert _kmod_command(kmod, out) == 0  # without --reuse: always a build
    assert len(builds) == 2
    (kmod / "m" / "m.c").write_text("int z;\n")
    assert _kmod_command(kmod, out, "--reuse") == 0
    assert len(builds) == 3


def test_a_partial_or_lenient_build_is_never_reused(
    command_tree: tuple[Path, list[int]], tmp_path: Path
) -> None:
    kmod, builds = command_tree
    out = tmp_path / "kout"
    assert _kmod_command(kmod, out, "--no-werror") == 0
    assert _kmod_command(kmod, out, "--module", "m") == 0
    assert not (out / kbuild.BUILD_STAMP).exists()
    assert _kmod_command(kmod, out, "--reuse") == 0
    assert len(builds) == 3


def test_the_suites_reuse_what_obmm_testbed_kmod_built(
    command_tree: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """`make qemu-test` runs `obmm-testbed kmod --reuse` first; the jobs then build nothing."""
    kmod, builds = command_tree
    out = tmp_path / "results-kmod"
    assert _kmod_command(kmod, out / FakeImage.kernel_release, "--reuse") == 0
    kos = provision.build_guest_modules(FakeImage(), out)  # type: ignore[arg-type]
    assert len(builds) == 1 and kos[0].read_bytes() == b"ko1"
