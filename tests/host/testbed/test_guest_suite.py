"""The guest runner's host-side pieces: event parsing, commands, payload (no VM)."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath

import pytest
from bytecode_probe import bytecode_imports

from obmm.testbed import provision
from obmm.testbed.paths import repo_root
from obmm.testbed.suite import guest_suite
from obmm.testbed.topology import Topology


def _ev(**kw: object) -> bytes:
    return (json.dumps(kw) + "\n").encode()


def _phase(nodeid: str, when: str, outcome: str, **kw: object) -> bytes:
    return _ev(event="report", nodeid=nodeid, when=when, outcome=outcome, **kw)


def test_results_merge_phases_and_survive_split_lines() -> None:
    p = guest_suite.EventParser()
    stream = b"".join([
        _ev(event="collected", nodeids=["a", "b", "c"]),
        _ev(event="start", nodeid="a"),
        _phase("a", "setup", "passed"),
        _phase("a", "call", "passed", sections=[["Captured stdout call", "hi\n"]]),
        _phase("a", "teardown", "failed", longrepr="kernel log guard: WARNING at x"),
        _ev(event="finish", nodeid="a"),
        _ev(event="start", nodeid="b"),
        _phase("b", "setup", "failed", longrepr="fixture broke"),
        _ev(event="finish", nodeid="b"),
        _ev(event="start", nodeid="c"),
    ])  # fmt: skip
    for i in range(0, len(stream), 7):  # arbitrary chunking, as SSH delivers it
        p.feed(stream[i : i + 7])
    assert p.collected == ["a", "b", "c"]
    a, b = p.results["a"], p.results["b"]
    assert a.outcome == "failed" and "[teardown] kernel log guard: WARNING" in a.longrepr
    assert a.sections == [("Captured stdout call", "hi\n")]
    assert b.outcome == "error" and "fixture broke" in b.longrepr
    assert p.finished == {"a", "b"}
    assert p.current == "c"  # what was running if the guest dies now


def test_skip_and_xfail_are_kept_apart() -> None:
    p = guest_suite.EventParser()
    p.feed(_phase("s", "setup", "skipped", longrepr="no device"))
    p.feed(_phase("x", "call", "skipped", wasxfail="known bug"))
    p.feed(_phase("xp", "call", "passed", wasxfail="fixed now"))
    assert (p.results["s"].outcome, p.results["s"].reason) == ("skipped", "no device")
    assert (p.results["x"].outcome, p.results["x"].reason) == ("xfailed", "known bug")
    assert p.results["xp"].outcome == "xpassed"


def test_collect_errors_and_garbage_lines() -> None:
    p = guest_suite.EventParser()
    p.feed(b"not json\n" + _ev(event="collect_error", nodeid="t.py", longrepr="ImportError"))
    p.feed(_ev(event="session_finish", exitstatus=2))
    assert p.collect_errors == {"t.py": "ImportError"}
    assert p.garbage == ["not json"]
    assert p.session_exit == 2


def test_guest_command_maps_events_to_stdout_and_sets_node_env() -> None:
    topo = Topology(nodes=2)
    cmd = guest_suite.guest_pytest_command(
        ["tests/guest/t.py::test_it[a b]"],
        node=1,
        nodes=2,
        topology=topo,
        junit="/r/j.xml",
        timeout_scale=3,
    )
    assert cmd.endswith("3>&1 1>&2")
    words = shlex.split(cmd)
    assert "OBMM_NODE_ID=1" in words and "OBMM_NODES=2" in words
    assert f"OBMM_POOL_BASE={topo.pool_base}" in words
    assert "PYTHONPATH=/opt/obmm-testbed/pylib" in words
    assert "OBMM_TESTBED_TIMEOUT_SCALE=3" in words  # the guest's bounds scale as the host's
    assert "obmm.testbed.suite.guest_plugin" in words
    assert "tests/guest/t.py::test_it[a b]" in words  # quoted, one argument
    assert "--junitxml=/r/j.xml" in words


def test_dev_command_has_the_suite_environment_without_the_event_stream() -> None:
    topo = Topology(nodes=2)
    suite = guest_suite.guest_pytest_command(
        ["t.py"], node=1, nodes=2, topology=topo, driver="real", timeout_scale=3
    )
    dev = guest_suite.guest_pytest_human_command(
        ["t.py"], node=1, nodes=2, topology=topo, driver="real", timeout_scale=3
    )
    suite_words, dev_words = set(shlex.split(suite)), shlex.split(dev)
    env = {w for w in dev_words if w.startswith(("OBMM_", "PYTHON"))}
    # `obmm-testbed dev` runs the guest tests as the suite does, its waits scaled alike
    assert "OBMM_TESTBED_TIMEOUT_SCALE=3" in env and "OBMM_DRIVER=real" in env
    assert env == {w for w in suite_words if w.startswith(("OBMM_", "PYTHON"))} - {
        "OBMM_EVENT_FD=3"
    }
    assert not any(w.startswith("obmm.testbed.suite.guest_plugin") for w in dev_words)


def test_insmod_passes_only_the_fabric_parameters_the_module_declares() -> None:
    topo = Topology(nodes=2, memory_mib=1024, pool_mib=256)
    ko = PurePosixPath("/opt/obmm-testbed/kmod/obmm.ko")
    assert provision.insmod_command(ko, 1, topo, ["node_id", "debug"]) == f"insmod {ko} node_id=1"
    full = provision.insmod_command(ko, 0, topo, ["node_id", "pool_base", "pool_size"])
    assert full == f"insmod {ko} node_id=0 pool_base=0x30000000 pool_size=0x10000000"
    assert provision.insmod_command(ko, 0, topo, []) == f"insmod {ko}"
    # Two UB controllers named as on UB hosts, when the module takes the names.
    with_ubc = provision.insmod_command(ko, 0, topo, ["node_id", "ubc_dev"])
    assert with_ubc == f"insmod {ko} node_id=0 ubc_dev=00001,00002"


def test_testhook_loads_first() -> None:
    order = provision.module_load_order([Path("obmm.ko"), Path("obmm_testhook.ko")])
    assert [p.name for p in order] == ["obmm_testhook.ko", "obmm.ko"]


def test_payload_has_package_tests_selftests_and_modules(tmp_path: Path) -> None:
    ko = tmp_path / "obmm_testhook.ko"
    ko.write_bytes(b"\x7fELF")
    data = provision.payload_tar(repo_root(), [ko])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = set(tar.getnames())
    assert "pylib/obmm/__init__.py" in names
    assert "pylib/obmm/testbed/suite/guest_plugin.py" in names
    assert "tests/guest/test_plumbing.py" in names
    assert "tests/guest/_selftest/test_warn.py" in names
    assert "kmod/obmm_testhook.ko" in names
    assert "tests/c/smoke.c" in names  # C programs the guest tests compile there
    assert "pyproject.toml" in names
    # bytecode: only the package's, for this interpreter, made for the payload (not a stale
    # __pycache__ of the checkout, and none for the tests: pytest rewrites those)
    tag = sys.implementation.cache_tag
    pyc = {n for n in names if "__pycache__" in n or n.endswith(".pyc")}
    assert pyc and all(n.startswith("pylib/obmm/") and n.endswith(f".{tag}.pyc") for n in pyc)
    assert "pylib/obmm/__pycache__/api." + tag + ".pyc" in pyc


def test_unpacked_payload_imports_from_its_bytecode(tmp_path: Path) -> None:
    """A node's interpreter takes the shipped bytecode as is: nothing compiled, none stale;
    and the bindings' declarations come precompiled, pycparser is never imported."""
    with tarfile.open(fileobj=io.BytesIO(provision.payload_tar(repo_root()))) as tar:
        tar.extractall(tmp_path, filter="tar")
    probe = (
        "import sys, obmm.api, obmm.fuzz.engine, obmm.tools.logscan\n"
        "assert obmm.abi.FFI_ORIGIN == 'precompiled', obmm.abi.FFI_ORIGIN\n"
        "assert 'pycparser' not in sys.modules\n"
    )
    found = bytecode_imports(tmp_path, tmp_path / "pylib", probe)
    assert len(found.loaded) >= 5, found.stderr[-2000:]
    assert found.compiled == []
    assert found.stale == []


def test_guest_plugin_streams_events_from_a_real_pytest(tmp_path: Path) -> None:
    # The plugin runs in the guest under Debian's pytest; here the host's pytest stands in.
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok(): print('out')\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='why')\n"
        "def test_skip(): pass\n"
    )
    events = tmp_path / "events"
    cmd = (
        f"{shlex.quote(sys.executable)} -m pytest -p obmm.testbed.suite.guest_plugin"
        " -p no:cacheprovider"
        f" -q {tmp_path / 'test_x.py'} 3>{events}"
    )
    env = {"OBMM_EVENT_FD": "3", "PYTHONPATH": str(repo_root() / "pylib"), "PATH": "/usr/bin:/bin"}
    subprocess.run(["sh", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, check=False)
    p = guest_suite.EventParser()
    p.feed(events.read_bytes())
    outcomes = {n.split("::")[-1]: r.outcome for n, r in p.results.items()}
    assert outcomes == {"test_ok": "passed", "test_bad": "failed", "test_skip": "skipped"}
    bad = next(r for n, r in p.results.items() if n.endswith("test_bad"))
    assert "assert 1 == 2" in bad.longrepr
    assert p.session_exit == 1
    assert len(p.collected) == 3
    # Marker names come with the collection (the hardware-stage proof selects by them).
    by_name = {n.split("::")[-1]: m for n, m in p.markers.items()}
    assert by_name == {"test_ok": [], "test_bad": [], "test_skip": ["skip"]}


def test_guest_plugin_says_alive_while_a_long_test_runs(tmp_path: Path) -> None:
    # A node busy with one long test may take minutes to log a new SSH session in (the host's
    # ping); the stream it already has says the guest still runs (debug-kernel guest suite).
    from obmm.testbed.suite import guest_plugin

    out = io.StringIO()
    events = guest_plugin.EventStream(out)
    events.start_heartbeat(every=0.05)
    events.emit({"event": "start", "nodeid": "t::long"})
    time.sleep(0.5)  # the long test
    events.emit({"event": "finish", "nodeid": "t::long"})
    events.stop_heartbeat()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]  # whole lines only
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "finish"
    assert sum(e["event"] == "alive" for e in lines) >= 3
    p = guest_suite.EventParser()
    before = p.last_event
    time.sleep(0.01)
    p.feed(b'{"event": "alive"}\n')
    assert p.last_event > before and not p.garbage and not p.results


def test_ssh_cli_accepts_options_before_or_after_the_node() -> None:
    from obmm.testbed.cli import main as cli
    from obmm.testbed.cli.commands import split_ssh_args

    parser = cli.build_parser()
    for argv in (
        ["ssh", "--name", "c1", "0", "--", "ls", "-l", "/"],
        ["ssh", "0", "--name", "c1", "--", "ls", "-l", "/"],
    ):
        name, node, _timeout, command = split_ssh_args(parser.parse_args(argv))
        assert (name, node, command) == ("c1", "0", ["ls", "-l", "/"])
    _, node, _, command = split_ssh_args(parser.parse_args(["ssh", "node1", "uname", "-a"]))
    assert (node, command) == ("node1", ["uname", "-a"])
    _, node, _, command = split_ssh_args(parser.parse_args(["ssh", "node1"]))
    assert (node, command) == ("node1", [])


def test_split_by_file_keeps_files_whole_and_balances_their_weights() -> None:
    from obmm.testbed.suite.guest_suite import split_by_file

    ids = [
        "tests/guest/test_a.py::t1",
        "tests/guest/test_b.py::t1",
        "tests/guest/test_b.py::t2",
        "tests/guest/test_c.py::t1",
        "tests/guest/test_a.py::t2",  # a destroys_cluster test sorted last stays last
    ]
    weights = {"tests/guest/test_a.py": 45.0, "tests/guest/test_b.py": 40.0}
    weights["tests/guest/test_c.py"] = 10.0
    first, second = split_by_file(ids, 2, weights)
    # test_a (45, under a share of 47.5: whole) alone; test_b (40) and test_c (10) beside it.
    assert first == ["tests/guest/test_a.py::t1", "tests/guest/test_a.py::t2"]
    assert second == [
        "tests/guest/test_b.py::t1",
        "tests/guest/test_b.py::t2",
        "tests/guest/test_c.py::t1",
    ]
    # No weights: the number of tests; one part: everything in the selection's order.
    assert split_by_file(ids, 1) == [ids]
    assert sorted(len(g) for g in split_by_file(ids, 2)) == [2, 3]
    # More parts than tests: no empty group is returned.
    assert len(split_by_file(ids[:1], 3)) == 1
    with pytest.raises(ValueError):
        split_by_file(ids, 0)


def test_a_file_heavier_than_a_share_is_cut_into_runs_of_its_tests() -> None:
    from obmm.testbed.suite.guest_suite import split_by_file

    heavy = [f"tests/guest/test_h.py::t{i}" for i in range(4)]
    ids = [*heavy, "tests/guest/test_l.py::t0", "tests/guest/test_l.py::t1"]
    # Per-test seconds where known (test_h's last test is the slow one), a file's otherwise.
    weights = {heavy[0]: 10.0, heavy[1]: 10.0, heavy[2]: 10.0, heavy[3]: 90.0}
    weights["tests/guest/test_l.py"] = 40.0
    groups = split_by_file(ids, 2, weights)
    # 160 s over 2 groups: test_h (120) is cut in two runs in its order, t0-t2 (30) and t3 (90);
    # test_l (40) stays whole beside the lighter run.
    assert groups == [
        [heavy[3]],
        [*heavy[:3], "tests/guest/test_l.py::t0", "tests/guest/test_l.py::t1"],
    ]


def test_durations_by_test_are_the_guest_seconds_of_each_test() -> None:
    from obmm.testbed.suite.guest_suite import GuestTestResult, durations_by_test

    results = [
        GuestTestResult("tests/guest/test_a.py::t1", duration=1.5),
        GuestTestResult("tests/guest/test_a.py::K::t2", duration=2.0),
    ]
    assert durations_by_test(results) == {
        "tests/guest/test_a.py::t1": 1.5,
        "tests/guest/test_a.py::K::t2": 2.0,
    }


def test_shard_clusters_are_booted_by_a_thread_that_lives_until_they_are_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's QEMU gets PR_SET_PDEATHSIG, which fires when the *thread* that started it ends:
    the shards' boot thread must outlive their clusters (seen: every shard node killed the
    moment its boot thread returned, "QEMU exited before sshd answered")."""
    import threading

    from obmm.testbed.settings import Settings
    from obmm.testbed.suite import pytest_qemu

    events: list[tuple[str, str, bool]] = []

    def boot(self: guest_suite.GuestSession) -> None:
        events.append(
            ("boot", self.name, threading.current_thread() is not threading.main_thread())
        )

    def close(self: guest_suite.GuestSession) -> None:
        events.append(("close", self.name, shards.thread.is_alive()))

    monkeypatch.setattr(guest_suite.GuestSession, "boot", boot)
    monkeypatch.setattr(guest_suite.GuestSession, "close", close)
    main = guest_suite.GuestSession(
        Settings(name="qemu-test-1"), logdir=tmp_path / "qemu-test-1", results=tmp_path
    )
    shards = pytest_qemu.Shards(main, 3)
    assert [s.name for s in shards.sessions] == ["qemu-test-1-1", "qemu-test-1-2"]
    assert shards.sessions[0].logdir == tmp_path / "qemu-test-1-1"
    shards.thread.start()
    assert shards.ready() == shards.sessions
    assert shards.thread.is_alive()  # booted, and still there
    shards.close()
    assert not shards.thread.is_alive()
    assert events == [
        ("boot", "qemu-test-1-1", True),
        ("boot", "qemu-test-1-2", True),
        ("close", "qemu-test-1-1", True),
        ("close", "qemu-test-1-2", True),
    ]
