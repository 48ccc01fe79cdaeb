"""--ubs-mem: a user's ubs-mem build refused in one line when incomplete, and on nodes (faked
here) the order of the bring-up: our library and services, the build, ubsmd, the SDK's answer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from obmm.testbed import ubsmem
from obmm.testbed.settings import Settings
from obmm.testbed.ssh import Result


def ubs_mem_build(root: Path) -> Path:
    prefix = root / "ubs_mem"
    for rel in ("bin/ubsmd", "lib/libubsm_sdk.so.1", "include/ubs_mem.h"):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("x")
    return prefix


def test_an_incomplete_build_is_refused_in_one_line_naming_what_is_missing(
    tmp_path: Path,
) -> None:
    prefix = ubs_mem_build(tmp_path)
    ubsmem.check_prefix(prefix)
    (prefix / "bin" / "ubsmd").unlink()
    (prefix / "lib" / "libubsm_sdk.so.1").unlink()
    with pytest.raises(ubsmem.UbsMemError) as info:
        ubsmem.check_prefix(prefix)
    message = str(info.value)
    assert "\n" not in message
    assert (
        "bin/ubsmd (the daemon)" in message and "lib/libubsm_sdk.so* (the SDK library)" in message
    )
    assert "include" not in message.split(";")[0]
    with pytest.raises(ubsmem.UbsMemError, match="not a directory"):
        ubsmem.check_prefix(tmp_path / "nope")


def test_the_setting_comes_from_the_flag_or_the_environment() -> None:
    assert Settings.from_env({}).ubs_mem is None
    assert Settings.from_env({"OBMM_TESTBED_UBS_MEM": "/opt/ubs"}).ubs_mem == "/opt/ubs"


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_"))}
    env.update(OBMM_TESTBED_RUN_ROOT=str(tmp_path / "run"), OBMM_TESTBED_CACHE=str(tmp_path / "c"))
    return subprocess.run(
        [sys.executable, "-m", "obmm.testbed.cli.main", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_up_refuses_a_missing_build_before_anything_boots(tmp_path: Path) -> None:
    proc = cli(tmp_path, "up", "--kmod", "--name", "u", "--ubs-mem", str(tmp_path / "none"))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("obmm-testbed: --ubs-mem ") and "not a directory" in line


def test_up_without_the_driver_says_ubs_mem_needs_it(tmp_path: Path) -> None:
    proc = cli(tmp_path, "up", "--name", "u", "--ubs-mem", str(ubs_mem_build(tmp_path)))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert "--ubs-mem needs the driver loaded" in line


class FakeNode:
    """What provision() asks of a node, recorded; the SDK probe fails `probe_fails` times."""

    def __init__(self, index: int, log: list[str], probe_fails: int = 0) -> None:
        self.index = index
        self.name = f"node{index}"
        self.addr = f"169.254.0.{10 + index}"
        self.log = log
        self.probe_fails = probe_fails
        self.puts: list[tuple[Path, PurePosixPath]] = []

    def run(self, command: str, *, timeout: float = 0, check: bool = False) -> Result:
        self.log.append(f"{self.name}: {command}")
        status = 0
        if command.endswith("ubsm_probe"):
            status = 1 if self.probe_fails else 0
            self.probe_fails -= 1
        return Result(command, status, b"ubsmem_initialize: 6050\n" if status else b"", b"", 0.0)

    def put(self, local: Path, remote: PurePosixPath) -> None:
        self.puts.append((local, PurePosixPath(remote)))


@pytest.fixture
def log() -> Iterator[list[str]]:
    yield []


def test_provision_brings_up_ubse_then_the_build_then_waits_for_the_sdk(
    tmp_path: Path, log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ubsmem.time, "sleep", lambda s: None)
    prefix = ubs_mem_build(tmp_path)
    nodes = [FakeNode(0, log), FakeNode(1, log, probe_fails=2)]
    ubsmem.provision(nodes, prefix, block_mib=4)  # type: ignore[arg-type]
    mine = {n.name: [c.split(": ", 1)[1] for c in log if c.startswith(n.name)] for n in nodes}
    for commands in mine.values():
        text = "\n".join(commands)
        # our library first, where ubsmd loads it; then the service; then the build and ubsmd
        assert text.index(str(ubsmem.UBSE_LIB)) < text.index("obmm.ubse serve")
        assert text.index("obmm.ubse serve") < text.index(
            f"mv {ubsmem.WORK}/stage {ubsmem.UBSMEM_ROOT}"
        )
        ubsmd = text.index("bin/ubsmd -binpath=/usr/local/ubs_mem")
        assert ubsmd < text.rindex(f"{ubsmem.WORK}/ubsm_probe")
        assert "--block-mib 4" in text
    assert "--master" not in "\n".join(mine["node0"])
    assert "--master 169.254.0.10" in "\n".join(mine["node1"])
    assert all(n.puts == [(prefix, ubsmem.WORK / "stage")] for n in nodes)
    assert sum(c.endswith("ubsm_probe") for c in mine["node1"]) == 3  # until it answered


def test_an_sdk_that_never_answers_is_one_line_with_its_last_words(log: list[str]) -> None:
    node = FakeNode(0, log, probe_fails=1000)
    with pytest.raises(ubsmem.UbsMemError) as info:
        ubsmem.wait_sdk(node, within=0)  # type: ignore[arg-type]
    assert "node0: the ubs-mem SDK did not answer" in str(info.value)
    assert "6050" in str(info.value)


def test_the_wait_for_a_file_succeeds_when_it_appears_and_fails_when_it_does_not(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "ready"
    later = subprocess.Popen(["sh", "-c", f"sleep 0.5; touch {flag}"])
    wait = ubsmem.wait_file_command(PurePosixPath(flag), 10)
    assert subprocess.run(["sh", "-c", wait], timeout=30).returncode == 0
    later.wait()
    never = ubsmem.wait_file_command(PurePosixPath(tmp_path / "never"), 0.4)
    assert subprocess.run(["sh", "-c", never], timeout=30).returncode == 1
