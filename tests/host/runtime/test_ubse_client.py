"""libubse-client.so.1 (ours, ubse/) against two nodes' services on this host, OBMM faked.

The harness the cluster test runs on real nodes (tests/cluster/guest_side/ubse_harness.c)
dlopens the library and resolves the 26 functions as ubsmd does; here it runs every call but
the mapping, against a master and a second node whose agents are fakes.  So the C side's
checks, the text protocol, the descriptors (one allocation) and the forwarding to the master
are covered without a VM.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from obmm.ubse import codes, rules
from obmm.ubse.registry import Node
from obmm.ubse.service import Endpoint, NodeService

pytestmark = pytest.mark.needs_gcc

REPO = Path(__file__).resolve().parents[3]
MIB = 1 << 20


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("ubse_build")
    subprocess.run(["make", "-s", "-C", str(REPO / "ubse"), f"O={out}"], check=True)
    harness = out / "ubse_harness"
    subprocess.run(
        ["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{REPO / 'ubse'}", "-o",
         str(harness), str(REPO / "tests" / "cluster" / "guest_side" / "ubse_harness.c"), "-ldl"],
        check=True,
    )  # fmt: skip
    return out / "libubse-client.so.1", harness


class FakeLocal:
    """A node's OBMM steps: memids from a counter shared by the nodes, nothing mapped."""

    next_id = 1000

    def __init__(self) -> None:
        self.live: set[int] = set()

    def _new(self, n: int) -> list[int]:
        ids = list(range(FakeLocal.next_id, FakeLocal.next_id + n))
        FakeLocal.next_id += n
        self.live |= set(ids)
        return ids

    def handle(self, op: str, req: dict[str, Any]) -> Any:
        if op == "agent_export":
            return [{"mem_id": m} for m in self._new(int(req["count"]))]
        if op == "agent_import":
            return self._new(len(req["handles"]))
        if op in ("agent_unexport", "agent_unimport"):
            self.live -= set(req["mem_ids"])
            return None
        if op == "agent_numastat":
            return [{"numa": 0, "total": 1 << 30, "free": 1 << 29}]
        raise AssertionError(op)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[tuple[NodeService, FakeLocal]]]:
    config = rules.Config(block_mib=4)
    master_local, node_local = FakeLocal(), FakeLocal()
    master = NodeService(
        Node(slot=1, hostname="node0", addr="127.0.0.1", port=0), master=None,
        socket_path=str(tmp_path / "n0.sock"), config=config, local=master_local,
    )  # fmt: skip
    master.start()
    other = NodeService(
        Node(slot=2, hostname="node1", addr="127.0.0.1", port=0),
        master=Endpoint("127.0.0.1", master.me.port), socket_path=str(tmp_path / "n1.sock"),
        config=config, local=node_local,
    )  # fmt: skip
    other.start()
    try:
        yield [(master, master_local), (other, node_local)]
    finally:
        other.stop()
        master.stop()


def run(built: tuple[Path, Path], svc: NodeService, *args: str) -> dict[str, Any]:
    lib, harness = built
    out = subprocess.run(
        [str(harness), "--lib", str(lib), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "OBMM_UBSE_SOCKET": svc.socket_path},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_all_26_functions_resolve(built: tuple[Path, Path], cluster: Any) -> None:
    assert run(built, cluster[0][0], "symbols") == {"ret": 0, "symbols": 26}


def test_topology_lists_both_nodes_linked(built: tuple[Path, Path], cluster: Any) -> None:
    _, (n1, _) = cluster
    assert run(built, n1, "local")["node"] == {"slot": 2, "host": "node1"}
    got = run(built, n1, "nodes")
    assert got["nodes"] == [{"slot": 1, "host": "node0"}, {"slot": 2, "host": "node1"}]
    assert got["links"] == 2


def test_create_attach_detach_delete_across_nodes(built: tuple[Path, Path], cluster: Any) -> None:
    (n0, local0), (n1, local1) = cluster
    assert run(built, n0, "create", "ring", str(6 * MIB), "-", "1") == {"ret": 0}
    assert len(local0.live) == 2  # 6 MiB in 4 MiB blocks: two memids on the provider
    # node 1's view has no import until it attaches
    assert run(built, n1, "get", "ring")["imports"] == []
    att = run(built, n1, "attach", "ring")
    assert att["ret"] == 0
    assert (att["mem_size"], att["unit_size"], att["export_slot"]) == (6 * MIB, 4 * MIB, 1)
    [imp] = att["imports"]
    assert imp["slot"] == 2 and imp["stage"] == 3
    assert set(imp["memids"]) == local1.live and len(imp["memids"]) == 2
    again = run(built, n1, "attach", "ring")
    assert again["ret"] == codes.EXISTED and again["imports"] == att["imports"]
    assert [d["name"] for d in run(built, n0, "list")["shms"]] == ["ring"]
    assert run(built, n0, "delete", "ring") == {"ret": codes.SHM_ATTACH_USING}
    assert run(built, n1, "detach", "ring") == {"ret": 0}
    assert local1.live == set()
    assert run(built, n1, "detach", "ring") == {"ret": codes.SHM_NO_ATTACH}
    assert run(built, n0, "delete", "ring") == {"ret": 0}
    assert local0.live == set()
    assert run(built, n1, "get", "ring") == {"ret": codes.NOT_EXIST}


def test_create_with_lender_is_ubsmds_allocate_with_provider(
    built: tuple[Path, Path], cluster: Any
) -> None:
    (_, local0), (n1, _) = cluster
    assert run(built, n1, "create-lender", "lent", str(5 * MIB), "1") == {"ret": 0}
    assert len(local0.live) == 2
    assert run(built, n1, "delete", "lent") == {"ret": 0}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("create", "bad name", str(4 * MIB), "-", "-"), codes.INVALID_ARG),
        (("create", "x" * 48, str(4 * MIB), "-", "-"), codes.INVALID_ARG),
        (("create", "small", str(2 * MIB), "-", "-"), codes.OUT_OF_RANGE),
        (("create", "odd", str(5 * MIB), "-", "-"), codes.OUT_OF_RANGE),
        (("create", "empty", str(4 * MIB), "none", "-"), codes.OUT_OF_RANGE),
        (("create-lender", "tiny", str(MIB), "1"), codes.OUT_OF_RANGE),
        (("create", "nolender", str(4 * MIB), "-", "9"), codes.ALLOCATE),
        (("create-lender", "nolender2", str(4 * MIB), "9"), codes.ALLOCATE),
        (("attach", "never"), codes.NOT_EXIST),
        (("detach", "never"), codes.SHM_NO_ATTACH),
        (("delete", "never"), codes.NOT_EXIST),
    ],
)
def test_error_paths_give_ubses_codes(
    built: tuple[Path, Path], cluster: Any, args: tuple[str, ...], code: int
) -> None:
    assert run(built, cluster[1][0], *args)["ret"] == code


def test_a_missing_service_is_1002(built: tuple[Path, Path], tmp_path: Path) -> None:
    lib, harness = built
    out = subprocess.run(
        [str(harness), "--lib", str(lib), "list"], capture_output=True, text=True,
        env={**os.environ, "OBMM_UBSE_SOCKET": str(tmp_path / "none.sock")}, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["ret"] == codes.CONNECTION_FAILED


def test_a_missing_library_is_reported_as_ubsmd_would(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    _, harness = built
    out = subprocess.run(
        [str(harness), "--lib", str(tmp_path / "libubse-client.so.1"), "list"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 3
    assert json.loads(out.stdout)["ret"] == 801  # MXM_ERR_UBSE_LIB


def test_the_service_answers_a_malformed_line_with_1(cluster: Any) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(cluster[0][0].socket_path)
        s.sendall(b"shm_create onlyaname\n")
        assert s.makefile().readline() == f"status {codes.INVALID_ARG}\n"
