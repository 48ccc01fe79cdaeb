"""Guest modules are built once per source state: a second build with the same kmod/ reuses
the .ko files; a changed source, or a missing .ko, builds again."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed import kbuild, provision
from obmm.tools import elfcheck


class FakeImage:
    kernel_release = "6.1.0-0-amd64"
    kdir = None  # Debian's headers (the debug kernel has its own build tree)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[int]]:
    kmod = tmp_path / "src" / "kmod" / "m"
    kmod.mkdir(parents=True)
    (kmod / "m.c").write_text("int x;\n")
    monkeypatch.setattr(provision, "kmod_dir", lambda: kmod.parent)
    builds: list[int] = []

    def fake_build(headers: Path, src: Path, out: Path) -> list[Path]:
        builds.append(1)
        out.mkdir(parents=True, exist_ok=True)
        ko = out / "m.ko"
        ko.write_bytes(b"ko%d" % len(builds))
        return [ko]

    monkeypatch.setattr(kbuild, "fetch_headers", lambda release: tmp_path)
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
