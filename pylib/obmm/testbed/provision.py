"""What goes into a node before its first test: the payload, the modules, and their loading.

* :func:`payload_tar`: the package, uapi header, guest tests and modules, as one tarball that
  unpacks under :data:`GUEST_ROOT` (one SSH round trip);
* :func:`build_guest_modules`: kmod/* built against the guest kernel's headers, each .ko
  pre-flighted on the host so a bad module fails here, not as an insmod error in the guest;
* :func:`module_load_order` and :func:`insmod_command`: which module first, with which fabric
  parameters and the user's (``--param``);
* :func:`prepare`: all of it on every node (:func:`obmm.testbed.session.bring_up` calls it).
"""

from __future__ import annotations

import io
import logging
import shlex
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from obmm import abi
from obmm.testbed import bytecode, kmemleak, qemu
from obmm.testbed.errors import TestbedError
from obmm.testbed.image import Image
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import DATA_DIR, kmod_dir, package_dir, repo_root
from obmm.testbed.remote import GUEST_ROOT

if TYPE_CHECKING:
    from obmm.testbed.node import Node

log = logging.getLogger(__name__)

# The runner's deliberately failing self-tests: inside tests/guest (same path in the checkout and
# in the guest) so the guest conftest's kernel-log scan applies; the suites ignore it.
GUEST_SELFTEST = "tests/guest/_selftest"


class ProvisionError(TestbedError, RuntimeError):
    """A node could not be prepared (a module did not load)."""


#: What goes to a guest from the root (a checkout or the installed package data), beside the
#: package itself; setup.py ships the same files in the wheel.
PAYLOAD = ("pyproject.toml", "uapi", "tests/guest", "tests/c", "examples/c")


def payload_tar(root: Path, modules: Sequence[Path] = ()) -> bytes:
    """The files a guest needs, as a gzip tarball (one SSH round trip to unpack).

    ``pylib/obmm`` is the root's package in a checkout, else the running one (an installed
    wheel), without its package data."""
    buf = io.BytesIO()

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name.rsplit("/", 1)[-1]
        if name in ("__pycache__", ".pytest_cache", ".mypy_cache") or name.endswith(".pyc"):
            return None
        if info.name == f"pylib/obmm/{DATA_DIR}":
            return None
        if info.name.startswith("examples/c/") and not info.name.endswith((".c", ".h", "Makefile")):
            return None  # built examples
        return info

    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        package = root / "pylib" / "obmm"
        package = package if package.is_dir() else package_dir()
        tar.add(package, arcname="pylib/obmm", filter=skip)
        with tempfile.TemporaryDirectory(prefix="obmm-payload-") as tmp:
            # The bindings' declarations parsed here once, not by every guest process.
            precompiled = Path(tmp) / f"{abi.PRECOMPILED_MODULE}.py"
            abi.emit_precompiled(precompiled)
            arc = f"pylib/obmm/{precompiled.name}"
            tar.add(precompiled, arcname=arc)
            # A node's first imports then compile nothing (about a second of CPU under TCG).
            sources = [*_package_sources(package, "pylib/obmm"), (precompiled, arc)]
            bytecode.add_compiled(tar, sources)
        for rel in PAYLOAD:
            path = root / rel
            if path.exists():
                tar.add(path, arcname=rel, filter=skip)
        for conftest in ("tests/conftest.py", "tests/__init__.py"):
            if (root / conftest).exists():
                tar.add(root / conftest, arcname=conftest, filter=skip)
        for ko in modules:
            tar.add(ko, arcname=f"kmod/{ko.name}")
    return buf.getvalue()


def _package_sources(package: Path, arcname: str) -> Iterable[tuple[Path, str]]:
    for src in sorted(package.rglob("*.py")):
        rel = src.relative_to(package)
        if rel.parts[0] == DATA_DIR or "__pycache__" in rel.parts:
            continue
        yield src, f"{arcname}/{rel.as_posix()}"


def build_guest_modules(image: Image, out: Path) -> list[Path]:
    """Build kmod/* against the guest kernel's headers and pre-flight each .ko on the host
    (:func:`obmm.testbed.kbuild.build_modules` plus the ELF checks).

    A run builds the suites' modules several times over (qemu-test, the cluster suite, the
    hardware proofs): when the sources are those of the last build into `out`, its .ko files
    are used again (still ELF-checked)."""
    from obmm.testbed import kbuild
    from obmm.tools import elfcheck

    release = image.kernel_release
    # The debug kernel's own build tree, else Debian's headers for the release.
    headers = image.kdir or kbuild.fetch_headers(release)
    # A rebuilt debug kernel keeps its release; its build tree's path names its config.
    digest = kbuild.sources_digest(
        release if image.kdir is None else f"{release} {image.kdir}", kmod_dir()
    )
    kos = kbuild.reusable_build(out / release, digest)
    if kos is not None:
        log.info("modules: sources unchanged since the last build, using %s", out / release)
    else:
        kos = kbuild.build_modules(headers, kmod_dir(), out / release)
        kbuild.record_build(out / release, digest, kos)
    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    for ko in kos:
        elfcheck.require_loadable(
            ko, kernel_release=release, arch="x86_64", symvers_path=symvers, extra_exports=exports
        )
    return kos


DRIVER_STEMS = ("obmm_emu", "obmm")


def module_load_order(kos: Iterable[Path]) -> list[Path]:
    # The placeholder first: if the emulated driver's load splats, the testhook is already
    # there for the log-scanner tests.
    return sorted(kos, key=lambda p: (p.stem != "obmm_testhook", p.stem))


#: The UB controllers every node gets, named as on UB hosts (ub_bus_controller0/00001 and
#: ub_bus_controller1/00002: the paths ubs-test reads); the emulator's ``ubc_dev`` parameter.
UB_CONTROLLERS = ("00001", "00002")


def insmod_command(
    ko: PurePosixPath,
    node: int,
    topology: qemu.Topology,
    declared: Iterable[str],
    params: Sequence[str] = (),
) -> str:
    """insmod with the fabric parameters the module declares (see qemu/README.md), then
    `params` (NAME=VALUE, the user's: they win over the fabric's of the same name)."""
    wanted = {
        "node_id": str(node),
        "nr_nodes": str(topology.nodes),
        "nodes": str(topology.nodes),
        "pool_base": hex(topology.pool_base),
        "pool_size": hex(topology.pool_size),
        "ubc_dev": ",".join(UB_CONTROLLERS),
    }
    declared = set(declared)
    args = {k: v for k, v in wanted.items() if k in declared}
    for param in params:
        name, _, value = param.partition("=")
        args.pop(name, None)
        args[name] = value
    words = [shlex.quote(f"{k}={v}") for k, v in args.items()]
    return " ".join(["insmod", shlex.quote(str(ko)), *words])


#: Where a UB host's obmm.ko lives (``/lib/modules/$(uname -r)/obmm/obmm.ko``: what ubs-test
#: insmods); every module of the payload is installed there and indexed, so ``modprobe`` finds it.
MODULE_INSTALL_DIR = "/lib/modules/$(uname -r)/obmm"


def install_command(modules: Sequence[Path]) -> str:
    """Copy the payload's modules to :data:`MODULE_INSTALL_DIR`; depmod unless the index knows
    each of them already, without dependencies.

    The Debian image's index has the entries (qemu/debian/customize.sh): depmod reads every
    module of the tree, about 25 s under TCG.  A module it does not know (another image, the
    debug kernel's release, which has no module of its own) or one that depends on others
    (a stale entry would miss them) makes the index be rebuilt."""
    kos = " ".join(str(GUEST_ROOT / "kmod" / ko.name) for ko in modules)
    checks = " ".join(
        f'modprobe -nq {ko.stem} && [ -z "$(modinfo -F depends {MODULE_INSTALL_DIR}/{ko.name})" ]'
        " || stale=1;"
        for ko in modules
    )
    # depmod warns about a release without modules.order or modules.builtin (the debug
    # kernel's): the index it writes still has ours.
    return (
        f"mkdir -p {MODULE_INSTALL_DIR} && cp {kos} {MODULE_INSTALL_DIR}/"
        f' && {{ stale=; {checks} [ -z "$stale" ] || depmod -a 2>/dev/null; }}'
    )


def check_params(ko: Path, declared: Iterable[str], params: Sequence[str]) -> None:
    """Refuse, before loading, a parameter the module does not declare."""
    declared = sorted(set(declared))
    unknown = [p.partition("=")[0] for p in params if p.partition("=")[0] not in declared]
    if unknown:
        raise ProvisionError(
            f"{ko.stem} has no parameter {', '.join(unknown)} "
            f"(its parameters: {', '.join(declared) or 'none'})"
        )


def prepare(
    nodes: Sequence[Node],
    topology: qemu.Topology,
    modules: Sequence[Path],
    *,
    params: Sequence[str] = (),
    root: Path | None = None,
) -> None:
    """The payload (one archive for all) and the modules, on every node at once; `params`
    go to the driver module."""
    payload = payload_tar(root or repo_root(), modules)

    def one(node: Node) -> None:
        unpack_payload(node, payload, modules)
        load_modules(node, topology, modules, params=params)

    on_each(nodes, one)


def push_payload(nodes: Sequence[Node], modules: Sequence[Path], root: Path | None = None) -> None:
    """A fresh payload on every node, the modules loaded left as they are (attaching)."""
    payload = payload_tar(root or repo_root(), modules)
    on_each(nodes, lambda node: unpack_payload(node, payload, modules))


def unpack_payload(node: Node, payload: bytes, modules: Sequence[Path] = ()) -> None:
    """Replace the node's copy of the package, tests and modules (under GUEST_ROOT); install
    `modules` where a UB host has them (:func:`install_command`)."""
    node.run(
        f"rm -rf {GUEST_ROOT} && mkdir -p {GUEST_ROOT} && tar -xzf - -C {GUEST_ROOT}"
        # The debug kernel: what boot left unreferenced is not the modules' (else a no-op).
        f" && {{ {kmemleak.BASELINE_CMD}; }}"
        + (f" && {install_command(modules)}" if modules else ""),
        timeout=kmemleak.SCAN_TIMEOUT_S,
        check=True,
        stdin=payload,
        bare=True,
    )


def unload_modules(node: Node, modules: Sequence[Path]) -> None:
    """rmmod the loaded ones of `modules`, last loaded first (the driver, then the testhook);
    a module still in use is a ProvisionError with rmmod's reason."""
    for ko in reversed(modules):
        cmd = f"[ ! -d /sys/module/{ko.stem} ] || rmmod {ko.stem}"
        result = node.run(cmd, timeout=120, bare=True)
        if not result.ok:
            raise ProvisionError(f"{node.name}: rmmod {ko.stem} failed: {result.err.strip()}")


def load_modules(
    node: Node, topology: qemu.Topology, modules: Sequence[Path], *, params: Sequence[str] = ()
) -> None:
    """insmod each module (from the payload) with its fabric parameters; `params` go to the
    driver module and must be ones it declares."""
    for ko in modules:
        remote = GUEST_ROOT / "kmod" / ko.name
        declared = node.run(
            f"modinfo -F parm {remote} | cut -d: -f1", timeout=60, check=True, bare=True
        ).out.split()
        extra = list(params) if ko.stem in DRIVER_STEMS else []
        check_params(ko, declared, extra)
        cmd = insmod_command(remote, node.index, topology, declared, extra)
        result = node.run(cmd, timeout=120, bare=True)
        if not result.ok:
            dmesg = node.run("dmesg | tail -n 30", timeout=30, bare=True).out
            raise ProvisionError(f"{node.name}: `{cmd}` failed: {result.err.strip()}\n{dmesg}")
        log.info("%s: %s", node.name, cmd)
