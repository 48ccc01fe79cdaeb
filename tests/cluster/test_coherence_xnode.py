"""The `strict` coherence model (docs/coherence.md) against the visibility failures users meet on
UB hosts, and the same programs under the default `coherent` model.

Each test's module parameters come from the `model` fixture, which reloads the driver on both
nodes when the cluster runs another model (and restores the cluster's own at the end).  A
test that provokes the stale-read report on purpose takes the kernel log and asserts the
report; any other report fails it through the kernel-log guard.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_xnode import A, B, exporter, import_on, unimport_on
from xharness import ClusterHarness

from obmm.testbed.session import Session
from obmm.testbed.settings import merge_params

pytestmark = pytest.mark.emulator_only  # the emulator's coherence model: FIDELITY.md

FRAME = 4096
LINES = 64
#: The eviction run: a high rate so the poller sees the descriptor line refilled soon; the
#: seed is printed in each node's kernel log at load, and in the test's failure text.
EVICT_PARAMS = ("coherence_evict=40", "coherence_seed=34")

MODELS = {
    "coherent": (),
    "strict": ("coherence=strict",),
    "strict-evict": ("coherence=strict", *EVICT_PARAMS),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request: pytest.FixtureRequest, cluster: Session, xc: ClusterHarness) -> Iterator[str]:
    """The driver loaded with the model's parameters on every node (the cluster's own
    parameters otherwise, and again afterwards)."""
    base = cluster.settings.driver_params
    wanted = merge_params(
        tuple(p for p in base if not p.startswith("coherence")), MODELS[request.param]
    )
    if wanted != base:
        for i in range(xc.nodes):
            xc.drop(i)  # its agent holds no device, but start clean after a reload
        cluster.reload_modules(cluster.modules, wanted)
    try:
        yield request.param
    finally:
        if wanted != base:
            for i in range(xc.nodes):
                xc.drop(i)
            cluster.reload_modules(cluster.modules, base)


def _side(xc: ClusterHarness, node: int, args: str, *, check: bool = True) -> str:
    return xc.run(
        node, f"cd {xc.helpers} && env {xc.env(node)} {xc.python} -m coherence_side {args}",
        check=check,
    ).out  # fmt: skip


def _spawn_side(xc: ClusterHarness, node: int, args: str, name: str) -> int:
    # exec: the pid is the helper's own, so killing it closes its files
    return xc.spawn(node, f"exec {xc.python} -m coherence_side {args}", name=name)


def _stop(xc: ClusterHarness, node: int, pid: int) -> None:
    """Kill a helper and wait until it is gone (its shmdev files closed, so its import can go)."""
    xc.kill(node, pid)
    xc.run(
        node, f"for i in $(seq 100); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; done; "
        f"kill -9 {pid}; sleep 0.5", check=False,
    )  # fmt: skip


def _reports(xc: ClusterHarness) -> str:
    """The kernel log's reports since the test began (the test owns them)."""
    return "\n".join(xc.take_kernel_log())


@pytest.mark.parametrize("way", ["none", "update_range", "remap"])
def test_nc_frame_polled_through_a_cacheable_view(
    xc: ClusterHarness, guest_tmp: str, model: str, way: str
) -> None:
    """A publishes 4 KiB frames with NC stores, B polls them through a cacheable mapping.
    Without maintenance `strict` fails it: the descriptor never changes (no eviction) or the
    frame mixes generations (eviction); the stale-read report names B's mem_id.  With the
    invalidation docs/coherence.md prescribes (UPDATE_RANGE INVAL, or unmap and map again)
    it passes, as it does under `coherent`."""
    gens = [2, 3, 4]
    with exporter(xc, guest_tmp, seed=41, name="frame") as exp:
        mem_id = import_on(xc, B, exp)
        out = f"{guest_tmp}/frame-{way}"
        pid = 0
        try:
            _side(xc, A, f"publish {exp.mem_id} 1")
            xc.run(B, f"rm -rf {out}; mkdir -p {out}")
            pid = _spawn_side(
                xc, B, f"consume {mem_id} {out} --gens {','.join(map(str, gens))} --way {way}",
                name=f"consume-{way}",
            )  # fmt: skip
            log = f"/tmp/consume-{way}.log"
            assert json.loads(xc.wait_file(B, f"{out}/ready", log=log))["gen"] == 1
            results = []
            for gen in gens:
                _side(xc, A, f"publish {exp.mem_id} {gen}")
                doc = json.loads(xc.wait_file(B, f"{out}/gen{gen}", log=log))
                results.append(doc)
                if doc["result"] == "stale":
                    break
        finally:
            if pid:
                _stop(xc, B, pid)
            unimport_on(xc, B, mem_id)
    reports = _reports(xc)
    if model == "coherent" or way != "none":
        assert [d["result"] for d in results] == ["ok"] * len(gens), results
        assert "coherence" not in reports, reports
        return
    if model == "strict":
        assert results == [{"result": "stale", "descriptor": 1}], results
    else:
        # Some generation mixed new and old lines (each one does, but for 1 in 64 chances).
        assert any(d["result"] == "mixed" for d in results), (results, EVICT_PARAMS)
    assert f"stale read: node {B} mem_id {mem_id} offset " in reports, reports


@pytest.mark.parametrize("release", ["unmap", "handover"])
def test_cacheable_store_on_a_reaches_b_o_sync_reader_at_a_write_back(
    xc: ClusterHarness, guest_tmp: str, model: str, release: str
) -> None:
    """A stores through a cacheable mapping; B reads O_SYNC.  Under `strict` B sees the old
    bytes until A unmaps or hands ownership over (UPDATE_RANGE off READWRITE: inferred
    WB_ONLY), and the new ones right after; under `coherent` at once."""
    if model == "strict-evict":
        pytest.skip("random eviction may write the line back early; `strict` is the contract")
    marker = b"written by A, cacheable".ljust(32, b".")
    with exporter(xc, guest_tmp, seed=42, name="wb") as exp:
        mem_id = import_on(xc, B, exp)
        out = f"{guest_tmp}/wb-{release}"
        pid = 0
        try:
            old = _read_sync(xc, B, mem_id, 0, len(marker))
            assert old != marker
            xc.run(A, f"rm -rf {out}; mkdir -p {out}")
            pid = _spawn_side(
                xc, A, f"hold {exp.mem_id} {out} a --data {marker.hex()} --release {release}",
                name=f"hold-{release}",
            )  # fmt: skip
            log = f"/tmp/hold-{release}.log"
            xc.wait_file(A, f"{out}/filled-a", log=log)
            xc.run(A, f"touch {out}/write-a")
            xc.wait_file(A, f"{out}/written-a", log=log)
            before = _read_sync(xc, B, mem_id, 0, len(marker))
            assert before == (old if model == "strict" else marker), before
            xc.run(A, f"touch {out}/release-a")
            xc.wait_file(A, f"{out}/released-a", log=log)
            assert _read_sync(xc, B, mem_id, 0, len(marker)) == marker
        finally:
            if pid:
                _stop(xc, A, pid)
            unimport_on(xc, B, mem_id)


def _read_sync(xc: ClusterHarness, node: int, mem_id: int, offset: int, size: int) -> bytes:
    return bytes.fromhex(
        xc.py_json(
            node,
            f"import json, xnode\n"
            f"print(json.dumps(xnode.read_local({mem_id}, {offset}, {size}, sync=True).hex()))\n",
        )
    )


@pytest.mark.parametrize("same_line", [False, True], ids=["different_lines", "one_line"])
def test_two_nodes_write_one_page_through_cacheable_mappings(
    xc: ClusterHarness, guest_tmp: str, model: str, same_line: bool
) -> None:
    """A and B both cache a page, store, and unmap (A first).  Different 64-byte lines both
    survive the write-backs; different bytes of one line lose A's under `strict` (B's
    write-back writes the whole line), with a lost-write report on B; `coherent` keeps both."""
    if model == "strict-evict":
        pytest.skip("random eviction may write a line back between the stores")
    a_off, b_off = (0, 8) if same_line else (0, 128)
    a_data, b_data = b"\xaa" * 8, b"\xbb" * 8
    with exporter(xc, guest_tmp, seed=43, name="lines") as exp:
        mem_id = import_on(xc, B, exp)
        out = f"{guest_tmp}/lines-{int(same_line)}"
        pids: dict[int, int] = {}
        try:
            for node, mid, off, data in (
                (A, exp.mem_id, a_off, a_data),
                (B, mem_id, b_off, b_data),
            ):
                xc.run(node, f"rm -rf {out}; mkdir -p {out}")
                pids[node] = _spawn_side(
                    xc, node, f"hold {mid} {out} n{node} --offset {off} --data {data.hex()}",
                    name=f"lines-{node}",
                )  # fmt: skip
            for node in (A, B):
                xc.wait_file(node, f"{out}/filled-n{node}", log=f"/tmp/lines-{node}.log")
            for node in (A, B):
                xc.run(node, f"touch {out}/write-n{node}")
                xc.wait_file(node, f"{out}/written-n{node}", log=f"/tmp/lines-{node}.log")
            for node in (A, B):
                xc.run(node, f"touch {out}/release-n{node}")
                xc.wait_file(node, f"{out}/released-n{node}", log=f"/tmp/lines-{node}.log")
            got = _read_sync(xc, B, mem_id, 0, 256)
        finally:
            for node, pid in pids.items():
                _stop(xc, node, pid)
            unimport_on(xc, B, mem_id)
    reports = _reports(xc)
    assert got[b_off : b_off + 8] == b_data
    if same_line and model == "strict":
        assert got[a_off : a_off + 8] != a_data  # B's whole line went over A's store
        assert f"lost write: node {B} mem_id {mem_id} offset 0x0" in reports, reports
    else:
        assert got[a_off : a_off + 8] == a_data
        assert "coherence" not in reports, reports
