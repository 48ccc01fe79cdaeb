"""What goes into a node before its first test: the payload, the modules, and their loading.

* :func:`payload_tar`: the package, uapi header, guest tests and modules, as one tarball that
  unpacks under :data:`GUEST_ROOT` (one SSH round trip);
* :func:`build_guest_modules`: the driver's modules (the settings' ``driver``: the emulator of
  kmod/, or upstream's obmm.ko over kmod/ub_compat) built against the guest kernel's headers,
  each .ko pre-flighted on the host so a bad module fails here, not as an insmod error in the
  guest;
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
from obmm.testbed import arch
from obmm.testbed.builds import bytecode, kbuild
from obmm.testbed.builds.image import Image, kernel_tree
from obmm.testbed.errors import TestbedError
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import DATA_DIR, kmod_dir, package_dir, repo_root, ub_upstream_dir
from obmm.testbed.remote import GUEST_ROOT
from obmm.testbed.topology import Topology
from obmm.testbed.vm import kmemleak

if TYPE_CHECKING:
    from obmm.testbed.node import Node

log = logging.getLogger(__name__)

# The runner's deliberately failing self-tests: inside tests/guest (same path in the checkout and
# in the guest) so the guest conftest's kernel-log scan applies; the suites ignore it.
GUEST_SELFTEST = "tests/guest/_selftest"


class ProvisionError(TestbedError, RuntimeError):
    """A node could not be prepared (a module did not load)."""


#: The real driver's pool must be full and cleared before a test exports (seconds).
REAL_POOL_READY_TIMEOUT_S = 120
REAL_POOL_SYSFS = "/sys/kernel/obmm_mempool/obmm-0"


def real_driver_params(topology: Topology) -> dict[str, str]:
    """The real obmm.ko's parameters on the testbed: its pool is all of the memory ub_compat
    hands out (upstream's default is 1G), and after a failed allocation it fills again after
    1 s, not 30 (tests provoke ENOMEM, and the next test needs its pool back)."""
    return {"mempool_size": str(topology.pool_size), "mempool_refill_timeout": "1000"}


#: What goes to a guest from the root (a checkout or the installed package data), beside the
#: package itself; setup.py ships the same files in the wheel.
PAYLOAD = ("pyproject.toml", "uapi", "tests/guest", "tests/c", "examples/c", "ubse")


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


#: The make variable of the suites' build: obmm_emu with its test-only module parameters
#: (kmod/obmm_emu/obmm_emu.h, "Test hooks"); every other bring-up loads the module users load.
TEST_HOOKS_VARS = {"OBMM_EMU_TEST": "y"}
#: Where the suites' build goes, under the `out` of :func:`build_guest_modules`.
TEST_HOOKS_DIR = "test-hooks"


def build_guest_modules(
    image: Image, out: Path, driver: str = kbuild.DRIVER_EMU, *, test_hooks: bool = False
) -> list[Path]:
    """Build the driver's modules against the guest kernel's headers and pre-flight each .ko on
    the host (:mod:`obmm.testbed.builds.kbuild` plus the ELF checks); the .ko files to load.

    ``emu``: kmod/* into ``out`` (ub_compat is built too, as a W=1 check, but not loaded);
    ``test_hooks``: the suites' build of it, with the test-only module parameters, into
    ``out/test-hooks``.  ``real``: the testhook, ub_compat and upstream's obmm.ko (tree:
    $OBMM_UB_UPSTREAM; not given: kbuild.UpstreamMissing, one line) into
    ``out``'s sibling ``-real`` (the real driver has no test hooks).

    A run builds the suites' modules several times over (qemu-test, the cluster suite, the
    hardware proofs): when the sources are those of the last build into `out`, its .ko files
    are used again (still ELF-checked)."""
    from obmm.testbed.builds import elfcheck

    real = driver == kbuild.DRIVER_REAL
    release = image.kernel_release
    test_hooks = test_hooks and not real
    if test_hooks:
        out = out / TEST_HOOKS_DIR
    # The debug kernel's own build tree, else Debian's headers for the release.
    headers = kernel_tree(image)
    # A foreign architecture's modules are cross-built (obmm.testbed.arch).
    cross = arch.kbuild_vars(image.arch)
    # A rebuilt debug kernel keeps its release; its build tree's path names its config.
    key = release if image.kdir is None else f"{release} {image.kdir}"
    if real:
        upstream = kbuild.check_upstream(ub_upstream_dir())
        out = out.with_name(f"{out.name}-{kbuild.DRIVER_REAL}")
        digest = kbuild.real_sources_digest(key, kmod_dir(), upstream)
    else:
        digest = kbuild.sources_digest(key + (" test-hooks" if test_hooks else ""), kmod_dir())
    kos = kbuild.reusable_build(out / release, digest)
    if kos is not None:
        log.info("modules: sources unchanged since the last build, using %s", out / release)
    else:
        if real:
            kos = kbuild.build_real_driver(
                headers, kmod_dir(), upstream, out / release, make_vars=cross or None
            )
        else:
            kos = kbuild.build_modules(
                headers, kmod_dir(), out / release,
                make_vars={**(TEST_HOOKS_VARS if test_hooks else {}), **cross} or None,
            )  # fmt: skip
        kbuild.record_build(out / release, digest, kos)
    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    for ko in kos:
        elfcheck.require_loadable(
            ko,
            kernel_release=release,
            arch=image.arch.machine,
            symvers_path=symvers,
            extra_exports=exports,
        )
    if not real:
        kos = [ko for ko in kos if ko.stem != kbuild.COMPAT_MODULE]
    return kos


DRIVER_STEMS = ("obmm_emu", "obmm")


def module_load_order(kos: Iterable[Path]) -> list[Path]:
    # The placeholder first: if the driver's load splats, the testhook is already there for the
    # log-scanner tests.  The compat layer before the real driver, which needs its symbols.
    first = (kbuild.TESTHOOK_MODULE, kbuild.COMPAT_MODULE)
    return sorted(
        kos, key=lambda p: (first.index(p.stem) if p.stem in first else len(first), p.stem)
    )


#: The UB controllers every node gets, named as on UB hosts (ub_bus_controller0/00001 and
#: ub_bus_controller1/00002: the paths ubs-test reads); the emulator's ``ubc_dev`` parameter.
UB_CONTROLLERS = ("00001", "00002")


def insmod_command(
    ko: PurePosixPath,
    node: int,
    topology: Topology,
    declared: Iterable[str],
    params: Sequence[str] = (),
) -> str:
    """insmod with the fabric parameters the module declares (see docs/testbed.md), then
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
    topology: Topology,
    modules: Sequence[Path],
    *,
    params: Sequence[str] = (),
    root: Path | None = None,
    driver: str = kbuild.DRIVER_EMU,
) -> None:
    """The payload (one archive for all) and the modules, on every node at once; `params`
    go to the driver module."""
    payload = payload_tar(root or repo_root(), modules)

    def one(node: Node) -> None:
        unpack_payload(node, payload, modules)
        load_modules(node, topology, modules, params=params, driver=driver)

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
    node: Node,
    topology: Topology,
    modules: Sequence[Path],
    *,
    params: Sequence[str] = (),
    driver: str = kbuild.DRIVER_EMU,
) -> None:
    """insmod each module (from the payload) with its fabric parameters; `params` go to the
    driver module and must be ones it declares.  The real driver (`driver`) gets its testbed
    parameters first (the user's win) and is waited for until its pool is full."""
    real = driver == kbuild.DRIVER_REAL
    if real:
        params = [*(f"{k}={v}" for k, v in real_driver_params(topology).items()), *params]
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
    if real:
        wait_real_pool(node, topology)


def wait_real_pool(
    node: Node, topology: Topology, timeout: float = REAL_POOL_READY_TIMEOUT_S
) -> None:
    """Wait until the real driver's pool holds all of its memory and what it does not use is
    cleared: its pool thread fills it after load and refills it after an unexport or a failed
    allocation, and an export made before takes uncleared granules in another order (so its
    memory is not one run: ub_compat's pool.c).  At load nothing is used."""
    want = topology.pool_size
    script = (
        f"d={REAL_POOL_SYSFS}; i=0; while [ $i -lt {int(timeout * 10)} ]; do "
        "t=$(($(cat $d/total))); u=$(($(cat $d/used))); c=$(($(cat $d/available_cleared))); "
        f"[ $t -ge {want} ] && [ $c -eq $((t - u)) ] && exit 0; sleep 0.1; i=$((i+1)); done; "
        'echo "total $t used $u cleared $c"; exit 1'
    )
    result = node.run(script, timeout=timeout + 30, bare=True)
    if not result.ok:
        raise ProvisionError(
            f"{node.name}: the real driver's pool did not fill to {want:#x} bytes, cleared, "
            f"within {timeout:.0f} s: {result.out.strip() or result.err.strip()}"
        )
