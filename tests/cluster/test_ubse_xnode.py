"""Our UBSE on two nodes: libubse-client.so.1 called as ubsmd calls it, shared memory for real.

The nodes come up as --ubs-mem brings them up (obmm.testbed.ubsmem.provision, here with a
stand-in ubs-mem build of ours): each builds our library (ubse/) and installs it at
/usr/lib64/libubse-client.so.1, runs its service (python -m obmm.ubse serve; node 0's is the
master), and the stand-in SDK answers.  The harness (guest_side/ubse_harness.c) dlopens the
library and resolves the 26 functions as ubsmd does.  Node 0 lends: the create exports there,
one memid per 4 MiB block; node 1 attaches: its service imports every block at the decoder
address the UBA gives, and the harness maps the shmdevs and reads node 0's bytes.  The error
paths give UBSE's codes (obmm.ubse.codes).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xharness import ClusterHarness

from obmm.testbed import ubsmem
from obmm.testbed.parallel import on_each
from obmm.ubse import codes

A, B = 0, 1
MIB = 1 << 20
BLOCK_MIB = 4
HARNESS = "/usr/local/bin/ubse_harness"  # where any user may run it (the 1003 case)
SEED = 7
GUEST_SIDE = Path(__file__).parent / "guest_side"

pytestmark = pytest.mark.testbed_fabric


class Ubse:
    def __init__(self, xc: ClusterHarness) -> None:
        self.xc = xc
        self.slot: dict[int, int] = {}

    def call(self, node: int, *args: str, user: str = "") -> dict[str, Any]:
        argv = " ".join(shlex.quote(a) for a in (HARNESS, *args))
        if user:
            argv = f"setpriv --reuid={user} --regid=nogroup --clear-groups {argv}"
        res = self.xc.run(node, argv, timeout=300, check=False)
        assert res.ok, f"node{node}: {argv}: {res.err}"
        return dict(json.loads(res.out.strip().splitlines()[-1]))

    def shmdevs(self, node: int, mem_ids: list[int]) -> list[bool]:
        out = self.xc.run(node, " ; ".join(f"test -e /dev/obmm_shmdev{m} && echo y || echo n"
                                           for m in mem_ids)).out.split()  # fmt: skip
        return [w == "y" for w in out]


def standin_build(root: Path) -> Path:
    """A directory shaped like a ubs-mem build (bin/ubsmd, lib/libubsm_sdk.so, include/) holding
    stand-ins of ours: a daemon that only sleeps and an SDK that asks our UBSE for its nodes."""
    prefix = root / "ubs_mem"
    for sub in ("bin", "lib", "include"):
        (prefix / sub).mkdir(parents=True)
    (prefix / "bin" / "ubsmd").write_text("#!/bin/sh\nexec sleep 100000\n")
    (prefix / "bin" / "ubsmd").chmod(0o755)
    shutil.copy(GUEST_SIDE / "ubsm_standin.h", prefix / "include" / "ubs_mem.h")
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-fPIC", "-shared",
         f"-I{prefix / 'include'}", "-o", str(prefix / "lib" / "libubsm_sdk.so"),
         str(GUEST_SIDE / "ubsm_standin.c"), "-ldl"],
        check=True,
    )  # fmt: skip
    return prefix


@pytest.fixture(scope="module")
def ubse(xc: ClusterHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ubse]:
    """--ubs-mem's provisioning (obmm.testbed.ubsmem.provision) with a stand-in build: our
    library built and installed on each node, the services started (node 0's the master), the
    build installed, its daemon started, the SDK's answer awaited; then the harness built."""
    nodes = [A, B]
    guests = [xc.node(n) for n in nodes]
    prefix = standin_build(tmp_path_factory.mktemp("ubsm"))
    try:
        ubsmem.provision(guests, prefix, block_mib=BLOCK_MIB, root=xc.root)
        on_each(nodes, lambda n: xc.run(
            n, f"gcc -O2 -Wall -Wextra -Werror -std=gnu11 -I{xc.root}/ubse -o {HARNESS} "
               f"{xc.helpers}/ubse_harness.c -ldl", timeout=300))  # fmt: skip
        u = Ubse(xc)
        for node in nodes:
            u.slot[node] = u.call(node, "local")["node"]["slot"]
        yield u
    finally:
        ubsmem.stop(guests)
        on_each(nodes, lambda n: xc.run(n, f"rm -f {HARNESS}", check=False))


def test_the_sdk_reports_6050_without_the_client_library(ubse: Ubse) -> None:
    """ubsmd's 801 reaches the caller as 6050; the stand-in SDK follows that, so the probe
    --ubs-mem waits on answers once the library is back."""
    probe = f"{ubsmem.WORK}/ubsm_probe"
    assert ubse.xc.run(B, probe).out.strip().endswith(": 0")
    ubse.xc.run(B, f"mv {ubsmem.UBSE_LIB} {ubsmem.UBSE_LIB}.away")
    try:
        res = ubse.xc.run(B, probe, check=False)
        assert not res.ok and "ubsmem_initialize: 6050" in res.out
    finally:
        ubse.xc.run(B, f"mv {ubsmem.UBSE_LIB}.away {ubsmem.UBSE_LIB}")


def test_the_library_resolves_ubsmds_26_functions_and_sees_both_nodes(ubse: Ubse) -> None:
    assert ubse.call(B, "symbols") == {"ret": 0, "symbols": 26}
    got = ubse.call(B, "nodes")
    assert got["ret"] == 0
    assert sorted(n["slot"] for n in got["nodes"]) == sorted(ubse.slot.values())
    assert got["links"] == 2


def test_create_on_node0_attach_read_on_node1_detach_delete(ubse: Ubse) -> None:
    name, size = "xnode.ring", 6 * MIB  # 6 MiB: two 4 MiB blocks, two memids
    assert ubse.call(A, "create", name, str(size), "-", str(ubse.slot[A])) == {"ret": 0}
    try:
        # the lender writes its bytes through its own attach (the export's shmdevs)
        filled = ubse.call(A, "fill", name, str(SEED))
        assert filled == {"ret": 0, "bytes": size, "blocks": 2, "mismatch": -1}, filled
        assert ubse.call(A, "detach", name) == {"ret": 0}
        # node 1 finds no import of its own before it attaches
        assert ubse.call(B, "get", name)["imports"] == []
        att = ubse.call(B, "attach", name)
        assert att["ret"] == 0, att
        assert (att["mem_size"], att["unit_size"]) == (size, BLOCK_MIB * MIB)
        assert att["export_slot"] == ubse.slot[A]
        [imp] = att["imports"]
        assert imp["slot"] == ubse.slot[B] and len(imp["memids"]) == 2
        assert ubse.shmdevs(B, imp["memids"]) == [True, True]
        # mapped as the SDK maps it, cacheable and O_SYNC: node 0's bytes, every one
        for mode in ((), ("sync",)):
            got = ubse.call(B, "read", name, str(SEED), *mode)
            assert got == {"ret": codes.EXISTED, "bytes": size, "blocks": 2, "mismatch": -1}
        assert ubse.call(A, "delete", name) == {"ret": codes.SHM_ATTACH_USING}
        assert ubse.call(B, "detach", name) == {"ret": 0}
        assert ubse.shmdevs(B, imp["memids"]) == [False, False]
        assert ubse.call(B, "detach", name) == {"ret": codes.SHM_NO_ATTACH}  # not attached
        assert ubse.call(A, "delete", name) == {"ret": 0}
        assert ubse.call(B, "get", name) == {"ret": codes.NOT_EXIST}
    finally:
        ubse.call(B, "detach", name)
        ubse.call(A, "delete", name)


def test_create_with_lender_as_ubsmds_allocate_with_provider(ubse: Ubse) -> None:
    name = "xnode.lent"
    assert ubse.call(B, "create-lender", name, str(4 * MIB), str(ubse.slot[A])) == {"ret": 0}
    try:
        assert ubse.call(B, "get", name)["export_slot"] == ubse.slot[A]
    finally:
        assert ubse.call(B, "delete", name) == {"ret": 0}


def test_error_paths_give_ubses_codes(ubse: Ubse) -> None:
    a = str(ubse.slot[A])
    # validation, in the client as UBSE's: the name, the size (4 MiB at least, 2 MiB aligned)
    assert ubse.call(B, "create", "bad name", str(4 * MIB), "-", a)["ret"] == codes.INVALID_ARG
    assert ubse.call(B, "create", "odd", str(5 * MIB), "-", a)["ret"] == codes.OUT_OF_RANGE
    assert ubse.call(B, "create", "small", str(2 * MIB), "-", a)["ret"] == codes.OUT_OF_RANGE
    # no lender: a provider that is no node; a lender whose pool cannot hold the size
    assert ubse.call(B, "create", "nolender", str(4 * MIB), "-", "99")["ret"] == codes.ALLOCATE
    big = ubse.call(B, "create", "toobig", str(1024 * MIB), "-", a)
    assert big["ret"] == codes.ALLOCATE
    assert ubse.call(A, "list")["shms"] == []  # the partial export was rolled back
    assert ubse.call(B, "attach", "never")["ret"] == codes.NOT_EXIST
    name = "xnode.errs"
    assert ubse.call(A, "create", name, str(4 * MIB), "-", a) == {"ret": 0}
    try:
        assert ubse.call(B, "detach", name) == {"ret": codes.SHM_NO_ATTACH}  # not attached
        assert ubse.call(A, "create", name, str(4 * MIB), "-", a) == {"ret": codes.EXISTED}
        # another user than the creator (root created it; nobody is not root)
        assert ubse.call(B, "attach", name, user="nobody")["ret"] == codes.AUTH_FAILED
    finally:
        assert ubse.call(A, "delete", name) == {"ret": 0}
