"""Every `obmm-testbed` testbed subcommand fails the same way: one line on stderr, exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obmm.bench.measure import BenchError
from obmm.testbed import errors, progress, provision, settings, ssh
from obmm.testbed.builds import elfcheck, image, kbuild, kunitbuild, urmabuild
from obmm.testbed.cli import main as cli
from obmm.testbed.cli import run
from obmm.testbed.hw import config as hwconfig
from obmm.testbed.stages import kunitguest, matrix, patchcheck
from obmm.testbed.suite import guest_suite
from obmm.testbed.topology import TopologyError
from obmm.testbed.vm.cluster import ClusterError

# Each one provokes a real failure, cheaply: nothing boots, builds or downloads.
PROVOKED = {
    "up": ["up", "--topology", "nosuch"],
    "down": ["down", "--name", "nosuch"],
    "status": ["status", "--name", "nosuch"],
    "numa": ["numa", "--name", "nosuch"],
    "ssh": ["ssh", "--name", "nosuch", "0", "--", "true"],
    "cp": ["cp", "--name", "nosuch", "/etc/hostname", "0:/tmp"],
    "console": ["console", "--name", "nosuch", "0"],
    "image": ["image", "--recipe", "nosuch"],
    "kmod": ["kmod", "--release", "0.0.0-nosuch"],
    "kmod-matrix": ["kmod-matrix", "--cell", "nosuch"],
    "hw-test": ["hw-test"],
    "hw-preflight": ["hw-preflight"],
    "patch-check": ["patch-check", "--series-dir", "/nonexistent/series"],
    "bench": ["bench", "--skip-cold-image"],
    "snapshot": ["snapshot", "list"],
    "run": ["run", "--nodes", "2", "--dir", "/nonexistent/dir", "--", "true"],
}
EXPECTED = {
    "up": "cannot read topology",
    "image": "no recipe named 'nosuch'",
    "kmod": "0.0.0-nosuch",
    "kmod-matrix": "unknown matrix cell 'nosuch'",
    "hw-test": "no hardware hosts",
    "hw-preflight": "no hardware hosts",
    "patch-check": "no such series directory",
    "bench": "no recipe named",
    "snapshot": "OBMM_TESTBED_SNAPSHOT='sometimes'",
    "run": "--dir /nonexistent/dir: not a directory",
}


@pytest.mark.parametrize("name", sorted(PROVOKED))
def test_a_subcommand_fails_with_one_line_and_status_2(name: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_"))}
    env.update(OBMM_TESTBED_RUN_ROOT=str(tmp_path / "run"), OBMM_TESTBED_CACHE=str(tmp_path / "c"))
    if name == "bench":
        env["OBMM_TESTBED_ROOT"] = str(tmp_path)  # a tree without recipes
    if name == "snapshot":
        env["OBMM_TESTBED_SNAPSHOT"] = "sometimes"
    proc = subprocess.run(
        [sys.executable, "-m", "obmm.testbed.cli.main", *PROVOKED[name]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("obmm-testbed: ")
    assert EXPECTED.get(name, "no cluster named 'nosuch'") in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_multi_line_error_prints_its_first_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(args: object) -> int:
        raise kbuild.BuildWarningsError("obmm_emu", ["w1", "w2"], "a.c:1: warning: x\nb.c:2: y")

    monkeypatch.setattr(matrix, "command", fail)
    assert cli.main(["kmod-matrix"]) == errors.EXIT_TESTBED_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == ["obmm-testbed: obmm_emu: build printed 2 warning(s) (W=1, warnings are errors):"]


@pytest.mark.parametrize(
    ("cls", "older"),
    [
        (image.ImageError, RuntimeError),
        (kbuild.KbuildError, RuntimeError),
        (matrix.MatrixError, kbuild.KbuildError),
        (ClusterError, RuntimeError),
        (progress.StepFailed, RuntimeError),
        (ssh.SshError, RuntimeError),
        (guest_suite.RunnerError, RuntimeError),
        (provision.ProvisionError, RuntimeError),
        (TopologyError, ValueError),
        (hwconfig.ConfigError, ValueError),
        (BenchError, RuntimeError),
        (run.RunError, ValueError),
        (elfcheck.ModuleCheckError, Exception),
        (patchcheck.CheckError, Exception),
        (kunitbuild.KunitBuildError, RuntimeError),
        (kunitguest.KunitGuestError, RuntimeError),
        (urmabuild.UrmaBuildError, RuntimeError),
    ],
)
def test_testbed_errors_share_one_base_and_keep_their_old_one(cls: type, older: type) -> None:
    assert issubclass(cls, errors.TestbedError)
    assert issubclass(cls, older)


def _wait_for_builder(proc: subprocess.Popen[str] | subprocess.Popen[bytes], pidfile: Path) -> None:
    """Until the fake image builder has written its pid: an event, not a fixed time, since
    how long the command takes to get there depends on how busy the machine is."""
    deadline = time.monotonic() + settings.scaled(300)
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None, f"the command exited {proc.returncode} before building"
        assert time.monotonic() < deadline, "the command never started the image builder"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("entry", "prog"),
    [
        (["obmm.testbed.cli.main", "bench"], "obmm-testbed"),
        (["obmm.bench"], "python -m obmm.bench"),
    ],
)
def test_sigterm_during_a_command_unwinds_says_so_and_leaves_no_scratch(
    tmp_path: Path, entry: list[str], prog: str
) -> None:
    """`obmm-testbed bench` (and `python -m obmm.bench`) stopped by SIGTERM while its
    throw-away image cache is being built (a CI job cancelled): the scratch cache is removed,
    the image builder is gone, one line says why, exit status 130.  Before, the process died
    at once and left the cache in $TMPDIR."""
    fake_bin, scratch = tmp_path / "bin", tmp_path / "tmp"
    fake_bin.mkdir()
    scratch.mkdir()
    pidfile = tmp_path / "mmdebstrap.pid"
    fake = fake_bin / "mmdebstrap"
    fake.write_text(f'#!/bin/sh\necho $$ > "{pidfile}"\nexec sleep 60\n')
    fake.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PATH=f"{fake_bin}:{env['PATH']}",
        TMPDIR=str(scratch),
        OBMM_TESTBED_CACHE=str(tmp_path / "cache"),
    )
    argv = [sys.executable, "-m", *entry, "--suites-only", "--no-plots"]
    proc = subprocess.Popen(
        [*argv, "--out", str(tmp_path / "out")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_builder(proc, pidfile)
        assert list(scratch.glob("obmm-scratch-*-bench-cache-*")), "no throw-away cache"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=settings.scaled(120))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == errors.EXIT_INTERRUPTED, err
    assert err.splitlines()[-1] == f"{prog}: interrupted (signal 15)", err
    assert not list(scratch.iterdir()), list(scratch.iterdir())
    # Gone once its new parent (init) has reaped it: a moment on a loaded machine.
    builder = int(pidfile.read_text())
    deadline = time.monotonic() + settings.scaled(10)
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.kill(builder, 0)
            time.sleep(0.05)


def test_a_killed_commands_scratch_is_removed_by_the_next_command(tmp_path: Path) -> None:
    """SIGKILL (an OOM kill) leaves the bench's throw-away cache in $TMPDIR; the next
    obmm-testbed command removes it (it is named after its dead owner), and leaves the
    scratch of a live process alone."""
    fake_bin, scratch = tmp_path / "bin", tmp_path / "tmp"
    fake_bin.mkdir()
    scratch.mkdir()
    pidfile = tmp_path / "mmdebstrap.pid"
    fake = fake_bin / "mmdebstrap"
    fake.write_text(f'#!/bin/sh\necho $$ > "{pidfile}"\nexec sleep 60\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", TMPDIR=str(scratch),
               OBMM_TESTBED_CACHE=str(tmp_path / "cache"),
               OBMM_TESTBED_RUN_ROOT=str(tmp_path / "shm"))  # fmt: skip
    argv = [sys.executable, "-m", "obmm.testbed.cli.main", "bench", "--suites-only", "--no-plots"]
    proc = subprocess.Popen([*argv, "--out", str(tmp_path / "out")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for_builder(proc, pidfile)
        left = list(scratch.glob("obmm-scratch-*"))
        assert left
    finally:
        proc.kill()
        proc.wait()
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the builder, orphaned
    alive = scratch / f"obmm-scratch-{os.getpid()}.0-live-x"  # this process: alive
    alive.mkdir()
    assert all(p.exists() for p in left)
    out = subprocess.run([sys.executable, "-m", "obmm.testbed.cli.main", "gc"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    assert f"scratch {left[0]}: its owner died; removed" in out
    assert not any(p.exists() for p in left) and alive.exists()
