"""Provisioning for ubs-mem programs: our UBSE on every node, then the user's ubs-mem build.

``--ubs-mem PREFIX`` (:class:`~obmm.testbed.settings.Settings` ``ubs_mem``; ``up``, ``run`` and
the pytest plugin come up through :func:`obmm.testbed.session.bring_up`) makes every node:

1. build our ``libubse-client.so.1`` from the payload's ``ubse/`` and install it where ubsmd
   loads it by fixed path, ``/usr/lib64/libubse-client.so.1`` (ubs-mem
   src/under_api/ubse/ubse_mem_adapter.cpp:UbseMemAdapter::Initialize);
2. run our UBSE service (``python -m obmm.ubse serve``; node 0's is the master);
3. receive PREFIX as ``/usr/local/ubs_mem``, where ubs-mem's package installs (ubs-mem
   script/rpm/ubs_mem.spec: ``lib``, ``bin``, ``config``, ``include``), and run ``ubsmd`` as its
   unit does (script/rpm/ubsmd.service: ``bin/ubsmd -binpath=/usr/local/ubs_mem``,
   ``LD_LIBRARY_PATH=/usr/local/ubs_mem/lib:/usr/lib64``, runtime directory ``/run/matrix``);
   ours runs it as root, not as the ``ubsmd`` user the package creates;
4. wait until the SDK answers: ``ubse/ubsm_probe.c`` (ours), built against PREFIX's
   ``include/`` and ``lib/``, initializes the SDK and looks up the cluster.

The project never builds ubs-mem: PREFIX is the user's build.  What is missing from it is one
line (:class:`UbsMemError`).  docs/ubs-mem.md says how to bring an SDK program.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from obmm import envvars
from obmm.testbed.node import Node
from obmm.testbed.parallel import on_each
from obmm.testbed.provision import ProvisionError
from obmm.testbed.remote import GUEST_ROOT

UBSE_LIB = PurePosixPath("/usr/lib64/libubse-client.so.1")
UBSMEM_ROOT = PurePosixPath("/usr/local/ubs_mem")
WORK = PurePosixPath("/var/tmp/obmm-ubse")
#: What a ubs-mem build must hold (relative to PREFIX), and what each is.
REQUIRED: tuple[tuple[str, str], ...] = (
    ("bin/ubsmd", "the daemon"),
    ("lib/libubsm_sdk.so*", "the SDK library"),
    ("include/ubs_mem.h", "the SDK header"),
)
SERVICE_READY_S = 60.0
SDK_READY_S = 180.0


class UbsMemError(ProvisionError):
    """A ubs-mem build that is not usable, or a node where it did not come up."""


def missing(prefix: Path) -> list[str]:
    """What PREFIX lacks, as `path (what)`; empty when it has everything."""
    if not prefix.is_dir():
        return [f"{prefix} (not a directory)"]
    return [f"{rel} ({what})" for rel, what in REQUIRED if not list(prefix.glob(rel))]


def check_prefix(prefix: Path) -> None:
    lacks = missing(prefix)
    if lacks:
        raise UbsMemError(
            f"--ubs-mem {prefix}: no {', no '.join(lacks)}; give the directory your ubs-mem "
            f"build installs as {UBSMEM_ROOT} (bin/ubsmd, lib/libubsm_sdk.so, include/)"
        )


def build_ubse_command(root: PurePosixPath = GUEST_ROOT) -> str:
    """Build our library on the node from the payload; install it where ubsmd loads it."""
    return (
        f"make -s -C {root / 'ubse'} O={WORK} && "
        f"install -D -m 0755 {WORK}/libubse-client.so.1 {UBSE_LIB}"
    )


def background(command: str, name: str) -> str:
    """`command` detached from the SSH session (it outlives `up`), its output in /tmp/NAME.log,
    its pid in WORK/NAME.pid (`command` ends in an exec, so the pid is the program's)."""
    return (
        f"nohup setsid sh -c {shlex.quote(command)} </dev/null >/tmp/{name}.log 2>&1 & "
        f"echo $! > {WORK}/{name}.pid"
    )


def serve_command(master: str | None, block_mib: int | None) -> str:
    """The service on a node ($OBMM_NODE_ADDR is its address); `master` None: it is the master."""
    words = ["exec python3 -m obmm.ubse serve", f"--ready-file {WORK}/ready"]
    if master:
        words.append(f"--master {shlex.quote(master)}")
    if block_mib is not None:
        words.append(f"--block-mib {block_mib}")
    return " ".join(words)


def install_command(staged: PurePosixPath) -> str:
    return (
        f"rm -rf {UBSMEM_ROOT} && mkdir -p {UBSMEM_ROOT.parent} && mv {staged} {UBSMEM_ROOT} && "
        "mkdir -p /run/matrix /var/log/ubsm"
    )


def ubsmd_command() -> str:
    return (
        f"exec env LD_LIBRARY_PATH={UBSMEM_ROOT}/lib:/usr/lib64 "
        f"{UBSMEM_ROOT}/bin/ubsmd -binpath={UBSMEM_ROOT}"
    )


def probe_build_command(root: PurePosixPath = GUEST_ROOT) -> str:
    return (
        f"gcc -O2 -std=gnu11 -I{UBSMEM_ROOT}/include -o {WORK}/ubsm_probe "
        f"{root / 'ubse' / 'ubsm_probe.c'} -L{UBSMEM_ROOT}/lib -lubsm_sdk "
        f"-Wl,-rpath,{UBSMEM_ROOT}/lib"
    )


def wait_file_command(path: PurePosixPath, within: float) -> str:
    """Exit 0 once `path` exists, 1 when it has not within `within` seconds."""
    return (
        f"t=0; while [ ! -e {path} ] && [ $t -lt {int(within * 5)} ]; do sleep 0.2; "
        f"t=$((t+1)); done; test -e {path}"
    )


def _wait_file(node: Node, path: PurePosixPath, within: float, log: str) -> None:
    res = node.run(wait_file_command(path, within), timeout=within + 30)
    if not res.ok:
        tail = node.run(f"tail -n 5 /tmp/{log}.log").out.strip().replace("\n", " | ")
        raise UbsMemError(f"{node.name}: {log} not ready in {within:.0f} s: {tail}")


def start_ubse(
    nodes: Sequence[Node], *, block_mib: int | None = None, root: PurePosixPath = GUEST_ROOT
) -> None:
    """Our library on every node, and the services (node 0's first: the master)."""

    def build(node: Node) -> None:
        res = node.run(
            f"rm -rf {WORK} && mkdir -p {WORK} && {build_ubse_command(root)}", timeout=300
        )
        if not res.ok:
            raise UbsMemError(f"{node.name}: our libubse-client.so.1 did not build: {res.err}")

    on_each(list(nodes), build)
    master = nodes[0].addr
    for i, node in enumerate(nodes):
        node.run(background(serve_command(None if i == 0 else master, block_mib), "ubse"))
        _wait_file(node, WORK / "ready", SERVICE_READY_S, "ubse")


def stop(nodes: Sequence[Node]) -> None:
    """Stop what start_ubse and provision started (by their pids); remove what they installed."""
    pids = f"$(cat {WORK}/ubse.pid {WORK}/ubsmd.pid 2>/dev/null)"
    on_each(
        list(nodes),
        lambda node: node.run(f"kill {pids} 2>/dev/null; rm -rf {WORK} {UBSE_LIB} {UBSMEM_ROOT}"),
    )


def wait_sdk(node: Node, within: float = SDK_READY_S) -> None:
    """Until the SDK on `node` initializes and sees the cluster (bounded)."""
    deadline = time.monotonic() + within
    while True:
        res = node.run(f"{WORK}/ubsm_probe", timeout=60)
        if res.ok:
            return
        if time.monotonic() >= deadline:
            raise UbsMemError(
                f"{node.name}: the ubs-mem SDK did not answer in {within:.0f} s: "
                f"{(res.out + res.err).strip().splitlines()[-1:]} (ubsmd's log: /var/log/ubsm)"
            )
        time.sleep(2)


def provision(
    nodes: Sequence[Node],
    prefix: Path,
    *,
    block_mib: int | None = None,
    root: PurePosixPath = GUEST_ROOT,
) -> None:
    """Our UBSE and the ubs-mem build at `prefix` on every node, ubsmd running, the SDK up."""
    check_prefix(prefix)
    if block_mib is None:
        block_mib = envvars.UBSE_BLOCK_MIB.get()
    start_ubse(nodes, block_mib=block_mib, root=root)

    def install(node: Node) -> None:
        stage = WORK / "stage"
        node.run(f"rm -rf {stage} && mkdir -p {stage}", check=True)
        node.put(prefix, stage)  # PREFIX's contents become stage's
        res = node.run(f"{install_command(stage)} && {probe_build_command(root)}", timeout=300)
        if not res.ok:
            raise UbsMemError(f"{node.name}: installing {prefix} failed: {res.err.strip()}")
        node.run(background(ubsmd_command(), "ubsmd"), check=True)

    on_each(list(nodes), install)
    on_each(list(nodes), wait_sdk)
