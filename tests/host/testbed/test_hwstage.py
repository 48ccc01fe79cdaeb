"""The hardware stage without hardware: configuration, SSH policy and pre-flight checks.

The pre-flight runs against an in-process paramiko server on loopback that executes commands
with this machine's /bin/sh, so "no /dev/obmm", "no python3" or "no decoder" are set up by
pointing the checks at a wrong device path or interpreter.  The whole stage against a QEMU
guest standing in for hardware is tests/qemu/test_hw_stage.py.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import paramiko
import pytest
from bytecode_probe import bytecode_imports

from obmm import envvars
from obmm.testbed.hw import config as hwconfig
from obmm.testbed.hw import preflight as hwpreflight
from obmm.testbed.hw import stage as hwstage
from obmm.testbed.hw.config import ConfigError, HwConfig, HwHost
from obmm.testbed.suite.guest_plugin import emulator_only_reason

# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "user", "host", "port", "label"),
    [
        ("root@ub1", "root", "ub1", 22, "ub1"),
        ("alice@10.0.0.5:2222", "alice", "10.0.0.5", 2222, "10.0.0.5_2222"),
        ("ub2", "root", "ub2", 22, "ub2"),
        ("bob@[fe80::1]:22", "bob", "fe80::1", 22, "fe80__1"),
    ],
)
def test_host_entries_parse(text: str, user: str, host: str, port: int, label: str) -> None:
    h = HwHost.parse(text)
    assert (h.user, h.host, h.port, h.label) == (user, host, port, label)
    assert HwHost.parse(h.spec) == h


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root@", "bad host entry 'root@': expected user@host[:port]"),
        ("root@h:99999", "bad host entry 'root@h:99999': port 99999 out of range"),
        ("a b@c", "bad host entry 'a b@c': expected user@host[:port]"),
    ],
)
def test_bad_host_entries_say_why(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        HwHost.parse(text)
    assert str(exc.value) == message


def test_config_file_simple_format_then_env_then_overrides(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("k")
    cfg = tmp_path / "hw.toml"
    cfg.write_text(
        "# UB lab\n[hw]\n"
        'hosts = ["root@ub1", "root@ub2:2200"]\n'
        f'ssh_key = "{key}"\n'
        'decoder = "cmd:/usr/local/bin/ub-decoder --json"\n'
        "python = /usr/bin/python3.11  # the system one\n"
        "connect_timeout = 4\n"
    )
    config = hwconfig.load({"HW_CONFIG": str(cfg), "HW_PYTHON": "/opt/py/bin/python3"})
    assert [h.spec for h in config.hosts] == ["root@ub1", "root@ub2:2200"]
    assert config.key_path() == key
    assert config.decoder == "cmd:/usr/local/bin/ub-decoder --json"
    assert config.python == "/opt/py/bin/python3"  # the environment wins over the file
    assert config.connect_timeout == 4.0
    config = hwconfig.load({"HW_CONFIG": str(cfg)}, {"hosts": "root@ub3", "python": None})
    assert [h.spec for h in config.hosts] == ["root@ub3"]
    assert config.python == "/usr/bin/python3.11"


def test_config_file_json_and_round_trip(tmp_path: Path) -> None:
    cfg = tmp_path / "hw.json"
    cfg.write_text(
        '{"hosts": ["root@a:1022", "b"], "decoder": "file:/etc/ub/windows.json", '
        '"fabric_addrs": ["10.0.0.1", "10.0.0.2"]}'
    )
    config = hwconfig.load({"HW_CONFIG": str(cfg)})
    assert config.fabric_addrs == ("10.0.0.1", "10.0.0.2")
    assert HwConfig.from_json(config.to_json()) == config


def test_fabric_addresses_default_to_the_ssh_hosts_and_must_match_them() -> None:
    config = hwconfig.load({"HW_HOSTS": "root@ub1,root@ub2:2200"})
    assert [config.fabric_addr(i) for i in (0, 1)] == ["ub1", "ub2"]
    config = hwconfig.load({"HW_HOSTS": "root@ub1,ub2", "HW_FABRIC_ADDRS": "10.9.0.1, 10.9.0.2"})
    assert [config.fabric_addr(i) for i in (0, 1)] == ["10.9.0.1", "10.9.0.2"]
    cluster = hwstage.HwCluster(replace(config, decoder="cmd:ub-decoder"))
    assert [n.addr for n in cluster.nodes] == ["10.9.0.1", "10.9.0.2"]
    assert cluster.node_env(1) == {
        "OBMM_NODE_ID": "1",
        "OBMM_TARGET": "hardware",
        "OBMM_DECODER": "cmd:ub-decoder",
    }
    with pytest.raises(ConfigError) as exc:
        hwconfig.load({"HW_HOSTS": "ub1,ub2", "HW_FABRIC_ADDRS": "10.9.0.1"})
    assert str(exc.value) == (
        "fabric_addrs has 1 address(es) for 2 host(s): give one per host, in the same order"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no hardware hosts: set HW_HOSTS=user@host1,user@host2 or hosts in HW_CONFIG"),
        (
            {"HW_HOSTS": "a", "HW_HOST_KEY_POLICY": "yolo"},
            "host_key_policy 'yolo': use one of strict, accept-new, off",
        ),
        (
            {"HW_HOSTS": "a", "OBMM_DECODER": "magic"},
            "decoder 'magic': use cmd:PROGRAM ARGS or file:PATH (see pylib/obmm/decoder.py)",
        ),
        (
            {"HW_HOSTS": "a", "HW_SSH_KEY": "/nonexistent/key"},
            "ssh_key /nonexistent/key: no such file",
        ),
        ({"HW_HOSTS": "a,root@a"}, "duplicate hosts in root@a, root@a"),
        (
            {"HW_CONFIG": "/nonexistent.toml"},
            "HW_CONFIG /nonexistent.toml: No such file or directory",
        ),
    ],
)
def test_config_errors_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        hwconfig.load(env)
    assert str(exc.value) == message


def test_unknown_config_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "hw.toml"
    cfg.write_text("hosts = a\nhots = b\n")
    with pytest.raises(ConfigError, match=r"^unknown config key\(s\): hots$"):
        hwconfig.load({"HW_CONFIG": str(cfg)})


# -- an sshd that runs commands on this machine ---------------------------------------------


class _Server(paramiko.ServerInterface):
    def __init__(self, authorized: paramiko.PKey) -> None:
        self.authorized = authorized
        self.commands: list[str] = []

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key.asbytes() == self.authorized.asbytes()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.commands.append(command.decode())
        threading.Thread(target=_execute, args=(channel, command.decode()), daemon=True).start()
        return True


def _execute(chan: paramiko.Channel, command: str) -> None:
    data = b""
    while not chan.eof_received:
        got = chan.recv(65536)
        if not got:
            break
        data += got
    proc = subprocess.run(["/bin/sh", "-c", command], input=data, capture_output=True)
    chan.sendall(proc.stdout)
    chan.sendall_stderr(proc.stderr)
    chan.send_exit_status(proc.returncode)
    chan.close()


@dataclass
class LocalSshd:
    port: int
    key_file: Path
    host_key: paramiko.PKey
    known_hosts: Path
    servers: list[_Server] = field(default_factory=list)

    def host(self) -> HwHost:
        return HwHost("127.0.0.1", user="root", port=self.port)

    def config(self, **kw: object) -> HwConfig:
        base: dict[str, object] = dict(
            hosts=(self.host(),),
            ssh_key=str(self.key_file),
            known_hosts=str(self.known_hosts),
            device="/dev/null",  # a character device anyone can open read-write
            python=sys.executable,
            connect_timeout=5.0,
        )
        base.update(kw)
        return HwConfig(**base).validate()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def keys() -> tuple[paramiko.PKey, paramiko.PKey]:
    return paramiko.RSAKey.generate(2048), paramiko.RSAKey.generate(2048)


@pytest.fixture
def sshd(tmp_path: Path, keys: tuple[paramiko.PKey, paramiko.PKey]) -> Iterator[LocalSshd]:
    client_key, host_key = keys
    key_file = tmp_path / "id_rsa"
    client_key.write_private_key_file(str(key_file))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    server = LocalSshd(port, key_file, host_key, known)
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                continue
            t = paramiko.Transport(sock)
            t.add_server_key(host_key)
            iface = _Server(client_key)
            server.servers.append(iface)
            transports.append(t)
            try:
                t.start_server(server=iface)
            except (paramiko.SSHException, EOFError, OSError):
                continue  # a client that hung up early (an unusable key, a refused host key)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join(timeout=5)
    for t in transports:
        t.close()
    listener.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


# -- pre-flight -----------------------------------------------------------------------------


def test_unreachable_host_fails_in_seconds_with_the_reason() -> None:
    port = _closed_port()
    config = HwConfig(hosts=(HwHost("127.0.0.1", port=port),), connect_timeout=5.0).validate()
    start = time.monotonic()
    (report,) = hwpreflight.preflight(config)
    assert time.monotonic() - start < 3
    assert not report.ok
    assert report.failure == (
        f"root@127.0.0.1:{port}: SSH unreachable: cannot connect to 127.0.0.1:{port}: "
        "[Errno 111] Connection refused"
    )
    assert [c.name for c in report.checks] == ["ssh"]


def test_cli_preflight_failure_exits_2_in_seconds(tmp_path: Path) -> None:
    port = _closed_port()
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "obmm.testbed.hw.stage",
            "--hosts",
            f"root@127.0.0.1:{port}",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_DECODER"))},
    )
    took = time.monotonic() - start
    assert proc.returncode == hwstage.EXIT_PREFLIGHT, proc.stderr
    assert took < 10
    assert (
        f"hw: pre-flight FAILED: root@127.0.0.1:{port}: SSH unreachable: cannot connect to "
        f"127.0.0.1:{port}: [Errno 111] Connection refused" in proc.stderr
    )
    assert (
        (tmp_path / f"127.0.0.1_{port}" / "preflight.txt")
        .read_text()
        .startswith(f"root@127.0.0.1:{port}: pre-flight FAILED")
    )


def test_all_checks_pass_and_name_the_module(sshd: LocalSshd) -> None:
    (report,) = hwpreflight.preflight(sshd.config())
    assert report.ok, report.lines()
    assert [c.name for c in report.checks] == ["ssh", "device", "module", "python", "decoder"]
    details = {c.name: c.detail for c in report.checks}
    assert details["ssh"] == f"logged in as root on 127.0.0.1:{sshd.port}"
    assert details["module"] in (
        "no obmm module: built into the kernel",
        "obmm (the OBMM driver)",
        "obmm (the emulator, kmod/obmm_emu, standing in for the real driver)",
    )
    assert details["python"].endswith("(the host's)")
    assert details["decoder"] == "not configured (one host: no cross-node import)"
    assert not report.ship_deps


def test_missing_device_fails_with_the_reason(sshd: LocalSshd) -> None:
    (report,) = hwpreflight.preflight(sshd.config(device="/dev/obmm-nonexistent"))
    assert report.failure == (
        "/dev/obmm-nonexistent not present on 127.0.0.1: the OBMM driver is not loaded "
        "(load obmm.ko, e.g. modprobe obmm)"
    )
    assert [c.ok for c in report.checks] == [True, False]


def test_device_that_is_not_a_char_device(sshd: LocalSshd, tmp_path: Path) -> None:
    (report,) = hwpreflight.preflight(sshd.config(device=str(tmp_path)))
    assert report.failure == f"{tmp_path} exists but is not a character device"


def test_missing_python_fails_with_the_reason(sshd: LocalSshd) -> None:
    (report,) = hwpreflight.preflight(sshd.config(python="/nonexistent/python3"))
    assert report.failure == (
        "/nonexistent/python3 not found on 127.0.0.1 (install python3, or set HW_PYTHON / "
        "python in HW_CONFIG to the interpreter's path)"
    )


def test_python_without_cffi_fails_and_says_it_is_not_shipped(
    sshd: LocalSshd, tmp_path: Path
) -> None:
    fake = tmp_path / "python3"
    # A Python whose `import cffi` fails: -S drops site-packages (no cffi, no pytest).
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    fake.chmod(0o755)
    (report,) = hwpreflight.preflight(sshd.config(python=str(fake)))
    assert report.failure == (
        f"cffi is not importable by {fake} on 127.0.0.1 (ModuleNotFoundError: No module named "
        "'cffi'): install the distribution's python3-cffi package (cffi is not pure Python, so "
        "it is not shipped)"
    )


def test_pytest_is_shipped_when_asked(sshd: LocalSshd) -> None:
    (report,) = hwpreflight.preflight(sshd.config(ship_deps="always"))
    assert report.ok, report.lines()
    assert report.ship_deps
    assert "pytest shipped (iniconfig " in report.checks[3].detail


def test_shipped_archive_runs_pytest_without_site_packages(tmp_path: Path) -> None:
    import tarfile

    deps = hwpreflight.ShippedDeps.collect()
    assert deps.problem_for(".".join(map(str, sys.version_info[:3]))) == ""
    archive = tmp_path / "pydeps.tar.gz"
    archive.write_bytes(deps.tarball())
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "pydeps")
    probe = "import pytest, sys; print(pytest.__file__); sys.exit(pytest.main(['--version']))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        env={"PYTHONPATH": str(tmp_path / "pydeps")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(tmp_path / "pydeps" / "pytest"))


def test_shipping_refuses_a_too_old_python() -> None:
    deps = hwpreflight.ShippedDeps.collect()
    assert deps.problem_for("3.8.10").endswith("needs Python >=3.10, the host has 3.8.10")


def test_cross_node_needs_a_decoder_hook(sshd: LocalSshd) -> None:
    second = HwHost("localhost", port=sshd.port)
    known = sshd.known_hosts
    known.write_text(
        known.read_text()
        + f"[localhost]:{sshd.port} {sshd.host_key.get_name()} {sshd.host_key.get_base64()}\n"
    )
    config = sshd.config(hosts=(sshd.host(), second))
    reports = hwpreflight.preflight(config)
    assert [r.failure for r in reports] == [
        "decoder resolution hook not configured: cross-node imports need "
        "OBMM_DECODER=cmd:PROGRAM or file:PATH (on the hosts; see pylib/obmm/decoder.py)"
    ] * 2
    (report, _) = hwpreflight.preflight(
        sshd.config(hosts=(sshd.host(), second), decoder="cmd:/nonexistent/ub-decoder --json")
    )
    assert report.failure == "decoder command '/nonexistent/ub-decoder' not found on 127.0.0.1"
    # HW_CLUSTER=off: no cross-node import, so neither hook is needed.
    reports = hwpreflight.preflight(sshd.config(hosts=(sshd.host(), second), cluster="off"))
    assert all(r.ok for r in reports), [r.lines() for r in reports]


def test_cross_node_needs_the_controller_identity(
    sshd: LocalSshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = HwHost("localhost", port=sshd.port)
    sshd.known_hosts.write_text(
        sshd.known_hosts.read_text()
        + f"[localhost]:{sshd.port} {sshd.host_key.get_name()} {sshd.host_key.get_base64()}\n"
    )
    config = sshd.config(hosts=(sshd.host(), second), decoder="cmd:true")
    monkeypatch.setattr(hwpreflight, "UBC_GLOB", f"{tmp_path}/ub_bus_controller*/*/ubc")
    (report, _) = hwpreflight.preflight(config)
    assert report.failure == (
        f"no {tmp_path}/ub_bus_controller*/*/ubc beside primary_cna and eid on 127.0.0.1: the "
        "cluster suite takes the node's CNA and EID from there, as libobmm does (is the UB bus "
        "controller driver loaded?)"
    )
    ctl = tmp_path / "ub_bus_controller0" / "00001"  # as the UB bus prints it: ubc a file
    ctl.mkdir(parents=True)
    (ctl / "ubc").write_text("0x001\n")
    (ctl / "primary_cna").write_text("0x0011\n")
    (ctl / "eid").write_text("4660\n")
    (report, _) = hwpreflight.preflight(config)
    assert report.ok, report.lines()
    assert [c.name for c in report.checks] == list(hwpreflight.CHECKS)
    assert report.checks[-1].detail == f"{ctl}: primary_cna 0x0011, eid 4660"


def test_decoder_table_is_checked_on_the_host(sshd: LocalSshd, tmp_path: Path) -> None:
    table = tmp_path / "windows.json"
    table.write_text('{"windows": [{"node": 1, "base": "0x100000000", "size": 1073741824}]}')
    (report,) = hwpreflight.preflight(sshd.config(decoder=f"file:{table}"))
    assert report.checks[-1].detail == f"file: {table} (1 window(s))"
    (report,) = hwpreflight.preflight(sshd.config(decoder=f"file:{tmp_path}/missing.json"))
    assert report.failure.startswith(f"decoder table {tmp_path}/missing.json on 127.0.0.1: ")
    assert "No such file or directory" in report.failure


def test_unknown_host_key_is_refused_under_strict(sshd: LocalSshd) -> None:
    sshd.known_hosts.write_text("")
    (report,) = hwpreflight.preflight(sshd.config())
    assert report.failure == (
        f"root@127.0.0.1:{sshd.port}: SSH host key unknown: 127.0.0.1:{sshd.port} is not in "
        f"{sshd.known_hosts} (add it: ssh-keyscan -p {sshd.port} 127.0.0.1 >> "
        f"{sshd.known_hosts}, after checking the fingerprint; or HW_HOST_KEY_POLICY=accept-new)"
    )


def test_accept_new_records_the_host_key(sshd: LocalSshd) -> None:
    sshd.known_hosts.write_text("")
    (report,) = hwpreflight.preflight(sshd.config(host_key_policy="accept-new"))
    assert report.ok, report.lines()
    assert sshd.host_key.get_base64() in sshd.known_hosts.read_text()


def test_changed_host_key_is_a_mismatch(sshd: LocalSshd) -> None:
    fake = paramiko.RSAKey.generate(1024)
    sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} ssh-rsa {fake.get_base64()}\n")
    (report,) = hwpreflight.preflight(sshd.config())
    assert report.failure.startswith(f"root@127.0.0.1:{sshd.port}: SSH host key MISMATCH: ")
    assert report.failure.endswith(
        f"if the host was reinstalled, remove its old entry from {sshd.known_hosts}"
    )


def test_wrong_key_is_a_refused_login(
    sshd: LocalSshd, tmp_path: Path, keys: tuple[paramiko.PKey, paramiko.PKey]
) -> None:
    wrong = tmp_path / "wrong"
    keys[1].write_private_key_file(str(wrong))  # the host key: not authorized
    (report,) = hwpreflight.preflight(sshd.config(ssh_key=str(wrong)))
    assert report.failure.startswith(
        f"root@127.0.0.1:{sshd.port}: SSH login refused for user root with key {wrong}: "
    )


def test_unusable_key_file_says_so(sshd: LocalSshd, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("not a key\n")
    (report,) = hwpreflight.preflight(sshd.config(ssh_key=str(bad)))
    assert report.failure.startswith(f"root@127.0.0.1:{sshd.port}: cannot load the SSH key {bad}: ")


def test_guest_pytest_command_runs_in_the_temp_dir_with_the_hardware_target(
    tmp_path: Path,
) -> None:
    config = HwConfig(
        hosts=(HwHost("a"), HwHost("b")), decoder="cmd:dec", python="/usr/bin/python3"
    )
    session = hwstage.HwSession(config, 1, results=tmp_path, ship_tar=tmp_path / "x.tar.gz")
    from pathlib import PurePosixPath

    session.workdir = PurePosixPath("/tmp/obmm-hw.abc123")
    cmd = session.pytest_command(["tests/guest"], junit="/tmp/obmm-hw.abc123/results/j.xml")
    assert cmd == (
        "cd /tmp/obmm-hw.abc123 && env "
        "PYTHONPATH=/tmp/obmm-hw.abc123/pylib:/tmp/obmm-hw.abc123/pydeps "
        "PYTHONDONTWRITEBYTECODE=1 OBMM_EVENT_FD=3 OBMM_TARGET=hardware OBMM_NODE_ID=1 "
        "OBMM_NODES=2 OBMM_DECODER=cmd:dec /usr/bin/python3 -m pytest -p "
        "obmm.testbed.suite.guest_plugin -p no:cacheprovider -v -rA "
        "--junitxml=/tmp/obmm-hw.abc123/results/j.xml tests/guest 3>&1 1>&2"
    )


def test_emulator_only_tests_are_skipped_on_hardware_with_the_reason(tmp_path: Path) -> None:
    """The guest conftest's hook, on the host, with the kernel-log guard off."""
    repo = Path(__file__).resolve().parents[3]
    suite = tmp_path / "tests" / "guest"
    suite.mkdir(parents=True)
    (suite / "conftest.py").write_text((repo / "tests" / "guest" / "conftest.py").read_text())
    (suite / "test_x.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.emulator_only\ndef test_emu():\n    pass\n\n"
        "def test_generic():\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    emulator_only: emulator\n")
    env = dict(
        os.environ, OBMM_KMSG_GUARD="off", OBMM_TARGET="hardware", PYTHONPATH=str(repo / "pylib")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rs",
            "--strict-markers",
            str(suite),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    skipped = f"SKIPPED [1] tests/guest/test_x.py:3: {emulator_only_reason('hardware')}"
    assert skipped in proc.stdout, proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout
    env["OBMM_TARGET"] = "qemu"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "2 passed" in proc.stdout, proc.stdout


def test_cluster_suite_in_hardware_mode_skips_emulator_only_with_the_reason(
    tmp_path: Path,
) -> None:
    """tests/cluster's conftest with $OBMM_HW_CONFIG_JSON set: the emulator_only tests are
    reported as skipped with the reason (before any fixture would log in to a host)."""
    repo = Path(__file__).resolve().parents[3]
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "emulator_only"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HW_", "OBMM_"))}
    collected = subprocess.run(
        [*base, "--collect-only", "-q", "tests/cluster"],
        cwd=repo, env=clean, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    expected = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(expected) >= 5, collected.stdout
    config = HwConfig(hosts=(HwHost("127.0.0.1", port=_closed_port()), HwHost("127.0.0.2")))
    env = dict(clean, **{envvars.HW_CONFIG_JSON.name: config.to_json()})
    proc = subprocess.run(
        [*base, "-rs", f"--junitxml={tmp_path / 'j.xml'}", "tests/cluster"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    js = hwstage.JunitSummary.read(tmp_path / "j.xml")
    assert js.counts == {"passed": 0, "failed": 0, "error": 0, "skipped": len(expected)}
    reason = emulator_only_reason("hardware")
    assert set(js.skipped.values()) == {reason}


def test_junit_summary_lists_skips_with_reasons(tmp_path: Path) -> None:
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="x">'
        '<testcase classname="a.b" name="t1"/>'
        '<testcase classname="a.b" name="t2"><skipped message="emulator_only: why"/></testcase>'
        '<testcase classname="a.c" name="t3"><failure message="boom"/></testcase>'
        "</testsuite></testsuites>"
    )
    js = hwstage.JunitSummary.read(junit)
    assert js.counts == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert js.skipped == {"a.b::t2": "emulator_only: why"}
    assert js.failed == ["a.c::t3"]


def test_host_that_never_answers_fails_after_the_connect_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the TCP connection (backlog), never sends a banner
    port = listener.getsockname()[1]
    try:
        config = HwConfig(hosts=(HwHost("127.0.0.1", port=port),), connect_timeout=1.0)
        start = time.monotonic()
        (report,) = hwpreflight.preflight(config.validate())
        assert time.monotonic() - start < 5
    finally:
        listener.close()
    assert report.failure.startswith(
        f"root@127.0.0.1:{port}: SSH unreachable: no login within 1 s ("
    )
    assert report.failure.endswith("a slow host needs a longer HW_CONNECT_TIMEOUT")


def test_shipped_pytest_starts_from_its_bytecode(tmp_path: Path) -> None:
    """The stage's guest pytest runs with PYTHONDONTWRITEBYTECODE: the archive's own .pyc
    (for this interpreter) are what it loads, none compiled, none stale."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(hwpreflight.ShippedDeps.collect().tarball())) as tar:
        tar.extractall(tmp_path / "pydeps", filter="tar")
    found = bytecode_imports(
        tmp_path, tmp_path / "pydeps", "import pytest, _pytest.main, _pytest.junitxml", "-S"
    )
    assert len(found.loaded) >= 20, found.stderr[-2000:]
    assert found.compiled == []
    assert found.stale == []


def test_hardware_liveness_ping_is_scaled_by_this_machines_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hardware host's liveness ping waits as long as a guest's would on this machine: the
    timeout scale and the busy factor stretch it (a loaded runner answers slowly too)."""
    timeouts: list[float] = []

    class Conn:
        def __enter__(self) -> Conn:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def run(self, cmd: str, *, timeout: float) -> None:
            timeouts.append(timeout)

    class Hw:
        name = "hostA"

        def connect(self) -> Conn:
            return Conn()

    monkeypatch.setenv(envvars.TIMEOUT_SCALE.name, "2")
    monkeypatch.setattr("obmm.testbed.settings.busy_factor", lambda: 3.0)
    run = object.__new__(hwstage.HwRun)
    run.hw = Hw()  # type: ignore[assignment]
    run._ping()
    assert timeouts == [hwstage.runner.PING_TIMEOUT_S * 2 * 3]
