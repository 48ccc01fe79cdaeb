"""Hardware stage, part 1: log in to a UB host and check it can run the suites.

Every check ends in seconds with the reason; nothing is installed or loaded on the host.

* ``ssh``: TCP connect and login (key or agent; host key per ``host_key_policy``).
* ``device``: ``/dev/obmm`` is a character device the login user can open read-write.
* ``module``: which kernel module provides it: ``obmm`` (the emulator's module has the same
  name; it is told apart by its fabric sysfs, ``/sys/kernel/obmm_emu``), or built in.
* ``python``: the interpreter exists, is >= 3.9 and imports ``cffi`` (not pure Python, so it is
  never shipped); ``pytest`` >= 7.2 is used if the host has it, else a pure-Python archive
  (pytest and its dependencies, from this machine's environment) is shipped.
* ``decoder``: the decoder resolution hook for cross-node imports (``OBMM_DECODER``).
* ``identity`` (two or more hosts): the UB controller's ``primary_cna`` and ``eid`` in sysfs,
  where the cluster suite (like libobmm) takes the node's CNA and EID for its handles.
"""

from __future__ import annotations

import io
import json
import logging
import shlex
import socket
import sys
import tarfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import paramiko

from obmm.decoder import EMU_SYSFS  # the emulator's fabric sysfs: tells its obmm apart
from obmm.testbed import ssh
from obmm.testbed.builds import bytecode
from obmm.testbed.hw.config import HwConfig, HwHost

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 9)
#: The ``module`` fact of a host whose obmm is the emulator.
EMULATED_MODULE = "obmm (emulated)"
MIN_PYTEST = (7, 2)
SHIPPED_ROOT = "pytest"


class HostUnreachable(ssh.SshError):
    """No TCP connection or no SSH banner."""


class LoginRefused(ssh.SshError):
    """The host answered but refused the key (or agent)."""


class HostKeyError(ssh.SshError):
    """The host key is unknown (strict policy) or does not match known_hosts."""


class HwConnection(ssh.Connection):
    """An SSH login to a hardware host: one attempt, agent/keys or a key file, known_hosts.

    Unlike a QEMU guest there is no sshd that is still booting, so there is no retry loop: an
    unreachable host fails at once with the reason.
    """

    def __init__(self, host: HwHost, config: HwConfig, *, name: str | None = None) -> None:
        target = ssh.Target(host.host, host.port, config.key_path(), user=host.user)
        super().__init__(target, name=name or host.spec)
        self.host = host
        self.config = config

    def connect(self, deadline: float, *, first_attempt: float | None = None) -> None:
        ssh._quiet_paramiko()
        host, cfg = self.host, self.config
        timeout = max(1.0, deadline - time.monotonic())
        client = paramiko.SSHClient()
        known = cfg.known_hosts_path()
        if known.is_file():
            client.load_host_keys(str(known))
        policy: paramiko.MissingHostKeyPolicy = paramiko.RejectPolicy()
        if cfg.host_key_policy == "accept-new":
            policy = paramiko.AutoAddPolicy()
        elif cfg.host_key_policy == "off":
            policy = paramiko.WarningPolicy()
        client.set_missing_host_key_policy(policy)
        try:
            sock = socket.create_connection((host.host, host.port), timeout=timeout)
        except OSError as exc:
            client.close()
            why = "no answer" if isinstance(exc, socket.timeout) else str(exc)
            raise HostUnreachable(
                f"{host.spec}: SSH unreachable: cannot connect to {host.host}:{host.port}: {why}"
            ) from exc
        key = cfg.key_path() if cfg.ssh_key else None
        pkey = None
        if key is not None:
            try:
                pkey = paramiko.PKey.from_path(str(key))
            except (OSError, paramiko.SSHException, ValueError) as exc:
                client.close()
                sock.close()
                raise LoginRefused(f"{host.spec}: cannot load the SSH key {key}: {exc}") from exc
        try:
            client.connect(
                host.host,
                port=host.port,
                username=host.user,
                pkey=pkey,
                sock=sock,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                look_for_keys=key is None,
                allow_agent=key is None,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"{host.spec}: SSH host key MISMATCH: {exc}; if the host was reinstalled, remove "
                f"its old entry from {known}"
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"key {key}" if key else "the ssh agent and ~/.ssh keys"
            raise LoginRefused(
                f"{host.spec}: SSH login refused for user {host.user} with {how}: {exc}"
            ) from exc
        except paramiko.SSHException as exc:
            client.close()
            if "known_hosts" in str(exc):
                port = f"-p {host.port} " if host.port != 22 else ""
                raise HostKeyError(
                    f"{host.spec}: SSH host key unknown: {host.host}:{host.port} is not in "
                    f"{known} (add it: ssh-keyscan {port}{host.host} >> {known}, after checking "
                    "the fingerprint; or HW_HOST_KEY_POLICY=accept-new)"
                ) from exc
            raise HostUnreachable(
                f"{host.spec}: SSH unreachable: no login within {timeout:.0f} s ({exc}); a slow "
                "host needs a longer HW_CONNECT_TIMEOUT"
            ) from exc
        except (OSError, EOFError) as exc:
            client.close()
            raise HostUnreachable(f"{host.spec}: SSH unreachable: {exc}") from exc
        if cfg.host_key_policy == "accept-new" and known.parent.is_dir():
            client.save_host_keys(str(known))
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(ssh.KEEPALIVE_S)
        self._client = client


def connect(host: HwHost, config: HwConfig) -> HwConnection:
    conn = HwConnection(host, config)
    conn.connect(time.monotonic() + config.connect_timeout)
    return conn


# -- checks ---------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class HostReport:
    host: HwHost
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failure(self) -> str:
        for c in self.checks:
            if not c.ok:
                return c.detail
        return ""

    @property
    def ship_deps(self) -> bool:
        return self.facts.get("ship_deps") == "yes"

    @property
    def module(self) -> str:
        return self.facts.get("module", "")

    def lines(self) -> list[str]:
        out = [
            f"{self.host.spec}: pre-flight {'ok' if self.ok else 'FAILED'} ({self.seconds:.1f} s)"
        ]
        out += [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        return out


def probe_script(device: str, python: str) -> str:
    """One shell round trip: key=value lines about the device, modules and interpreter."""
    d, p = shlex.quote(device), shlex.quote(python)
    return "; ".join(
        [
            "echo uid=$(id -u)",
            f"if [ -c {d} ]; then echo dev=char; elif [ -e {d} ]; then echo dev=other; "
            "else echo dev=missing; fi",
            f"if [ -r {d} ] && [ -w {d} ]; then echo devrw=1; else echo devrw=0; fi",
            "[ -d /sys/module/obmm ] && echo module=obmm",
            f"[ -d {EMU_SYSFS} ] && echo emulated=1",
            "echo kernel=$(uname -r)",
            "echo machine=$(uname -m)",
            f"echo python=$(command -v {p} 2>/dev/null)",
            "command -v tar >/dev/null 2>&1 && echo tar=1 || echo tar=0",
            "true",
        ]
    )


PY_PROBE = (
    "import json, sys\n"
    "r = {'version': '.'.join(map(str, sys.version_info[:3]))}\n"
    "for m in ('cffi', 'pytest'):\n"
    "    try:\n"
    "        mod = __import__(m)\n"
    "        r[m] = getattr(mod, '__version__', '?')\n"
    "    except Exception as e:\n"
    "        r[m + '_error'] = '%s: %s' % (type(e).__name__, e)\n"
    "print(json.dumps(r))\n"
)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _kv(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(key.strip(), []).append(value.strip())
    return out


CHECKS = ("ssh", "device", "module", "python", "decoder", "identity")
# Where libobmm's vendor adaptor finds the controller (docs/obmm-driver.md section 8.2); a glob
# for sh.
UBC_GLOB = "/sys/devices/ub_bus_controller*/*/ubc"


def check_host(
    host: HwHost, config: HwConfig, *, cross_node: bool, shipped: ShippedDeps | None = None
) -> HostReport:
    """Run the checks in order, stopping at the first failure (later ones depend on it)."""
    report = HostReport(host)
    start = time.monotonic()
    try:
        _checks(report, config, cross_node, shipped)
    except ssh.SshError as exc:  # the host stopped answering or a probe overran its deadline
        step = CHECKS[min(len(report.checks), len(CHECKS) - 1)]
        report.checks.append(Check(step, False, str(exc).splitlines()[0]))
    finally:
        report.seconds = time.monotonic() - start
    return report


def _checks(
    report: HostReport, config: HwConfig, cross_node: bool, shipped: ShippedDeps | None
) -> None:
    host = report.host
    add = report.checks.append
    try:
        conn = connect(host, config)
    except ssh.SshError as exc:
        add(Check("ssh", False, str(exc)))
        return
    with conn:
        add(Check("ssh", True, f"logged in as {host.user} on {host.host}:{host.port}"))
        timeout = max(config.connect_timeout, 10.0)
        facts = _kv(conn.run(probe_script(config.device, config.python), timeout=timeout).out)
        one = {k: v[0] for k, v in facts.items() if v}
        report.facts.update({k: one.get(k, "") for k in ("kernel", "machine", "uid")})
        dev = one.get("dev", "missing")
        if dev == "missing":
            add(
                Check(
                    "device",
                    False,
                    f"{config.device} not present on {host.host}: the OBMM "
                    "driver is not loaded (load obmm.ko, e.g. modprobe obmm)",
                )
            )
            return
        if dev != "char":
            add(Check("device", False, f"{config.device} exists but is not a character device"))
            return
        if one.get("devrw") != "1":
            add(
                Check(
                    "device",
                    False,
                    f"{config.device} is not readable and writable by "
                    f"{host.user} (uid {one.get('uid')}): OBMM needs root",
                )
            )
            return
        add(
            Check(
                "device",
                True,
                f"{config.device} (kernel {one.get('kernel')}, {one.get('machine')})",
            )
        )
        emulated = one.get("emulated") == "1"
        if one.get("module") != "obmm":
            module = "built-in"
            detail = "no obmm module: built into the kernel"
        elif emulated:
            module = EMULATED_MODULE
            detail = "obmm (the emulator, kmod/obmm_emu, standing in for the real driver)"
        else:
            module = "obmm"
            detail = "obmm (the OBMM driver)"
        report.facts["module"] = module
        add(Check("module", True, detail))
        if one.get("tar") != "1":
            add(Check("tools", False, f"tar not found on {host.host}: needed to unpack the suite"))
            return
        _python_check(report, conn, config, shipped, timeout)
        if not report.ok:
            return
        _decoder_check(report, conn, config, cross_node, timeout)
        if report.ok and cross_node:
            _identity_check(report, conn, timeout)


def _python_check(
    report: HostReport,
    conn: HwConnection,
    config: HwConfig,
    shipped: ShippedDeps | None,
    timeout: float,
) -> None:
    add = report.checks.append
    host = report.host
    py = config.python
    q = shlex.quote(py)
    res = conn.run(
        f"if command -v {q} >/dev/null 2>&1; then {q} -c {shlex.quote(PY_PROBE)}; "
        "else echo NO-PYTHON; fi",
        timeout=timeout + 20,
    )
    if res.out.strip() == "NO-PYTHON":
        add(
            Check(
                "python",
                False,
                f"{py} not found on {host.host} (install python3, or set "
                "HW_PYTHON / python in HW_CONFIG to the interpreter's path)",
            )
        )
        return
    try:
        info = json.loads(res.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        add(
            Check(
                "python",
                False,
                f"{py} on {host.host} does not run: exit {res.exit_status}: "
                f"{(res.err or res.out).strip()[-300:]}",
            )
        )
        return
    version = str(info["version"])
    report.facts["python_version"] = version
    if _version(version) < MIN_PYTHON:
        add(
            Check(
                "python",
                False,
                f"{py} on {host.host} is {version}; the obmm package needs "
                f">= {'.'.join(map(str, MIN_PYTHON))}",
            )
        )
        return
    if "cffi" not in info:
        add(
            Check(
                "python",
                False,
                f"cffi is not importable by {py} on {host.host} "
                f"({info.get('cffi_error')}): install the distribution's python3-cffi package "
                "(cffi is not pure Python, so it is not shipped)",
            )
        )
        return
    detail = f"{py} {version}, cffi {info['cffi']}"
    has_pytest = "pytest" in info and _version(str(info["pytest"])) >= MIN_PYTEST
    ship = config.ship_deps == "always" or (config.ship_deps == "auto" and not has_pytest)
    if ship:
        if shipped is None:
            shipped = ShippedDeps.collect()
        problem = shipped.problem_for(version)
        if problem:
            add(Check("python", False, f"{detail}; pytest must be shipped but {problem}"))
            return
        detail += f"; pytest shipped ({shipped.summary()})"
    elif not has_pytest:
        found = info.get("pytest") or info.get("pytest_error")
        add(
            Check(
                "python",
                False,
                f"{detail}; pytest >= 7.2 is not importable ({found}) and "
                "ship_deps is never (set HW_SHIP_DEPS=auto to ship it)",
            )
        )
        return
    else:
        detail += f", pytest {info['pytest']} (the host's)"
    report.facts["ship_deps"] = "yes" if ship else "no"
    add(Check("python", True, detail))


def _decoder_check(
    report: HostReport, conn: HwConnection, config: HwConfig, cross_node: bool, timeout: float
) -> None:
    add = report.checks.append
    spec = config.decoder
    kind, _, arg = spec.partition(":")
    if not spec:
        if not cross_node:
            add(Check("decoder", True, "not configured (one host: no cross-node import)"))
        elif report.module == EMULATED_MODULE:
            add(Check("decoder", True, f"emulator windows ({EMU_SYSFS})"))
        else:
            add(
                Check(
                    "decoder",
                    False,
                    "decoder resolution hook not configured: cross-node "
                    "imports need OBMM_DECODER=cmd:PROGRAM or file:PATH (on the hosts; see "
                    "pylib/obmm/decoder.py)",
                )
            )
        return
    if kind == "cmd":
        argv = shlex.split(arg)
        prog = argv[0] if argv else ""
        res = conn.run(f"command -v {shlex.quote(prog)}", timeout=timeout) if prog else None
        if res is None or not res.ok:
            add(
                Check("decoder", False, f"decoder command {prog!r} not found on {report.host.host}")
            )
            return
        add(Check("decoder", True, f"cmd: {res.out.strip()}"))
    elif kind == "file":
        code = "import json,sys; d=json.load(open(sys.argv[1])); print(len(d['windows']))"
        res = conn.run(
            f"{shlex.quote(config.python)} -c {shlex.quote(code)} {shlex.quote(arg)}",
            timeout=timeout + 20,
        )
        if not res.ok:
            why = (res.err.strip().splitlines() or ["unreadable"])[-1]
            add(Check("decoder", False, f"decoder table {arg} on {report.host.host}: {why}"))
            return
        add(Check("decoder", True, f"file: {arg} ({res.out.strip()} window(s))"))
    else:
        sysfs = arg or EMU_SYSFS
        res = conn.run(f"test -d {shlex.quote(sysfs)}/windows", timeout=timeout)
        if not res.ok:
            add(
                Check(
                    "decoder",
                    False,
                    f"decoder {spec}: {sysfs}/windows missing (the emulator is "
                    "not loaded; on hardware use cmd: or file:)",
                )
            )
            return
        add(Check("decoder", True, f"emulator windows in {sysfs}"))


def _identity_check(report: HostReport, conn: HwConnection, timeout: float) -> None:
    script = (
        # libobmm's way: the directory a ub_bus_controller<i>/*/ubc glob hit is in.
        f"for f in {UBC_GLOB}; do d=${{f%/ubc}}; [ -r $d/primary_cna ] && [ -r $d/eid ] && "
        "{ echo $d $(cat $d/primary_cna) $(cat $d/eid); exit 0; }; done; exit 1"
    )
    res = conn.run(script, timeout=timeout)
    if not res.ok:
        report.checks.append(
            Check(
                "identity",
                False,
                f"no {UBC_GLOB} beside primary_cna and eid on {report.host.host}: the cluster "
                "suite takes the node's CNA and EID from there, as libobmm does (is the UB bus "
                "controller driver loaded?)",
            )
        )
        return
    where, cna, eid = [*res.out.split(), "?", "?", "?"][:3]
    report.checks.append(Check("identity", True, f"{where}: primary_cna {cna}, eid {eid}"))


def preflight(config: HwConfig, shipped: ShippedDeps | None = None) -> list[HostReport]:
    """Check every host in parallel (an unreachable host costs one connect timeout)."""
    cross = len(config.hosts) >= 2 and config.cluster != "off"
    with ThreadPoolExecutor(max_workers=min(8, len(config.hosts))) as pool:
        futures = [
            pool.submit(check_host, h, config, cross_node=cross, shipped=shipped)
            for h in config.hosts
        ]
        return [f.result() for f in futures]


# -- the pure-Python dependencies shipped when a host has no pytest -------------------------


def _requires(dist: metadata.Distribution, python_version: str) -> list[str]:
    from packaging.requirements import Requirement

    env = {
        "python_version": ".".join(python_version.split(".")[:2]),
        "python_full_version": python_version,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "extra": "",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    names = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            names.append(req.name)
    return names


@dataclass
class ShippedDeps:
    """pytest and what it needs, taken from this interpreter's environment."""

    dists: dict[str, metadata.Distribution]

    @classmethod
    def collect(cls) -> ShippedDeps:
        found: dict[str, metadata.Distribution] = {}
        todo = [SHIPPED_ROOT]
        while todo:
            name = todo.pop()
            key = name.lower().replace("_", "-")
            if key in found:
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            found[key] = dist
            todo += _requires(dist, ".".join(map(str, sys.version_info[:3])))
        return cls(found)

    def summary(self) -> str:
        return ", ".join(f"{k} {d.version}" for k, d in sorted(self.dists.items()))

    def problem_for(self, python_version: str) -> str:
        """Why these packages cannot run on that Python ('' if they can)."""
        from packaging.specifiers import SpecifierSet

        if SHIPPED_ROOT not in self.dists:
            return "this machine's environment has no pytest to ship"
        for key, dist in sorted(self.dists.items()):
            need = (dist.metadata.get_all("Requires-Python") or [""])[0]
            if need and python_version not in SpecifierSet(need):
                return f"{key} {dist.version} needs Python {need}, the host has {python_version}"
            for name in _requires(dist, python_version):
                if name.lower().replace("_", "-") not in self.dists:
                    return f"{key} on Python {python_version} needs {name}, which is not here"
            for f in dist.files or []:
                if f.suffix in (".so", ".pyd"):
                    return f"{key} is not pure Python ({f})"
        return ""

    def tarball(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for dist in self.dists.values():
                files = [(Path(str(dist.locate_file(f))), str(f)) for f in _dist_files(dist)]
                for path, arc in files:
                    tar.add(path, arcname=arc)
                # The stage's guest pytest runs with PYTHONDONTWRITEBYTECODE: without these it
                # compiles pytest at every start (1.5 s of a TCG node's CPU each time).
                bytecode.add_compiled(tar, files)
        return buf.getvalue()


def _dist_files(dist: metadata.Distribution) -> Iterable[metadata.PackagePath]:
    for f in dist.files or []:
        if f.parts[0] == ".." or "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        if Path(str(dist.locate_file(f))).is_file():
            yield f


def format_reports(reports: Sequence[HostReport]) -> str:
    return "\n".join(line for r in reports for line in r.lines())
