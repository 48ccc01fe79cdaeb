"""Image recipes, hashing and the cache (no image is really built)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest

from obmm import envvars
from obmm.testbed.builds import image
from obmm.testbed.builds.image import ImageError, Recipe
from obmm.testbed.progress import StepFailed


def _recipe_copy(tmp_path: Path) -> Recipe:
    src = image.find_recipe("debian-bookworm").path.parent
    dst = tmp_path / "debian"
    shutil.copytree(src, dst)
    return Recipe.load(dst / "bookworm.json")


def test_default_recipe_pins_kernel_image_and_headers_of_one_release(tmp_path: Path) -> None:
    recipe = image.find_recipe()
    argv = image.mmdebstrap_argv(recipe, tmp_path / "root", "6.1.0-99-amd64")
    include = next(a for a in argv if a.startswith("--include="))
    pkgs = include.removeprefix("--include=").split(",")
    assert {"linux-image-6.1.0-99-amd64", "linux-headers-6.1.0-99-amd64"} <= set(pkgs)
    assert {"python3", "python3-cffi", "python3-pytest", "openssh-server"} <= set(pkgs)
    assert "bookworm" in argv and str(tmp_path / "root") in argv
    assert any(a.startswith("--customize-hook=") for a in argv)


def test_fingerprint_is_stable_and_covers_recipe_hooks_kernel_and_key(tmp_path: Path) -> None:
    recipe = _recipe_copy(tmp_path)
    base = recipe.fingerprint(kernel_release="6.1.0-1-amd64", authorized_key="ssh-ed25519 A")
    assert base == recipe.fingerprint(
        kernel_release="6.1.0-1-amd64", authorized_key="ssh-ed25519 A"
    )
    assert base != recipe.fingerprint(
        kernel_release="6.1.0-2-amd64", authorized_key="ssh-ed25519 A"
    )
    assert base != recipe.fingerprint(
        kernel_release="6.1.0-1-amd64", authorized_key="ssh-ed25519 B"
    )
    hook = tmp_path / "debian" / "customize.sh"
    hook.write_text(hook.read_text() + "\n# changed\n")
    after_hook = Recipe.load(recipe.path).fingerprint(
        kernel_release="6.1.0-1-amd64", authorized_key="ssh-ed25519 A"
    )
    assert base != after_hook
    # A file the hooks install (the fast-boot init) is part of the image too.
    assert "obmm-init" in recipe.files
    init = tmp_path / "debian" / "obmm-init"
    init.write_text(init.read_text() + "\n# changed\n")
    assert after_hook != Recipe.load(recipe.path).fingerprint(
        kernel_release="6.1.0-1-amd64", authorized_key="ssh-ed25519 A"
    )


def _fake_image(directory: Path, release: str) -> None:
    directory.mkdir(parents=True)
    for name in ("disk.qcow2", "vmlinuz", "initrd.img"):
        (directory / name).write_bytes(b"x")
    (directory / "manifest.json").write_text(
        json.dumps({"kernel_release": release, "ssh_key": "/k", "host_key": "ssh-ed25519 AAAA"})
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setattr(image, "resolve_kernel_release", lambda recipe, arch: "6.1.0-7-amd64")
    return cache


def test_cached_image_is_reused_without_building(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = image.find_recipe()
    key = image.ensure_ssh_key(cache)
    pub = key.with_suffix(".pub").read_text().strip()
    final = image.image_dir_for(recipe, cache, "6.1.0-7-amd64", pub)
    _fake_image(final, "6.1.0-7-amd64")

    def no_build(*a: object, **k: object) -> None:
        raise AssertionError("rebuilt although nothing changed")

    monkeypatch.setattr(image, "_build", no_build)
    got = image.ensure_image(recipe, cache=cache)
    assert got.directory == final
    assert got.kernel_release == "6.1.0-7-amd64"


def test_ssh_key_is_made_once_per_cache(cache: Path) -> None:
    first = image.ensure_ssh_key(cache)
    content = first.read_bytes()
    assert image.ensure_ssh_key(cache) == first
    assert first.read_bytes() == content
    assert first.with_suffix(".pub").read_text().startswith("ssh-ed25519 ")


def test_failed_build_leaves_no_image_and_no_temp_dir(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(recipe: Recipe, out: Path, **kw: object) -> None:
        (out / "rootfs").mkdir()
        raise ImageError("mirror went away")

    monkeypatch.setattr(image, "_build", failing)
    with pytest.raises(ImageError, match="mirror went away"):
        image.ensure_image(image.find_recipe(), cache=cache)
    assert [p.name for p in (cache / "images").iterdir()] == [".lock"]


def test_failed_build_keeps_its_log_and_names_it_in_the_first_line(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(recipe: Recipe, out: Path, **kw: object) -> None:
        (out / "build.log").write_text("E: Failed to fetch http://deb.debian.org/... 503\n")
        raise StepFailed("mmdebstrap failed with exit status 25; log <gone>, last lines:\nE: ...")

    monkeypatch.setattr(image, "_build", failing)
    with pytest.raises(ImageError) as exc:
        image.ensure_image(image.find_recipe(), cache=cache)
    first = exc.value.summary
    assert first.startswith("mmdebstrap failed with exit status 25; build log kept at ")
    kept = Path(first.rsplit(" ", 1)[1])
    assert kept.parent == cache / "logs" and "503" in kept.read_text()
    assert [p.name for p in (cache / "images").iterdir()] == [".lock"]


def test_mmdebstrap_is_retried_once_into_an_empty_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    rootfs = tmp_path / "rootfs"

    class FlakyProgress:
        def line(self, text: str) -> None:
            pass

        def run(self, step: str, argv: list[str], logfile: Path, **kw: object) -> None:
            calls.append(rootfs.exists())
            if len(calls) == 1:
                rootfs.mkdir()  # a partial tree from the failed attempt
                raise StepFailed("mmdebstrap failed with exit status 25")

    monkeypatch.setattr(image.shutil, "which", lambda name: "/usr/bin/" + name)
    recipe = image.find_recipe()
    image._bootstrap_debian(recipe, rootfs, "6.1.0-7-amd64", tmp_path / "log", {}, FlakyProgress())  # type: ignore[arg-type]
    assert calls == [False, False]  # the second attempt found no partial tree

    class BrokenProgress(FlakyProgress):
        def run(self, step: str, argv: list[str], logfile: Path, **kw: object) -> None:
            calls.append(True)
            raise StepFailed("mmdebstrap failed with exit status 25")

    calls.clear()
    with pytest.raises(StepFailed):
        image._bootstrap_debian(
            recipe, rootfs, "6.1.0-7-amd64", tmp_path / "log", {}, BrokenProgress()
        )  # type: ignore[arg-type]
    assert len(calls) == 2  # once more, not forever


def test_interrupted_build_is_cleaned_and_rebuilt(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def interrupted(recipe: Recipe, out: Path, **kw: object) -> None:
        raise KeyboardInterrupt

    def works(recipe: Recipe, out: Path, **kw: object) -> None:
        calls.append(out)
        shutil.rmtree(out)
        _fake_image(out, "6.1.0-7-amd64")

    monkeypatch.setattr(image, "_build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        image.ensure_image(image.find_recipe(), cache=cache)
    assert not list((cache / "images").glob(".tmp-*"))
    monkeypatch.setattr(image, "_build", works)
    got = image.ensure_image(image.find_recipe(), cache=cache)
    assert len(calls) == 1 and got.directory.is_dir()
    assert not list((cache / "images").glob(".tmp-*"))


def test_openeuler_recipe_fails_fast_when_its_repository_is_unreachable(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loopback port nobody listens on: refused at once, no traffic leaves the machine.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(envvars.OPENEULER_REPO.name, f"http://127.0.0.1:{port}/openEuler-24.03-LTS")
    recipe = image.find_recipe("openeuler-24.03")
    start = time.monotonic()
    with pytest.raises(ImageError) as err:
        image.ensure_image(recipe, cache=cache)
    assert time.monotonic() - start < 15
    message = str(err.value)
    assert "openEuler repository unreachable" in message
    assert envvars.OPENEULER_REPO.name in message and "docs/testbed.md" in message
    assert not list((cache / "images").glob(".tmp-*"))


def test_every_shipped_recipe_loads_and_names_existing_hooks() -> None:
    names = image.list_recipes()
    assert {"debian-bookworm", "openeuler-24.03"} <= set(names)
    for name in names:
        recipe = image.find_recipe(name)
        for hook in recipe.hook_paths():
            assert hook.is_file(), hook


def test_unknown_recipe_is_a_clear_error() -> None:
    with pytest.raises(ImageError, match="no recipe named 'nope'"):
        image.find_recipe("nope")


def test_mounts_left_under_the_rootfs_are_found_deepest_first() -> None:
    mountinfo = "\n".join(
        [
            "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
            "90 22 0:5 / /b/.tmp-x/rootfs/dev rw - devtmpfs udev rw",
            "91 90 0:6 / /b/.tmp-x/rootfs/dev/pts rw - devpts none rw",
            "92 22 0:7 / /b/.tmp-x/rootfs/sys ro - sysfs sys ro",
            "93 22 0:8 / /b/.tmp-x/rootfs2/sys ro - sysfs sys ro",
            "94 22 0:9 / /b/.tmp-x/rootfs/with\\040space rw - tmpfs t rw",
        ]
    )
    found = image.mounts_under(Path("/b/.tmp-x/rootfs"), mountinfo)
    assert found[0] == Path("/b/.tmp-x/rootfs/dev/pts")
    assert set(found) == {
        Path("/b/.tmp-x/rootfs/dev/pts"),
        Path("/b/.tmp-x/rootfs/dev"),
        Path("/b/.tmp-x/rootfs/sys"),
        Path("/b/.tmp-x/rootfs/with space"),
    }
