"""What goes into a node before its first test: the payload, the modules, and their loading.

* :func:`payload_tar`: the package, uapi header, guest tests and modules, as one tarball that
  unpacks under :data:`GUEST_ROOT` (one SSH round trip);
* :func:`build_guest_modules`: the driver's modules (:func:`driver_setting`: the emulator of
  kmod/, or upstream's obmm.ko over kmod/ub_compat) built against the guest kernel's headers,
  each .ko pre-flighted on the host so a bad module fails here, not as an insmod error in the
  guest;
* :func:`module_load_order` and :func:`insmod_command`: which module first, with which fabric
  parameters;
* :func:`prepare_node`: all of it on one node.
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath

from obmm import abi
from obmm.testbed import bytecode, kbuild, kmemleak, qemu
from obmm.testbed.errors import TestbedError
from obmm.testbed.image import Image
from obmm.testbed.parallel import on_each
from obmm.testbed.paths import DATA_DIR, kmod_dir, package_dir, upstream_dir
from obmm.testbed.ssh import Connection

log = logging.getLogger(__name__)

GUEST_ROOT = PurePosixPath("/opt/obmm-testbed")
# The runner's deliberately failing self-tests: inside tests/guest (same path in the checkout and
# in the guest) so the guest conftest's kernel-log scan applies; the suites ignore it.
GUEST_SELFTEST = "tests/guest/_selftest"


class ProvisionError(TestbedError, RuntimeError):
    """A node could not be prepared (a module did not load)."""


#: Which driver the nodes load (kbuild.DRIVERS): the emulator (default) or the real obmm.ko.
ENV_DRIVER = "OBMM_TESTBED_DRIVER"
#: The real driver's pool must be full and cleared before a test exports (seconds).
REAL_POOL_READY_TIMEOUT_S = 120
REAL_POOL_SYSFS = "/sys/kernel/obmm_mempool/obmm-0"


def real_driver_params(topology: qemu.Topology) -> dict[str, str]:
    """The real obmm.ko's parameters on the testbed: its pool is all of the memory ub_compat
    hands out (upstream's default is 1G), and after a failed allocation it fills again after
    1 s, not 30 (tests provoke ENOMEM, and the next test needs its pool back)."""
    return {"mempool_size": str(topology.pool_size), "mempool_refill_timeout": "1000"}


def driver_setting(value: str | None = None) -> str:
    """The driver nodes load: ``value``, else ``$OBMM_TESTBED_DRIVER``, else ``emu``."""
    chosen = value or os.environ.get(ENV_DRIVER) or kbuild.DRIVER_EMU
    if chosen not in kbuild.DRIVERS:
        raise ProvisionError(
            f"unknown driver {chosen!r} (from ${ENV_DRIVER} or --driver): "
            f"use one of {', '.join(kbuild.DRIVERS)}"
        )
    return chosen


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


def build_guest_modules(image: Image, out: Path, driver: str | None = None) -> list[Path]:
    """Build the driver's modules against the guest kernel's headers and pre-flight each .ko on
    the host (:mod:`obmm.testbed.kbuild` plus the ELF checks); the .ko files to load.

    ``emu``: kmod/* into ``out`` (ub_compat is built too, as a W=1 check, but not loaded);
    ``real``: the testhook, ub_compat and upstream's obmm.ko (tree: $OBMM_UPSTREAM_DIR or the
    pinned copy; absent: kbuild.UpstreamMissing, one line) into ``out``'s sibling ``-real``.

    A run builds the suites' modules several times over (qemu-test, the cluster suite, the
    hardware proofs): when the sources are those of the last build into `out`, its .ko files
    are used again (still ELF-checked)."""
    from obmm.tools import elfcheck

    real = driver_setting(driver) == kbuild.DRIVER_REAL
    release = image.kernel_release
    # The debug kernel's own build tree, else Debian's headers for the release.
    headers = image.kdir or kbuild.fetch_headers(release)
    # A rebuilt debug kernel keeps its release; its build tree's path names its config.
    key = release if image.kdir is None else f"{release} {image.kdir}"
    if real:
        upstream = kbuild.check_upstream(upstream_dir())
        out = out.with_name(f"{out.name}-{kbuild.DRIVER_REAL}")
        digest = kbuild.real_sources_digest(key, kmod_dir(), upstream)
    else:
        digest = kbuild.sources_digest(key, kmod_dir())
    kos = kbuild.reusable_build(out / release, digest)
    if kos is not None:
        log.info("modules: sources unchanged since the last build, using %s", out / release)
    else:
        if real:
            kos = kbuild.build_real_driver(headers, kmod_dir(), upstream, out / release)
        else:
            kos = kbuild.build_modules(headers, kmod_dir(), out / release)
        kbuild.record_build(out / release, digest, kos)
    symvers = elfcheck.Symvers.load(headers / "Module.symvers")
    exports = {sym for ko in kos for sym in elfcheck.module_exports(ko)}
    for ko in kos:
        elfcheck.require_loadable(
            ko, kernel_release=release, arch="x86_64", symvers_path=symvers, extra_exports=exports
        )
    if not real:
        kos = [ko for ko in kos if ko.stem != kbuild.COMPAT_MODULE]
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
    # The placeholder first: if the driver's load splats, the testhook is already there for the
    # log-scanner tests.  The compat layer before the real driver, which needs its symbols.
    first = (kbuild.TESTHOOK_MODULE, kbuild.COMPAT_MODULE)
    return sorted(
        kos, key=lambda p: (first.index(p.stem) if p.stem in first else len(first), p.stem)
    )


def is_real_driver(modules: Iterable[Path]) -> bool:
    """Whether these modules are the real driver's (the compat layer is loaded with it only)."""
    return any(ko.stem == kbuild.COMPAT_MODULE for ko in modules)


def insmod_command(
    ko: PurePosixPath,
    node: int,
    topology: qemu.Topology,
    params: Iterable[str],
    extra: dict[str, str] | None = None,
) -> str:
    """insmod with the fabric parameters the module declares (see qemu/README.md), and
    ``extra`` ones."""
    wanted = {
        "node_id": str(node),
        "nr_nodes": str(topology.nodes),
        "nodes": str(topology.nodes),
        "pool_base": hex(topology.pool_base),
        "pool_size": hex(topology.pool_size),
        **(extra or {}),
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
    real = is_real_driver(modules)
    for ko in modules:
        remote = GUEST_ROOT / "kmod" / ko.name
        params = conn.run(f"modinfo -F parm {remote} | cut -d: -f1", timeout=60, check=True)
        extra = real_driver_params(topology) if real and ko.stem == "obmm" else {}
        cmd = insmod_command(remote, node, topology, params.out.split(), extra)
        result = conn.run(cmd, timeout=120)
        if not result.ok:
            dmesg = conn.run("dmesg | tail -n 30", timeout=30).out
            raise ProvisionError(f"node{node}: `{cmd}` failed: {result.err.strip()}\n{dmesg}")
        log.info("node%d: %s", node, cmd)
    if real:
        wait_real_pool(conn, node, topology)


def wait_real_pool(conn: Connection, node: int, topology: qemu.Topology) -> None:
    """Wait until the real driver's pool holds all of its memory, cleared: its pool thread fills
    it after load, and an export made before takes uncleared granules in another order (so its
    memory is not one run: ub_compat's pool.c)."""
    want = topology.pool_size
    script = (
        f"d={REAL_POOL_SYSFS}; i=0; while [ $i -lt {REAL_POOL_READY_TIMEOUT_S * 10} ]; do "
        "t=$(($(cat $d/total))); c=$(($(cat $d/available_cleared))); "
        f"[ $t -ge {want} ] && [ $t -eq $c ] && exit 0; sleep 0.1; i=$((i+1)); done; "
        'echo "total $t cleared $c"; exit 1'
    )
    result = conn.run(script, timeout=REAL_POOL_READY_TIMEOUT_S + 30)
    if not result.ok:
        raise ProvisionError(
            f"node{node}: the real driver's pool did not fill to {want:#x} bytes, cleared, "
            f"within {REAL_POOL_READY_TIMEOUT_S} s: {result.out.strip() or result.err.strip()}"
        )
