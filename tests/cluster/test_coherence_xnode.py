"""The `strict` coherence model (docs/coherence.md) against the visibility failures users meet on
UB hosts, and the same programs under the default `coherent` model.

Each test's module parameters come from the `model` fixture, which reloads the driver on both
nodes when the cluster runs another model (and restores the cluster's own at the end).  A
test that provokes the stale-read report on purpose takes the kernel log and asserts the
report; any other report fails it through the kernel-log guard.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import struct
from collections.abc import Callable, Iterator

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
                xc.run(B, f"touch {out}/published-{gen}")
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


# ---- the access patterns of docs/coherence.md, each without and with its maintenance ----

PAGE = 4096
Steps = Callable[..., list[bytes]]


@contextlib.contextmanager
def _stepper(xc: ClusterHarness, node: int, mem_id: int, out: str, size: int) -> Iterator[Steps]:
    """A `coherence_side steps` process holding a cacheable read-write mapping of `size`
    bytes on `node`; calling the result does a list of steps there and returns its reads."""
    xc.run(node, f"rm -rf {out}; mkdir -p {out}")
    name = out.rsplit("/", 1)[-1]
    pid = _spawn_side(xc, node, f"steps {mem_id} {out} --size {size}", name=name)
    count = iter(range(1 << 30))

    def steps(*todo: list[object]) -> list[bytes]:
        k = next(count)
        doc = shlex.quote(json.dumps(list(todo)))
        xc.run(node, f"printf %s {doc} > {out}/{k}.tmp && mv {out}/{k}.tmp {out}/{k}.json")
        return [bytes.fromhex(h) for h in json.loads(xc.wait_file(node, f"{out}/{k}.out"))]

    try:
        yield steps
    finally:
        _stop(xc, node, pid)


@contextlib.contextmanager
def _pair(
    xc: ClusterHarness, out: str, a_mem_id: int, b_mem_id: int, size: int
) -> Iterator[tuple[Steps, Steps]]:
    """_stepper on A (the export) and on B (the import)."""
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(_stepper(xc, A, a_mem_id, f"{out}-a", size))
        yield a, stack.enter_context(_stepper(xc, B, b_mem_id, f"{out}-b", size))


def _u64(v: int) -> str:
    return struct.pack("<Q", v).hex()


def _expect(model: str, way: str, reports: str, mem_id: int, right: bool) -> None:
    """Right under `coherent` or with the maintenance; under `strict` without it wrong, and the
    reader's stale-read report names its mem_id."""
    if model == "coherent" or way == "maintained":
        assert right
        assert "coherence" not in reports, reports
    else:
        assert not right
        assert f"stale read: node {B} mem_id {mem_id} offset " in reports, reports


WAYS = ["none", "maintained"]


@pytest.mark.parametrize("way", WAYS)
def test_ring_with_descriptors(xc: ClusterHarness, guest_tmp: str, model: str, way: str) -> None:
    """A produces into a ring of one-page slots (payload, then the descriptor, then WB_ONLY of
    the slot); B consumes, having looked at every slot once (so it caches them).  B must
    invalidate a slot (UPDATE_RANGE INVAL) before it reads its descriptor: without it `strict`
    shows B the old descriptors."""
    if model == "strict-evict":
        pytest.skip("`strict` is the contract; eviction only makes failures random")
    slots = 3
    with exporter(xc, guest_tmp, seed=44, name="ring") as exp:
        mem_id = import_on(xc, B, exp)
        try:
            out = f"{guest_tmp}/ring-{way}"
            with _pair(xc, out, exp.mem_id, mem_id, slots * PAGE) as (prod, cons):
                cons(*[["read", s * PAGE, 8] for s in range(slots)])
                got, want = [], []
                for seq in range(1, slots + 1):
                    slot, payload = (seq - 1) * PAGE, bytes([seq]) * 128
                    prod(["write", slot + 64, payload.hex()], ["write", slot, _u64(seq)],
                         ["update", slot, PAGE, "READWRITE", "WB_ONLY"])  # fmt: skip
                    inval = [["update", slot, PAGE, "READWRITE", "INVAL"]]
                    got.append(cons(*(inval if way == "maintained" else []),
                                    ["read", slot, 8], ["read", slot + 64, 128]))  # fmt: skip
                    want.append([bytes.fromhex(_u64(seq)), payload])
        finally:
            unimport_on(xc, B, mem_id)
    _expect(model, way, _reports(xc), mem_id, got == want)


@pytest.mark.parametrize("way", WAYS)
def test_read_mostly_table(xc: ClusterHarness, guest_tmp: str, model: str, way: str) -> None:
    """An Engram-like table: A writes a generation of rows and writes the table back once
    (UPDATE_RANGE WB_ONLY), then bumps the generation; B reads rows from its cache between
    generations and must invalidate the table when the generation changes."""
    if model == "strict-evict":
        pytest.skip("`strict` is the contract; eviction only makes failures random")
    pages = 4
    size = pages * PAGE
    with exporter(xc, guest_tmp, seed=45, name="table") as exp:
        mem_id = import_on(xc, B, exp)
        try:
            with _pair(xc, f"{guest_tmp}/table-{way}", exp.mem_id, mem_id, size) as (
                writer,
                reader,
            ):
                rows = [["read", p * PAGE + 256, 64] for p in range(pages)]
                reader(*rows)  # generation 0, cached
                right = True
                for gen in (1, 2):
                    row = bytes([0xE0 + gen]) * 64
                    writer(*[["write", p * PAGE + 256, row.hex()] for p in range(pages)],
                           ["update", 0, size, "READWRITE", "WB_ONLY"])  # fmt: skip
                    inval = [["update", 0, size, "READWRITE", "INVAL"]]
                    got = reader(*(inval if way == "maintained" else []), *rows)
                    right = right and got == [row] * pages
        finally:
            unimport_on(xc, B, mem_id)
    _expect(model, way, _reports(xc), mem_id, right)


@pytest.mark.parametrize("way", WAYS)
def test_ping_pong(xc: ClusterHarness, guest_tmp: str, model: str, way: str) -> None:
    """A and B pass a counter back and forth: take over (UPDATE_RANGE to READWRITE), read,
    add one, hand over (UPDATE_RANGE to READONLY, INFER: WB_ONLY).  The taker must
    invalidate (cache_ops INVAL): with INFER instead `strict` shows each side its own old
    copy."""
    if model == "strict-evict":
        pytest.skip("`strict` is the contract; eviction only makes failures random")
    take_ops = "INVAL" if way == "maintained" else "INFER"
    with exporter(xc, guest_tmp, seed=46, name="pingpong") as exp:
        mem_id = import_on(xc, B, exp)
        try:
            with _pair(xc, f"{guest_tmp}/pp-{way}", exp.mem_id, mem_id, PAGE) as (a, b):
                give = ["update", 0, PAGE, "READONLY", "INFER"]
                start = struct.unpack("<Q", a(["read", 0, 8], give)[0])[0]
                b(["read", 0, 8], give)  # B caches the page too
                seen = []
                for side in (a, b, a, b):
                    (raw,) = side(["update", 0, PAGE, "READWRITE", take_ops], ["read", 0, 8])
                    value = struct.unpack("<Q", raw)[0]
                    seen.append((value - start) % 2**64)
                    side(["write", 0, _u64((value + 1) % 2**64)], give)
        finally:
            unimport_on(xc, B, mem_id)
    _expect(model, way, _reports(xc), mem_id, seen == [0, 1, 2, 3])
