"""Configuration of the hardware stage: which UB hosts, how to log in, how to run there.

Sources, later ones winning: a config file (``HW_CONFIG=path``; JSON, or ``key = value`` lines
in a TOML-like form), then the environment (``HW_HOSTS``, ``HW_SSH_KEY``, ...), then the command
line of ``python -m obmm.testbed.hw.stage``.

=====================  ======================  ==============================================
config key             environment             meaning
=====================  ======================  ==============================================
``hosts``              ``HW_HOSTS``            ``user@host[:port]``, comma separated / a list
``ssh_key``            ``HW_SSH_KEY``          private key; default: ssh agent + ~/.ssh keys
``known_hosts``        ``HW_KNOWN_HOSTS``      default ``~/.ssh/known_hosts``
``host_key_policy``    ``HW_HOST_KEY_POLICY``  ``strict`` (default), ``accept-new``, ``off``
``decoder``            ``OBMM_DECODER``        ``cmd:PROGRAM ARGS`` or ``file:PATH`` on hosts
``python``             ``HW_PYTHON``           interpreter on the hosts (default ``python3``)
``device``             ``HW_DEVICE``           default ``/dev/obmm``
``ship_deps``          ``HW_SHIP_DEPS``        ``auto`` (default), ``always``, ``never``
``remote_tmp``         ``HW_REMOTE_TMP``       parent of the per-run directory (``/tmp``)
``connect_timeout``    ``HW_CONNECT_TIMEOUT``  seconds per SSH login (default 10)
``cluster``            ``HW_CLUSTER``          ``auto`` (>= 2 hosts) or ``off``
``fabric_addrs``       ``HW_FABRIC_ADDRS``     each host's address as the other hosts reach it
                                               (handle exchange); default: the SSH host names
=====================  ======================  ==============================================
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from obmm import envvars
from obmm.testbed.errors import TestbedError

POLICIES = ("strict", "accept-new", "off")
SHIP_MODES = ("auto", "always", "never")

ENV_CONFIG_FILE = envvars.HW_CONFIG.name
ENV_KEYS: Mapping[str, str] = {
    "hosts": envvars.HW_HOSTS.name,
    "ssh_key": envvars.HW_SSH_KEY.name,
    "known_hosts": envvars.HW_KNOWN_HOSTS.name,
    "host_key_policy": envvars.HW_HOST_KEY_POLICY.name,
    "decoder": envvars.DECODER.name,
    "python": envvars.HW_PYTHON.name,
    "device": envvars.HW_DEVICE.name,
    "ship_deps": envvars.HW_SHIP_DEPS.name,
    "remote_tmp": envvars.HW_REMOTE_TMP.name,
    "connect_timeout": envvars.HW_CONNECT_TIMEOUT.name,
    "cluster": envvars.HW_CLUSTER.name,
    "fabric_addrs": envvars.HW_FABRIC_ADDRS.name,
}


class ConfigError(TestbedError, ValueError):
    """The hardware stage's configuration is unusable; the message says which key and why."""


_HOST_RE = re.compile(r"^(?:([^@\s]+)@)?(\[[^\]]+\]|[^:@\s\[\]]+)(?::(\d+))?$")


@dataclass(frozen=True)
class HwHost:
    """One UB host: ``user@host[:port]`` (IPv6 literals in brackets)."""

    host: str
    user: str = "root"
    port: int = 22

    @classmethod
    def parse(cls, text: str) -> HwHost:
        m = _HOST_RE.match(text.strip())
        if not m:
            raise ConfigError(f"bad host entry {text!r}: expected user@host[:port]")
        user, host, port = m.group(1) or "root", m.group(2).strip("[]"), m.group(3)
        number = int(port) if port else 22
        if not 0 < number < 65536:
            raise ConfigError(f"bad host entry {text!r}: port {number} out of range")
        return cls(host=host, user=user, port=number)

    @property
    def spec(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}" + (f":{self.port}" if self.port != 22 else "")

    @property
    def label(self) -> str:
        """A directory name for this host's results."""
        base = re.sub(r"[^A-Za-z0-9._-]", "_", self.host)
        return base if self.port == 22 else f"{base}_{self.port}"


@dataclass(frozen=True)
class HwConfig:
    hosts: tuple[HwHost, ...] = ()
    ssh_key: str = ""  # "" = ssh agent and ~/.ssh/id_* keys
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: str = "strict"
    decoder: str = ""
    python: str = "python3"
    device: str = "/dev/obmm"
    ship_deps: str = "auto"
    remote_tmp: str = "/tmp"
    connect_timeout: float = 10.0
    cluster: str = "auto"
    fabric_addrs: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    def validate(self) -> HwConfig:
        if not self.hosts:
            raise ConfigError(
                "no hardware hosts: set HW_HOSTS=user@host1,user@host2 or hosts in HW_CONFIG"
            )
        if self.host_key_policy not in POLICIES:
            raise ConfigError(
                f"host_key_policy {self.host_key_policy!r}: use one of {', '.join(POLICIES)}"
            )
        if self.ship_deps not in SHIP_MODES:
            raise ConfigError(f"ship_deps {self.ship_deps!r}: use one of {', '.join(SHIP_MODES)}")
        if self.cluster not in ("auto", "off"):
            raise ConfigError(f"cluster {self.cluster!r}: use auto or off")
        if self.decoder and self.decoder.partition(":")[0] not in ("cmd", "file", "emulator"):
            raise ConfigError(
                f"decoder {self.decoder!r}: use cmd:PROGRAM ARGS or file:PATH "
                "(see pylib/obmm/decoder.py)"
            )
        if self.ssh_key and not self.key_path().is_file():
            raise ConfigError(f"ssh_key {self.ssh_key}: no such file")
        if self.fabric_addrs and len(self.fabric_addrs) != len(self.hosts):
            raise ConfigError(
                f"fabric_addrs has {len(self.fabric_addrs)} address(es) for "
                f"{len(self.hosts)} host(s): give one per host, in the same order"
            )
        labels = [h.label for h in self.hosts]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"duplicate hosts in {', '.join(h.spec for h in self.hosts)}")
        return self

    def fabric_addr(self, index: int) -> str:
        """Where the other hosts reach host `index` (the SSH host name unless configured)."""
        return self.fabric_addrs[index] if self.fabric_addrs else self.hosts[index].host

    def key_path(self) -> Path:
        return Path(self.ssh_key).expanduser()

    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts).expanduser()

    def to_json(self) -> str:
        d = asdict(self)
        d["hosts"] = [h.spec for h in self.hosts]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> HwConfig:
        return _build(HwConfig(), json.loads(text))


def parse_simple(text: str) -> dict[str, Any]:
    """``key = value`` lines (``#`` comments, quoted strings, ``[a, b]`` lists)."""
    out: dict[str, Any] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or (line.startswith(("#", "[")) and "=" not in line):
            continue  # comments and TOML table headers
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"line {n}: expected key = value, got {raw!r}")
        value = value.strip()
        if value.startswith("["):
            items = value.strip("[]").split(",")
            out[key.strip()] = [i.strip().strip("\"'") for i in items if i.strip()]
        else:
            if value[:1] in "\"'" and value[-1:] == value[:1]:
                value = value[1:-1]
            else:
                value = value.split(" #", 1)[0].strip()
            out[key.strip()] = value
    return out


def _build(base: HwConfig, values: Mapping[str, Any]) -> HwConfig:
    known = {f for f in HwConfig.__dataclass_fields__ if f != "extra"}
    unknown = sorted(set(values) - known - {"extra"})
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key == "extra" or value is None:
            continue
        if key == "hosts":
            items = value if isinstance(value, list) else str(value).split(",")
            changes["hosts"] = tuple(HwHost.parse(str(i)) for i in items if str(i).strip())
        elif key == "fabric_addrs":
            items = value if isinstance(value, list) else str(value).split(",")
            changes[key] = tuple(str(i).strip() for i in items if str(i).strip())
        elif key == "connect_timeout":
            try:
                changes[key] = float(value)
            except ValueError as exc:
                raise ConfigError(f"connect_timeout {value!r} is not a number") from exc
        else:
            changes[key] = str(value)
    return replace(base, **changes)


def load_file(path: Path, base: HwConfig | None = None) -> HwConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"HW_CONFIG {path}: {exc.strerror or exc}") from exc
    if text.lstrip().startswith("{"):
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"HW_CONFIG {path}: bad JSON: {exc}") from exc
    else:
        values = parse_simple(text)
    return _build(base or HwConfig(), values)


def load(
    env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> HwConfig:
    """File (``HW_CONFIG``), then environment, then ``overrides``; validated."""
    env = os.environ if env is None else env
    config = HwConfig()
    if env.get(ENV_CONFIG_FILE):
        config = load_file(Path(env[ENV_CONFIG_FILE]), config)
    from_env = {key: env[var] for key, var in ENV_KEYS.items() if env.get(var)}
    config = _build(config, from_env)
    if overrides:
        config = _build(config, {k: v for k, v in overrides.items() if v not in (None, "")})
    return config.validate()
