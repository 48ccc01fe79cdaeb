"""One settings object for a QEMU cluster, read the same way from the environment, CLI flags
and pytest options.

Every knob is a :class:`obmm.envvars.Var` of the ``testbed`` group (name, type, default, help);
:data:`KNOBS` adds the flag each front end shows.  Precedence: a flag (or pytest option) given,
else the environment variable, else the default.  Values that depend on the front end
(topology, name) stay None here and are filled in by the front end.

    settings = Settings.from_env()                      # environment only
    settings = from_args(args)                          # argparse flags over the environment
    settings = settings.replace(nodes=2, params=(...))  # a front end's own choices
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from obmm import envvars
from obmm.testbed import arch
from obmm.testbed.errors import TestbedError
from obmm.testbed.topology import MAX_NODES

PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


class SettingsError(TestbedError, ValueError):
    """A setting has a value the testbed cannot use; the message names it."""


@dataclass(frozen=True)
class Knob:
    """A settings field: its variable and how a front end's flag looks."""

    field: str
    var: envvars.Var
    flag: str
    metavar: str | None = None
    #: Repeatable flag (``--param A=1 --param B=2``) adding to the variable's list.
    repeat: bool = False


KNOBS: tuple[Knob, ...] = (
    Knob("topology", envvars.TOPOLOGY, "--topology", "NAME"),
    Knob("nodes", envvars.NODES, "--nodes", "N"),
    Knob("memory_mib", envvars.MEMORY_MIB, "--memory", "MIB"),
    Knob("pool_mib", envvars.POOL_MIB, "--pool", "MIB"),
    Knob("recipe", envvars.RECIPE, "--recipe", "NAME"),
    Knob("kernel", envvars.KERNEL, "--kernel"),
    Knob("init", envvars.INIT, "--init"),
    Knob("accel", envvars.ACCEL, "--accel"),
    Knob("snapshot", envvars.SNAPSHOT, "--snapshot"),
    Knob("name", envvars.NAME, "--name", "NAME"),
    Knob("boot_timeout", envvars.BOOT_TIMEOUT, "--boot-timeout", "S"),
    Knob("timeout_scale", envvars.TIMEOUT_SCALE, "--timeout-scale", "X"),
    Knob("driver", envvars.DRIVER, "--driver"),
    Knob("params", envvars.PARAMS, "--param", "NAME=VALUE", repeat=True),
    Knob("qemu", envvars.QEMU, "--qemu", "BINARY"),
    Knob("ubs_mem", envvars.UBS_MEM, "--ubs-mem", "PREFIX"),
    Knob("arch", envvars.ARCH, "--arch"),
    Knob("coherence", envvars.COHERENCE, "--coherence"),
)
BY_FIELD: Mapping[str, Knob] = {k.field: k for k in KNOBS}


@dataclass(frozen=True)
class Settings:
    """The knobs of one cluster.  Build it with :meth:`from_env` or :func:`from_args`."""

    topology: str | None = envvars.TOPOLOGY.default
    nodes: int | None = envvars.NODES.default
    memory_mib: int | None = envvars.MEMORY_MIB.default
    pool_mib: int | None = envvars.POOL_MIB.default
    recipe: str = envvars.RECIPE.default
    kernel: str = envvars.KERNEL.default
    init: str = envvars.INIT.default
    accel: str = envvars.ACCEL.default
    snapshot: str = envvars.SNAPSHOT.default
    name: str | None = envvars.NAME.default
    boot_timeout: float | None = envvars.BOOT_TIMEOUT.default
    timeout_scale: float = envvars.TIMEOUT_SCALE.default
    driver: str = envvars.DRIVER.default
    params: tuple[str, ...] = envvars.PARAMS.default
    qemu: str = envvars.QEMU.default
    ubs_mem: str | None = envvars.UBS_MEM.default
    arch: str = envvars.ARCH.default
    coherence: str = envvars.COHERENCE.default

    def __post_init__(self) -> None:
        for knob in KNOBS:
            value = getattr(self, knob.field)
            if knob.var.choices and value not in knob.var.choices:
                raise SettingsError(
                    f"{knob.flag} / {knob.var.name}: {value!r} is not one of "
                    + ", ".join(knob.var.choices)
                )
        try:
            envvars.as_kernel(self.kernel)
        except ValueError:
            raise SettingsError(
                f"--kernel / {envvars.KERNEL.name}: {self.kernel!r} is not one of "
                + ", ".join(envvars.KERNEL_NAMES)
                + ", nor the absolute path of a kernel tree"
            ) from None
        if self.nodes is not None and not 1 <= self.nodes <= MAX_NODES:
            raise SettingsError(
                f"--nodes / {envvars.NODES.name}: {self.nodes} is not 1..{MAX_NODES}"
            )
        for name in ("memory_mib", "pool_mib", "boot_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise SettingsError(f"{BY_FIELD[name].flag}: {value} must be positive")
        if self.timeout_scale < 1:
            raise SettingsError(f"--timeout-scale / {envvars.TIMEOUT_SCALE.name}: must be >= 1")
        if self.name is not None and (not self.name or "/" in self.name or self.name[0] == "."):
            raise SettingsError(f"--name: invalid cluster name {self.name!r}")
        if self.coherence != "coherent" and self.driver != "emu":
            raise SettingsError(
                f"--coherence / {envvars.COHERENCE.name}: {self.coherence!r} is the emulator's "
                f"model; the {self.driver!r} driver has no such parameter"
            )
        for param in self.params:
            if not PARAM_RE.match(param):
                raise SettingsError(
                    f"--param / {envvars.PARAMS.name}: {param!r} is not NAME=VALUE "
                    "(a module parameter, e.g. ubc_index=1)"
                )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Settings:
        """Every knob from the environment, then `given` (a front end's values) on top."""
        values: dict[str, Any] = {}
        for knob in KNOBS:
            try:
                values[knob.field] = knob.var.get(environ)
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
        values.update({k: v for k, v in given.items() if v is not None})
        if "params" in given and given["params"] is not None:
            values["params"] = merge_params(knob_env_params(environ), given["params"])
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def with_defaults(self, **defaults: Any) -> Settings:
        """Fill the knobs still None (the front end's defaults: topology, name)."""
        missing = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **missing)

    @property
    def qemu_binary(self) -> str:
        """The QEMU binary: the one given, else the architecture's."""
        return self.qemu or arch.get(self.arch).qemu_binary

    @property
    def driver_params(self) -> tuple[str, ...]:
        """The driver's module parameters: the coherence model (when not the default, so a
        coherent cluster loads exactly what it did before the setting), then `params`."""
        if self.coherence == envvars.COHERENCE.default:
            return self.params
        return merge_params((f"coherence={self.coherence}",), self.params)

    @property
    def param_map(self) -> dict[str, str]:
        """The module parameters as NAME -> VALUE (a later one of a name wins)."""
        return dict(p.partition("=")[::2] for p in self.params)

    def describe(self) -> str:
        """One line naming every knob that differs from its default (for logs)."""
        parts = []
        for knob in KNOBS:
            value = getattr(self, knob.field)
            if value != knob.var.default:
                shown = " ".join(value) if isinstance(value, tuple) else value
                parts.append(f"{knob.field}={shown}")
        return ", ".join(parts) or "defaults"


#: busy_factor's ceiling: beyond it a wait is a hang, however busy the machine.
BUSY_FACTOR_MAX = 8.0


def busy_factor(load: float | None = None, cpus: int | None = None) -> float:
    """How many times its idle pace this machine runs CPU-bound work now: runnable tasks per
    core (the 1-minute load average over the cores; TCG guests are CPU-bound), between 1 and
    BUSY_FACTOR_MAX.  Other work beside a run makes it slower, not red."""
    load = os.getloadavg()[0] if load is None else load
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    return min(BUSY_FACTOR_MAX, max(1.0, load / max(1, cpus)))


def scaled(
    seconds: float,
    environ: Mapping[str, str] | None = None,
    *,
    scale: float | None = None,
    busy: float | None = None,
) -> float:
    """`seconds` times the timeout scale (`scale`, else $OBMM_TESTBED_TIMEOUT_SCALE) times the
    machine's busy_factor() (or `busy`): a harness's bound on work whose length depends on the
    machine (a boot, a build, a command's progress), never on a behaviour the test proves."""
    if scale is None:
        scale = float(envvars.TIMEOUT_SCALE.get(environ))
    factor = busy_factor() if busy is None else busy
    return seconds * scale * factor


def knob_env_params(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    return tuple(envvars.PARAMS.get(environ))


def merge_params(*groups: Iterable[str]) -> tuple[str, ...]:
    """Parameters of later groups replace those of the same name in earlier ones."""
    merged: dict[str, str] = {}
    for group in groups:
        for param in group:
            name, sep, value = param.partition("=")
            merged.pop(name, None)
            merged[name] = f"{name}{sep}{value}"
    return tuple(merged.values())


# -- argparse ------------------------------------------------------------------------------------


def add_arguments(
    parser: argparse.ArgumentParser | Any,
    fields: Sequence[str] | None = None,
    *,
    defaults_text: Mapping[str, str] | None = None,
) -> None:
    """Add the flags of `fields` (default: every knob).  Unset flags stay None, so that
    :func:`from_args` can tell them from the environment's values."""
    for knob in KNOBS:
        if fields is not None and knob.field not in fields:
            continue
        var = knob.var
        shown = (defaults_text or {}).get(knob.field) or var.shown_default
        help_text = f"{var.help} (${var.name}" + (f"; default {shown})" if shown else ")")
        kwargs: dict[str, Any] = {"dest": knob.field, "default": None, "help": help_text}
        if var.choices:
            kwargs["choices"] = var.choices
        elif knob.metavar:
            kwargs["metavar"] = knob.metavar
        if knob.repeat:
            kwargs["action"] = "append"
        elif var.parse is not envvars.as_text:
            kwargs["type"] = _arg_type(var)
        parser.add_argument(knob.flag, **kwargs)


def _arg_type(var: envvars.Var) -> Any:
    def convert(text: str) -> Any:
        try:
            return var.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid value") from None

    convert.__name__ = var.parse.__name__.removeprefix("as_")
    return convert


def from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, **given: Any
) -> Settings:
    """The environment's settings with the flags that were given (and then `given`) on top."""
    values: dict[str, Any] = {k.field: getattr(args, k.field, None) for k in KNOBS}
    if values["params"] is not None:
        values["params"] = tuple(values["params"])
    values.update({k: v for k, v in given.items() if v is not None})
    return Settings.from_env(environ, **values)


# -- pytest --------------------------------------------------------------------------------------

PYTEST_PREFIX = "--obmm-"


def pytest_flag(knob: Knob) -> str:
    return PYTEST_PREFIX + knob.flag.removeprefix("--")


def add_pytest_options(group: Any, fields: Sequence[str] | None = None) -> None:
    """The same knobs as pytest options (``--obmm-nodes``, ``--obmm-param``, ...)."""
    for knob in KNOBS:
        if fields is not None and knob.field not in fields:
            continue
        var = knob.var
        kwargs: dict[str, Any] = {
            "dest": f"obmm_{knob.field}",
            "default": None,
            "help": f"{var.help} (${var.name})",
        }
        if var.choices:
            kwargs["choices"] = var.choices
        if knob.repeat:
            kwargs["action"] = "append"
        elif var.parse is not envvars.as_text:
            kwargs["type"] = _arg_type(var)
        group.addoption(pytest_flag(knob), **kwargs)


def from_pytest(config: Any, base: Settings | None = None) -> Settings:
    """`base` (default: the environment's settings) with the ``--obmm-*`` options given."""
    base = base if base is not None else Settings.from_env()
    values: dict[str, Any] = {}
    for knob in KNOBS:
        try:
            value = config.getoption(f"obmm_{knob.field}")
        except ValueError:  # an option this run did not register
            value = None
        if knob.repeat and value is not None:
            value = merge_params(base.params, value)
        values[knob.field] = value
    return base.replace(**values)


def set_in_environment(environ: Mapping[str, str] | None = None) -> set[str]:
    """The fields whose variable is set (a front end's own defaults must not override them)."""
    return {k.field for k in KNOBS if k.var.raw(environ) is not None}
