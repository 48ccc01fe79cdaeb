"""The hardware stage, proven against this suite's QEMU node standing in for a UB host.

``python -m obmm.testbed.hw.stage`` is pointed at node 0 of the session cluster (obmm_emu
standing in for obmm.ko) exactly as at hardware: strict known_hosts (the image's host key), the
testbed's key, nothing built or loaded.  It must pass, skip exactly the tests that
``pytest --collect-only -m emulator_only`` lists in the guest (each with the emulator_only
reason), and leave results, junit XML and the node's kernel log in ``results/hw-proof/``.

``make qemu-test`` proves this on a small selection of the guest suite (files that hold both
emulator_only and portable tests); the whole guest suite through the stage is the
``hw_proof`` test, run by ``make hw-proof`` (and so by ``make test`` and CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from obmm.testbed.hw import stage as hwstage
from obmm.testbed.paths import results_dir
from obmm.testbed.settings import scaled
from obmm.testbed.suite.guest_plugin import TESTBED_FABRIC_SKIP, emulator_only_reason
from obmm.testbed.suite.guest_suite import GuestSession

EMULATOR_REASON = emulator_only_reason("hardware")
#: A pre-flight failure ends within this (the machine's pace, so scaled), not after the stage.
PREFLIGHT_BUDGET_S = 15.0
# Skips the guest suite makes on any target when the machine lacks something (not markers).
ENVIRONMENT_SKIPS = {"no free 2 MiB hugetlbfs page"}
# The quick proof's guest files: each holds emulator_only and portable tests.
QUICK_FILES = ("tests/guest/test_lifecycle.py", "tests/guest/test_sysfs.py")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_DECODER"))}


def _stage(
    results: Path,
    node0: dict[str, str],
    *extra: str,
    timeout: float,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    argv = [
        sys.executable,
        "-m",
        "obmm.testbed.hw.stage",
        "--results",
        str(results),
        "--hosts",
        node0["host"],
        "--key",
        node0["key"],
        "--known-hosts",
        node0["known"],
        "--connect-timeout",
        "90",  # a TCG guest beside other guests can take long to log in
        *extra,
    ]
    proc = subprocess.run(
        argv,
        env={**_clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _node0(session: GuestSession, workdir: Path) -> dict[str, str]:
    cluster = session.boot()
    base = hwstage.qemu_stand_in(cluster.name, workdir)
    return {"host": base["hosts"][0], "key": base["ssh_key"], "known": base["known_hosts"]}


def _guest_collect(
    session: GuestSession, *, paths: tuple[str, ...], marker: str | None = None
) -> set[tuple[str, str]]:
    """(classname, name) as junit spells them, of the tests under `paths` that the guest's
    pytest collects (with `marker`, only those it marks so).  One collection of the whole guest
    suite serves every call: the one the guest suite itself made, when it ran in this session."""
    parser = session.collect(["tests/guest"], ["tests/guest/_selftest"])
    assert parser.session_exit is not None and parser.markers
    return {
        _junit_name(n)
        for n in parser.collected
        if n.startswith(tuple(f"{p}::" if p.endswith(".py") else f"{p}/" for p in paths))
        and (marker is None or marker in parser.markers.get(n, ()))
    }


def _junit_name(nodeid: str) -> tuple[str, str]:
    path, *rest = nodeid.split("::")
    classname = ".".join([path.removesuffix(".py").replace("/", "."), *rest[:-1]])
    return classname, rest[-1]


def _wait_guest_pytest_idle(session: GuestSession) -> None:
    # The guest suite of this session ran just before; its pytest may still be finishing.
    deadline = time.monotonic() + 300
    with session.connect(0) as conn:
        while conn.run("pgrep -f obmm.testbed.suite.guest_plugin", timeout=60).ok:
            assert time.monotonic() < deadline, "the guest suite's pytest never finished"
            time.sleep(2)


def test_hw_preflight_failures_end_in_seconds_with_the_reason(
    guest_session: GuestSession, tmp_path: Path
) -> None:
    node0 = _node0(guest_session, tmp_path)
    port = node0["host"].rsplit(":", 1)[1]
    start = time.monotonic()
    rc, out = _stage(tmp_path, node0, "--device", "/dev/obmm-absent", timeout=120)
    assert time.monotonic() - start < scaled(PREFLIGHT_BUDGET_S), out
    assert rc == hwstage.EXIT_PREFLIGHT, out
    assert (
        "hw: pre-flight FAILED: /dev/obmm-absent not present on 127.0.0.1: the OBMM driver is "
        "not loaded (load obmm.ko, e.g. modprobe obmm)"
    ) in out
    start = time.monotonic()
    rc, out = _stage(tmp_path, node0, "--python", "/usr/bin/python3.99", timeout=120)
    assert time.monotonic() - start < scaled(PREFLIGHT_BUDGET_S), out
    assert rc == hwstage.EXIT_PREFLIGHT, out
    assert (
        "hw: pre-flight FAILED: /usr/bin/python3.99 not found on 127.0.0.1 (install python3, "
        "or set HW_PYTHON / python in HW_CONFIG to the interpreter's path)"
    ) in out
    (tmp_path / "empty_known_hosts").write_text("")
    node0["known"] = str(tmp_path / "empty_known_hosts")
    rc, out = _stage(tmp_path, node0, timeout=120)
    assert rc == hwstage.EXIT_PREFLIGHT, out
    assert f"SSH host key unknown: 127.0.0.1:{port} is not in {node0['known']}" in out


def test_hw_stage_on_a_selection_skips_exactly_its_emulator_only_tests(
    guest_session: GuestSession,
) -> None:
    _prove_stage(guest_session, results_dir() / "hw-proof-quick", QUICK_FILES)


@pytest.mark.hw_proof
def test_hw_stage_against_the_qemu_node_skips_exactly_emulator_only(
    guest_session: GuestSession,
) -> None:
    _prove_stage(guest_session, results_dir() / "hw-proof", ("tests/guest",))


def _select_files(paths: tuple[str, ...]) -> dict[str, str]:
    """The environment that makes the stage's guest pytest collect only `paths` (the suite
    file's OBMM_GUEST_PATHS override; nothing for the whole of tests/guest).  Selecting in the
    guest, not with a host -k, spares collecting the other files under TCG."""
    if paths == ("tests/guest",):
        return {}
    return {"OBMM_GUEST_PATHS": " ".join(paths)}


def _prove_stage(guest_session: GuestSession, results: Path, paths: tuple[str, ...]) -> None:
    node0 = _node0(guest_session, results)
    _wait_guest_pytest_idle(guest_session)
    everything = _guest_collect(guest_session, paths=paths)
    emulator_only = _guest_collect(guest_session, paths=paths, marker="emulator_only")
    assert emulator_only and emulator_only < everything
    with guest_session.connect(0) as conn:
        modules_before = conn.run("cat /proc/modules | cut -d' ' -f1", timeout=60).out
        # Compact memory so the hugetlbfs tests are likelier to find their 2 MiB pages (they
        # skip, with that reason, when none is free; ENVIRONMENT_SKIPS).  Not drop_caches: a
        # cold page cache makes the first Python start under TCG take minutes.
        conn.run("echo 1 > /proc/sys/vm/compact_memory", timeout=300)

    # ship_deps=always: the pure-Python pytest archive is what runs the suite, as on a host
    # without pytest (the guest's own pytest 7.2 is shadowed).
    rc, out = _stage(
        results, node0, "--ship-deps", "always", timeout=3 * 3600, env=_select_files(paths)
    )
    (results / "stage-output.txt").write_text(out)
    assert rc == 0, out[-6000:]
    hostdir = results / node0["host"].split("@")[1].replace(":", "_")

    guest = ET.parse(hostdir / "guest-junit.xml").getroot()
    cases = {(c.get("classname", ""), c.get("name", "")): c for c in guest.iter("testcase")}
    assert set(cases) == everything
    skips = {}
    for key, case in cases.items():
        skip = case.find("skipped")
        if skip is not None:
            skips[key] = skip.get("message", "")
    as_emulator = {k for k, why in skips.items() if why == EMULATOR_REASON}
    assert as_emulator == emulator_only
    # testbed_fabric: runs on either testbed driver, needs the testbed's decoder windows
    fabric = _guest_collect(guest_session, paths=paths, marker="testbed_fabric") - emulator_only
    as_fabric = {k for k, why in skips.items() if why == TESTBED_FABRIC_SKIP}
    assert as_fabric == fabric
    others = {k: why for k, why in skips.items() if k not in as_emulator | as_fabric}
    assert set(others.values()) <= ENVIRONMENT_SKIPS, others
    bad = [k for k, c in cases.items() if c.find("failure") is not None or c.find("error")]
    assert bad == []

    host = hwstage.JunitSummary.read(hostdir / "junit.xml")
    assert host.counts == {
        "passed": len(everything) - len(skips),
        "failed": 0,
        "error": 0,
        "skipped": len(skips),
    }
    # The host report repeats the guest's reason ("Skipped: <reason>").
    host_emu = [t for t, why in host.skipped.items() if why == f"Skipped: {EMULATOR_REASON}"]
    assert len(host_emu) == len(emulator_only)
    assert "pytest shipped" in (hostdir / "preflight.txt").read_text()
    assert "module: obmm (the emulator, kmod/obmm_emu, standing in for the real driver)" in out
    dmesg = (hostdir / "dmesg.txt").read_text()
    assert "obmm-hw-test: begin " in dmesg
    assert (hostdir / "dmesg-run.txt").is_file()
    assert "kernel log: clean during the run" in out
    assert len((hostdir / "skipped.txt").read_text().splitlines()) == len(skips)
    with guest_session.connect(0) as conn:
        assert conn.run("ls -d /tmp/obmm-hw.* 2>/dev/null", timeout=60).out == ""
        # Nothing was loaded or unloaded: the host's driver is what is under test.
        assert conn.run("cat /proc/modules | cut -d' ' -f1", timeout=60).out == modules_before
