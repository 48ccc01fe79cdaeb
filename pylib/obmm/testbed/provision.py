"""What goes into a node before its first test: the payload, the modules, and their loading.

* :func:`payload_tar`: the package, uapi header, guest tests and modules, as one tarball that
  unpacks under :data:`GUEST_ROOT` (one SSH round trip);
* :func:`build_guest_modules`: kmod/* built against the guest kernel's headers, each .ko
  pre-flighted on the host so a bad module fails here, not as an insmod error in the guest;
* :func:`module_load_order` and :func:`insmod_command`: which module first, with which fabric
  parameters;
* :func:`prepare_node`: all of it on one node.
"""

from __future__ import annotations

import io
import logging
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath

from obmm import abi
from obmm.testbed import bytecode, kmemleak, qemu
from obmm.testbed.errors import TestbedError
from obmm.testbed.image import Image
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import DATA_DIR, kmod_dir, package_dir
from obmm.testbed.ssh import Connection

log = logging.getLogger(__name__)

GUEST_ROOT = PurePosixPath("/opt/obmm-testbed")
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


#: The make variable of the suites' build: obmm_emu with its test-only module parameters
#: (kmod/obmm_emu/obmm_emu.h, "Test hooks"); every other bring-up loads the module users load.
TEST_HOOKS_VARS = {"OBMM_EMU_TEST": "y"}
#: Where the suites' build goes, under the `out` of :func:`build_guest_modules`.
TEST_HOOKS_DIR = "test-hooks"


def build_guest_modules(image: Image, out: Path, *, test_hooks: bool = False) -> list[Path]:
    """Build kmod/* against the guest kernel's headers and pre-flight each .ko on the host
    (:func:`obmm.testbed.kbuild.build_modules` plus the ELF checks).  ``test_hooks``: the
    suites' build, with the test-only module parameters, into ``out/test-hooks``.

    A run builds the suites' modules several times over (qemu-test, the cluster suite, the
    hardware proofs): when the sources are those of the last build into `out`, its .ko files
    are used again (still ELF-checked)."""
    from obmm.testbed import kbuild
    from obmm.tools import elfcheck

    release = image.kernel_release
    if test_hooks:
        out = out / TEST_HOOKS_DIR
    # The debug kernel's own build tree, else Debian's headers for the release.
    headers = image.kdir or kbuild.fetch_headers(release)
    # A rebuilt debug kernel keeps its release; its build tree's path names its config.
    key = release if image.kdir is None else f"{release} {image.kdir}"
    digest = kbuild.sources_digest(key + (" test-hooks" if test_hooks else ""), kmod_dir())
    kos = kbuild.reusable_build(out / release, digest)
    if kos is not None:
        log.info("modules: sources unchanged since the last build, using %s", out / release)
    else:
        kos = kbuild.build_modules(
            headers, kmod_dir(), out / release, make_vars=TEST_HOOKS_VARS if test_hooks else None
        )
        kbuild.record_build(out / release, digest, kos)
    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    for ko in kos:
        elfcheck.require_loadable(
            ko, kernel_release=release, arch="x86_64", symvers_path=symvers, extra_exports=exports
        )
    return kos


def prepare_nodes(
    connect: Callable[[int], Connection],
    topology: qemu.Topology,
    root: Path,
    modules: Sequence[Path],
) -> None:
    """:func:`prepare_node` on every node at once, with one payload archive for all."""
    payload = payload_tar(root, modules)

    def one(i: int) -> None:
        with connect(i) as conn:
            prepare_node(conn, i, topology, root, modules, payload=payload)

    on_each(range(topology.nodes), one)


def module_load_order(kos: Iterable[Path]) -> list[Path]:
    # The placeholder first: if the emulated driver's load splats, the testhook is already
    # there for the log-scanner tests.
    return sorted(kos, key=lambda p: (p.stem != "obmm_testhook", p.stem))


def insmod_command(
    ko: PurePosixPath, node: int, topology: qemu.Topology, params: Iterable[str]
) -> str:
    """insmod with the fabric parameters the module declares (see qemu/README.md)."""
    wanted = {
        "node_id": str(node),
        "nr_nodes": str(topology.nodes),
        "nodes": str(topology.nodes),
        "pool_base": hex(topology.pool_base),
        "pool_size": hex(topology.pool_size),
    }
    declared = set(params)
    args = [f"{k}={v}" for k, v in wanted.items() if k in declared]
    return " ".join(["insmod", str(ko), *args])


def prepare_node(
    conn: Connection,
    node: int,
    topology: qemu.Topology,
    root: Path,
    modules: Sequence[Path],
    *,
    payload: bytes | None = None,
) -> None:
    """Copy the package, tests and modules into a guest and load the modules."""
    if payload is None:
        payload = payload_tar(root, modules)
    conn.run(
        f"rm -rf {GUEST_ROOT} && mkdir -p {GUEST_ROOT} && tar -xzf - -C {GUEST_ROOT}"
        # The debug kernel: what boot left unreferenced is not the modules' (else a no-op).
        f" && {{ {kmemleak.BASELINE_CMD}; }}",
        timeout=kmemleak.SCAN_TIMEOUT_S,
        check=True,
        stdin=payload,
    )
    for ko in modules:
        remote = GUEST_ROOT / "kmod" / ko.name
        params = conn.run(f"modinfo -F parm {remote} | cut -d: -f1", timeout=60, check=True)
        cmd = insmod_command(remote, node, topology, params.out.split())
        result = conn.run(cmd, timeout=120)
        if not result.ok:
            dmesg = conn.run("dmesg | tail -n 30", timeout=30).out
            raise ProvisionError(f"node{node}: `{cmd}` failed: {result.err.strip()}\n{dmesg}")
        log.info("node%d: %s", node, cmd)
