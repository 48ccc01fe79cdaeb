"""`obmm-testbed run` without a VM: options, prefixing, the worst status, readiness, deadlines.

The "nodes" are this machine (:class:`obmm.bench.local.LocalNode`, the Node interface with the
same streaming callbacks and deadline as SSH), so the very command lines `run` sends to a guest
(setsid, process-group stop, the /proc/net/tcp port probe) are executed here.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from obmm.bench.local import LocalNode
from obmm.testbed.cli import run
from obmm.testbed.errors import TestbedError
from obmm.testbed.remote import NodeError, RemoteNode, dir_archive, node_env, unpack_on
from obmm.testbed.ssh import Result


class RecordingNode(LocalNode):
    """A node that is this machine (sh, streaming, deadlines), recording each command."""

    def __init__(self, index: int, env: dict[str, str] | None = None) -> None:
        super().__init__(index, env)
        self.commands: list[str] = []

    @property
    def name(self) -> str:
        return f"node{self.index}"

    def run(self, command: str, **kw: Any) -> Result:
        self.commands.append(command)
        return super().run(command, **kw)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    run.add_arguments(p)
    return p.parse_args(argv)


def parse(argv: list[str]) -> run.Plan:
    args = parse_args(argv)
    nodes = run.settings_from(args).nodes
    assert nodes is not None
    return run.make_plan(args, nodes)


def execute(tmp_path: Path, argv: list[str], nodes: int = 2) -> tuple[int, str, str, run.Execution]:
    plan = parse(["--nodes", str(nodes), "--dir", str(tmp_path), *argv])
    addrs = [f"169.254.100.{10 + i}" for i in range(nodes)]
    local = {
        i: RecordingNode(i, node_env(i, nodes, addrs, (f"0x{i + 1}", f"0x{i + 100}")))
        for i in range(nodes)
    }
    out, err = io.BytesIO(), io.BytesIO()
    ex = run.Execution(plan, local, stdout=out, stderr=err)
    status = ex.run()
    return status, out.getvalue().decode(), err.getvalue().decode(), ex


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


# -- options -------------------------------------------------------------------------------------


def test_one_command_runs_on_every_node_by_default(tmp_path: Path) -> None:
    argv = ["--nodes", "3", "--dir", str(tmp_path), "--", "make", "check"]
    plan = parse(argv)
    assert plan.commands == {0: "make check", 1: "make check", 2: "make check"}
    assert plan.dest == PurePosixPath(tmp_path.as_posix())  # the same path in the guests
    assert plan.timeout == run.DEFAULT_TIMEOUT_S
    assert not plan.keep
    assert (run.settings_from(parse_args(argv)).name or "").startswith("run-")


def test_words_after_the_dashes_are_an_argument_vector_and_one_word_a_shell_command(
    tmp_path: Path,
) -> None:
    """`run -- sh -c 'test -c /dev/null && echo ok'` runs sh with two arguments (it used to
    run `sh -c test` with the rest as $0...); a single word stays a shell command."""
    argv = ["--nodes", "1", "--dir", "none", "--", "sh", "-c", "test -c /dev/null && echo ok"]
    plan = parse(argv)
    assert plan.commands == {0: "sh -c 'test -c /dev/null && echo ok'"}
    assert parse(["--nodes", "1", "--dir", "none", "--", "echo a && echo b"]).commands == {
        0: "echo a && echo b"
    }
    status, out, err, _ = execute(
        tmp_path, ["--", "sh", "-c", "test -c /dev/null && echo ok from $OBMM_NODE_ID"]
    )
    assert status == 0, err
    assert "[node0] ok from 0\n" in out and "[node1] ok from 1\n" in out
    status, out, _, _ = execute(tmp_path, ["--", "printf", "%s|", "a b", "c'd"])
    assert "[node0] a b|c'd|" in out


def test_per_node_commands_and_a_service(tmp_path: Path) -> None:
    plan = parse([
        "--dir", str(tmp_path), "--dest", "/work/x", "--node", "0=./exporter --size 4",
        "--node", "node1=./client $OBMM_NODE_ADDRS", "--service", "0", "--ready-port", "7000",
        "--keep", "--timeout", "30", "--name", "mine",
    ])  # fmt: skip
    assert plan.commands == {0: "./exporter --size 4", 1: "./client $OBMM_NODE_ADDRS"}
    assert (plan.service, plan.ready_port, plan.ready_line) == (0, 7000, None)
    assert plan.dest == PurePosixPath("/work/x")
    assert (plan.keep, plan.timeout) == (True, 30.0)


def test_a_node_without_a_command_idles(tmp_path: Path) -> None:
    plan = parse(["--nodes", "3", "--dir", "none", "--node", "2=true"])
    assert plan.commands == {2: "true"}
    assert plan.src is None and plan.workdir == PurePosixPath("/tmp")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dir", "none"], "nothing to run"),
        (["--dir", "none", "--node", "2=x"], "nodes 0..1"),
        (["--dir", "none", "--node", "0"], "expected N=COMMAND"),
        (["--dir", "none", "--node", "a=x"], "expected N=COMMAND"),
        (["--dir", "none", "--node", "0=x", "--node", "0=y"], "given twice"),
        (["--dir", "none", "--service", "0", "--", "x"], "needs --ready-port"),
        (["--dir", "none", "--ready-line", "up", "--", "x"], "need --service"),
        (["--dir", "none", "--node", "0=x", "--service", "1", "--ready-line", "u"], "no command"),
        (["--dir", "none", "--node", "0=x", "--service", "0", "--ready-line", "u"], "no other"),
        (["--dir", "none", "--service", "0", "--ready-port", "70000", "--", "x"], "TCP port"),
        (["--dir", "none", "--nodes", "9", "--", "x"], "1..8"),
        (["--dir", "none", "--timeout", "0", "--", "x"], "positive"),
        (["--dir", "/nonexistent/dir", "--", "x"], "not a directory"),
        (["--dest", "relative", "--", "x"], "absolute"),
    ],
)
def test_bad_options_are_refused_with_the_reason(argv: list[str], message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        parse(argv)


# -- output and status ---------------------------------------------------------------------------


def test_output_is_prefixed_a_whole_line_at_a_time() -> None:
    out = io.BytesIO()
    lines: list[str] = []
    p = run.LinePrefixer("[node1] ", out, threading.Lock(), lines.append)
    p.feed(b"hel")
    assert out.getvalue() == b""  # no half lines
    p.feed(b"lo\r\nwor")
    p.feed(b"ld\n\nlast")
    p.flush()
    assert out.getvalue() == b"[node1] hello\n[node1] world\n[node1] \n[node1] last\n"
    assert lines == ["hello\r", "world", "", "last"]


def test_the_worst_status_wins() -> None:
    assert run.worst_status([0, 0]) == 0
    assert run.worst_status([0, 3, 1]) == 3
    assert run.worst_status([0, -1]) == run.EXIT_GUEST_GONE
    assert run.worst_status([]) == 0


def test_every_node_runs_with_its_identity_and_the_worst_status_is_returned(
    tmp_path: Path,
) -> None:
    cmd = (
        'echo "id=$OBMM_NODE_ID of $OBMM_NODES cna=$OBMM_NODE_CNA eid=$OBMM_NODE_EID '
        'addrs=$OBMM_NODE_ADDRS me=$OBMM_NODE_ADDR pwd=$(pwd)"; echo oops >&2; '
        "exit $((OBMM_NODE_ID * 3))"
    )
    status, out, err, ex = execute(tmp_path, ["--", cmd])
    assert status == 3
    addrs = "169.254.100.10 169.254.100.11"
    for i in (0, 1):
        assert (
            f"[node{i}] id={i} of 2 cna=0x{i + 1} eid=0x{i + 100} addrs={addrs} "
            f"me=169.254.100.{10 + i} pwd={tmp_path}\n" in out
        )
        assert f"[node{i}] oops\n" in err
    # Nothing left in /tmp: the pidfiles go with their commands.
    assert not list(Path("/tmp").glob(f"obmm-run-{ex.token}-*"))


def test_the_service_starts_first_and_is_stopped_when_the_others_end(tmp_path: Path) -> None:
    flag = tmp_path / "served"
    service = f"sleep 0.5; echo $$ > {flag}; echo 'listening now'; exec sleep 300"
    status, out, err, ex = execute(tmp_path, [
        "--node", f"0={service}", "--node", f"1=cat {flag} >/dev/null && echo got it",
        "--service", "0", "--ready-line", "listening",
    ])  # fmt: skip
    assert status == 0, err
    assert "[node1] got it\n" in out  # the client started only after the service was ready
    assert "[node0] listening now\n" in out
    assert "node0: service ready" in err
    assert ex.outcomes[0].stopped
    pid = int(flag.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "the service's processes were not stopped"


def test_a_ready_port_waits_until_the_service_listens(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (
        f'{sys.executable} -c "import socket,time; time.sleep(0.7); s=socket.socket(); '
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); c,_=s.accept(); c.sendall(b'pattern ok'); "
        'c.close(); time.sleep(300)"'
    )
    client = (
        f"{sys.executable} -c \"import socket; s=socket.create_connection(('127.0.0.1', {port})); "
        'print(s.recv(100).decode())"'
    )
    status, out, err, _ = execute(tmp_path, [
        "--node", f"0={server}", "--node", f"1={client}", "--service", "0",
        "--ready-port", str(port),
    ])  # fmt: skip
    assert status == 0, err
    assert "[node1] pattern ok\n" in out


def test_a_service_that_ends_before_it_is_ready_fails_the_run(tmp_path: Path) -> None:
    marker = tmp_path / "client-ran"
    status, _, err, ex = execute(tmp_path, [
        "--node", "0=echo cannot bind; exit 7", "--node", f"1=touch {marker}",
        "--service", "0", "--ready-line", "listening",
    ])  # fmt: skip
    assert status == 7
    assert "ended (exit 7) before it was ready" in err
    assert not marker.exists() and not ex.outcomes[1].started


def test_a_service_that_fails_while_the_others_run_counts(tmp_path: Path) -> None:
    status, _, err, _ = execute(tmp_path, [
        "--node", "0=echo ready; sleep 0.3; exit 5", "--node", "1=sleep 1.5",
        "--service", "0", "--ready-line", "ready",
    ])  # fmt: skip
    assert status == 5, err


def test_a_hanging_command_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pid"
    start = time.monotonic()
    status, _, err, ex = execute(tmp_path, [
        "--timeout", "1.5", "--node", f"0=sleep 300 & echo $! > {pidfile}; wait",
        "--node", "1=echo fine",
    ])  # fmt: skip
    elapsed = time.monotonic() - start
    assert status == run.EXIT_TIMEOUT
    assert ex.outcomes[0].timed_out and ex.outcomes[1].status == 0
    assert "node0: stopped at the 2 s deadline" in err
    assert elapsed < 1.5 + run.STOP_GRACE_S
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "the hanging command's child still runs"
    assert not list(Path("/tmp").glob(f"obmm-run-{ex.token}-*"))


def test_a_service_never_ready_is_stopped_and_the_others_never_start(tmp_path: Path) -> None:
    status, _, err, ex = execute(tmp_path, [
        "--ready-timeout", "0.5", "--node", "0=exec sleep 300", "--node", "1=true",
        "--service", "0", "--ready-line", "never",
    ])  # fmt: skip
    assert status == run.EXIT_TIMEOUT
    assert "was not ready in time" in err and not ex.outcomes[1].started


# -- the directory ----------------------------------------------------------------------------


def test_the_directory_goes_to_every_node_as_one_archive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.c").write_text("int main(void) { return 0; }\n")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "sub" / "run.sh").chmod(0o755)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    data, files = dir_archive(src, run.DEFAULT_EXCLUDES)
    assert files == 2
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert not any(".git" in n for n in tar.getnames())
    nodes = [RecordingNode(i) for i in range(2)]
    dest = tmp_path / "dest"
    unpack_on(nodes, data, PurePosixPath(dest.as_posix()))
    assert (dest / "a.c").read_text() == (src / "a.c").read_text()
    assert os.access(dest / "sub" / "run.sh", os.X_OK)
    assert all(len(n.commands) == 1 for n in nodes)  # one round trip per node


def test_a_failed_copy_names_the_node(tmp_path: Path) -> None:
    with pytest.raises(NodeError, match="node0: copying the directory failed"):
        unpack_on([RecordingNode(0)], b"not a tar", PurePosixPath((tmp_path / "d").as_posix()))


def test_the_identity_is_read_from_the_controller_sysfs() -> None:
    class Fake(RemoteNode):
        def run(self, command: str, **kw: object) -> Result:
            assert "ub_bus_controller*/*/ubc" in command
            return Result(command, 0, b"0x10\n0x1234\n", b"", 0.0)

    assert Fake(0, "node0").read_identity() == ("0x10", "0x1234")


def test_an_interrupted_run_says_so_in_one_line_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM in the middle of a run: the cluster's teardown runs (the finally blocks), then
    one line and status 130, not a traceback."""

    def interrupted(plan: object, settings: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    monkeypatch.setattr(run, "_run", interrupted)
    p = argparse.ArgumentParser()
    run.add_arguments(p)
    args = p.parse_args(["--nodes", "1", "--dir", "none", "--", "true"])
    t0 = time.monotonic()
    assert run.command(args) == run.EXIT_INTERRUPTED == 130
    assert time.monotonic() - t0 < 4
    err = capsys.readouterr().err
    assert err.strip() == "obmm-testbed run: interrupted (signal 15); the cluster is stopped"


def test_kernel_allow_names_the_reports_the_run_expects() -> None:
    """`make fuzz` runs the fuzzer with --kernel-allow fault-injection: the kernel's own WARN
    on an injected failure is then no kernel report of the run; by default nothing is."""
    from obmm.fuzz import faults

    assert parse(["--", "true"]).kernel_allow == ()
    plan = parse(["--kernel-allow", "fault-injection", "--", "true"])
    assert plan.kernel_allow == faults.ALLOW
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse_args(["--kernel-allow", "anything", "--", "true"])
