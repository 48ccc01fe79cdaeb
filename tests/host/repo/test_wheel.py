"""The wheel (`make dist`) works outside the checkout: installed into a fresh venv in a temp
directory, its `obmm-testbed` runs, `doctor` reports, and the package data resolves."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheel_venv import CHECKOUT, block_pytest, build_wheel, install

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    work = tmp_path_factory.mktemp("wheel")
    assert CHECKOUT not in work.parents
    wheel = build_wheel(work)
    yield wheel, install(wheel, work / "venv"), work


def env_outside(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OBMM_", "XDG_", "PYTHON"))}
    env.update(XDG_CACHE_HOME=str(work / "xdg-cache"), XDG_DATA_HOME=str(work / "xdg-data"))
    return env


def run_in(work: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    cwd = work / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        argv, cwd=cwd, env=env_outside(work), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_the_wheel_carries_sources_not_build_output(installed: tuple[Path, Path, Path]) -> None:
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    data = "obmm/_data/"
    for wanted in (
        "kmod/obmm_emu/core.c", "kmod/obmm_emu/Kbuild", "kmod/obmm_testhook/obmm_testhook.c",
        "qemu/debian/bookworm.json", "qemu/debian/customize.sh", "qemu/topologies/pair.json",
        "uapi/ub/obmm.h", "tests/guest/conftest.py", "examples/c/obmm_handle.h", "pyproject.toml",
    ):  # fmt: skip
        assert data + wanted in names, wanted
    assert not [n for n in names if n.endswith((".ko", ".o", ".pyc")) or "/results/" in n]
    assert "obmm/testbed/cli/run.py" in names and "obmm/bench/memprobe.c" in names


def test_the_installed_command_runs_from_any_directory(
    installed: tuple[Path, Path, Path],
) -> None:
    _, bin_dir, work = installed
    proc = run_in(work, [str(bin_dir / "obmm-testbed"), "--help"])
    assert proc.returncode == 0, proc.stderr
    for sub in ("up", "run", "doctor", "kmod", "ssh"):
        assert sub in proc.stdout
    proc = run_in(work, [str(bin_dir / "obmm-testbed"), "run", "--help"])
    assert proc.returncode == 0 and "--ready-port" in proc.stdout


def test_without_pytest_every_command_is_there_and_one_line_names_what_is_missing(
    installed: tuple[Path, Path, Path],
) -> None:
    """A wheel installed without the test extra: every subcommand is still listed (they
    vanished when an import of pytest failed), and a command that needs pytest says so in one
    line with the extra that brings it."""
    wheel, _, work = installed
    bin_dir = install(wheel, work / "venv-without-pytest")
    block_pytest(bin_dir.parent)
    probe = run_in(work, [str(bin_dir / "python"), "-c", "import pytest"])
    assert "No module named 'pytest'" in probe.stderr
    proc = run_in(work, [str(bin_dir / "obmm-testbed"), "--help"])
    assert proc.returncode == 0, proc.stderr
    for sub in ("up", "run", "doctor", "down", "ssh", "kmod", "hw-test", "bench"):
        assert f"    {sub}" in proc.stdout, sub
    proc = run_in(work, [str(bin_dir / "obmm-testbed"), "hw-test", "--hosts", "root@127.0.0.1"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "obmm-testbed hw-test: needs the Python package 'pytest' (pip install 'obmm-testbed[test]')"
    )


def test_doctor_reports_each_check_with_a_verdict(installed: tuple[Path, Path, Path]) -> None:
    _, bin_dir, work = installed
    proc = run_in(work, [str(bin_dir / "obmm-testbed"), "doctor"])
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.strip().splitlines()
    checks = lines[:-1]
    assert {line.split()[1].rstrip(":") for line in checks} >= {
        "qemu", "mmdebstrap", "compiler", "kvm", "memory", "cache", "sources",
    }  # fmt: skip
    assert all(line.split()[0] in ("OK", "WARN", "FAIL") for line in checks)
    failed = [line for line in checks if line.startswith("FAIL")]
    assert proc.returncode == (1 if failed else 0)
    # The installed package's own sources, found from the package data.
    (sources,) = [line for line in checks if " sources: " in line]
    assert sources.startswith("OK") and "site-packages/obmm/_data" in sources


def test_package_data_resolves_and_nothing_is_written_into_site_packages(
    installed: tuple[Path, Path, Path],
) -> None:
    _, bin_dir, work = installed
    probe = """
import json, obmm
from obmm.testbed import paths, provision
from obmm.testbed.builds.image import find_recipe
import io, tarfile
names = tarfile.open(fileobj=io.BytesIO(provision.payload_tar(paths.repo_root()))).getnames()
print(json.dumps({
    "obmm": obmm.__file__, "root": str(paths.repo_root()), "checkout": str(paths.checkout_root()),
    "kmod": str(paths.kmod_dir()), "qemu": str(paths.qemu_dir()), "cache": str(paths.cache_dir()),
    "results": str(paths.results_dir()), "recipe": str(find_recipe().path),
    "payload": names,
}))
"""
    proc = run_in(work, [str(bin_dir / "python"), "-c", probe])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    site = Path(got["obmm"]).parent
    assert str(work / "venv") in got["obmm"] and str(CHECKOUT) not in proc.stdout
    assert got["checkout"] == "None"
    assert Path(got["root"]) == site / "_data"
    assert (Path(got["kmod"]) / "obmm_emu" / "core.c").is_file()
    assert (Path(got["qemu"]) / "topologies" / "pair.json").is_file()
    assert Path(got["recipe"]) == site / "_data" / "qemu" / "debian" / "bookworm.json"
    # The recipe hashes as in the checkout, so the installed testbed reuses a cached image.
    assert Path(got["recipe"]).read_bytes() == (CHECKOUT / "qemu/debian/bookworm.json").read_bytes()
    assert got["cache"] == str(work / "xdg-cache" / "obmm-testbed")
    assert got["results"] == str(work / "xdg-data" / "obmm-testbed" / "results")
    payload = got["payload"]
    for wanted in ("pylib/obmm/api.py", "uapi/ub/obmm.h", "tests/guest/conftest.py",
                   "examples/c/obmm_handle.h", "pyproject.toml"):  # fmt: skip
        assert wanted in payload, wanted
    assert not [n for n in payload if n.startswith("pylib/obmm/_data")]
