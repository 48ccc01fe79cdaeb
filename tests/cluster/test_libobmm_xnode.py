"""Stock libobmm across two nodes: its ten public functions and their refusals.

libobmm is an input (openEuler's, Mulan PSL v2), built in each node from the source tree that
``$OBMM_LIBOBMM_SOURCE`` names (:func:`obmm.testbed.paths.libobmm_source_dir`; not given: the
module skips with one line) with the node's gcc and this project's UAPI
header.  Our program ``guest_side/libobmm_xnode.c`` calls it and prints one JSON line per call;
this module compares each errno with the real driver's (docs/obmm-driver.md section 4) or, where
libobmm decides before any ioctl, with what libobmm does (docs/obmm-driver.md section 8.3).

Node A (0) exports and fills through libobmm; node B (1) imports through libobmm at the address
its decoder gives for A's UBA, reads what A wrote, changes its ownership with
``obmm_set_ownership`` and sees the effect, queries, unimports; A reads what B wrote, and
unexports.  ``obmm_export_useraddr`` runs on A, ``obmm_preimport``/``obmm_unpreimport`` on B.
"""

from __future__ import annotations

import errno
import json
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xharness import ClusterHarness

from obmm.testbed import paths

A, B = 0, 1
SZ_2M = 2 << 20
PAGE = 4096
SEED = 0x5EED
MARK = b"written-by-node1"  # what libobmm_xnode.c writes at offset 0 of B's import
BUILD = "/tmp/libobmm-xnode"
SOURCE = paths.libobmm_source_dir() or Path("/nonexistent")
MISSING = paths.libobmm_missing("cluster test_libobmm_xnode (stock libobmm across two nodes)")

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

Steps = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def probe(xc: ClusterHarness) -> Iterator[str]:
    """libobmm.so built in both nodes from the source tree, and our program linked to it."""
    sources = sorted(p for p in SOURCE.iterdir() if p.suffix in (".c", ".h") and p.is_file())
    src, exe = f"{BUILD}/src", f"{BUILD}/libobmm_xnode"
    include = f"-I{src} -I{xc.root / 'uapi'}"
    try:
        for node in (A, B):
            xc.run(node, f"rm -rf {BUILD} && mkdir -p {src}")
            conn = xc.conn(node)
            for path in sources:
                conn.put(path, f"{src}/{path.name}")
            # As the tree's CMakeLists builds it (a shared libobmm.so, only the API exported),
            # without its VERSION file, which the pinned tree does not carry.
            xc.run(
                node,
                f"gcc -O2 -std=gnu99 -fPIC -shared -fvisibility=hidden {include} "
                f"{src}/*.c -o {BUILD}/libobmm.so && "
                f"gcc -O2 -Wall {include} {xc.helpers}/libobmm_xnode.c -L{BUILD} -lobmm "
                f"-Wl,-rpath,{BUILD} -o {exe}",
                timeout=300,
            )
        yield exe
    finally:
        for node in (A, B):
            if xc.alive(node):
                xc.run(node, f"rm -rf {BUILD}", check=False)


def identity(xc: ClusterHarness, node: int) -> dict[str, int]:
    """The node's id, primary CNA and controller eid (the sysfs number libobmm compares)."""
    return dict(
        xc.py_json(
            node,
            "import json, sys\n"
            "from obmm.identity import NodeIdentity\n"
            "i = NodeIdentity.local()\n"
            "print(json.dumps({'node_id': i.node_id, 'cna': i.cna,\n"
            "                  'eid': int.from_bytes(i.eid[:4], sys.byteorder)}))\n",
        )
    )


def run(xc: ClusterHarness, node: int, exe: str, *args: object) -> Steps:
    """Run the program; its JSON lines by step name (the exit status must be 0)."""
    argv = " ".join(shlex.quote(str(a)) for a in (exe, *args))
    res = xc.run(node, argv, timeout=120)
    steps: Steps = {}
    for line in res.out.splitlines():
        doc = json.loads(line)
        steps[doc.pop("step")] = doc
    return steps


def errnos(steps: Steps) -> dict[str, int]:
    return {name: doc["errno"] for name, doc in steps.items() if "errno" in doc}


def ok(*names: str) -> dict[str, int]:
    return dict.fromkeys(names, 0)


def test_export_import_ownership_query_unimport_unexport(xc: ClusterHarness, probe: str) -> None:
    ida, idb = identity(xc, A), identity(xc, B)
    exp = run(xc, A, probe, "export", ida["eid"], SEED)
    mem_id = exp.get("result", {}).get("mem_id")
    imp: Steps = {}
    try:
        assert errnos(exp) == {
            # libobmm.c:obmm_export: NULL length, no ioctl
            "export_null_length": errno.EINVAL,
            # vendor_adaptor.c:vendor_adapt_export: an all-zero deid; a deid no controller has
            "export_zero_deid": errno.EINVAL,
            "export_unknown_deid": errno.ENODEV,
            # the driver: calculate_export_region_size (size not a multiple of the granule,
            # total 0), export_flags_to_region_flags (flags outside 0x3)
            "export_unaligned_size": errno.EINVAL,
            "export_zero_size": errno.EINVAL,
            "export_bad_flags": errno.EINVAL,
            **ok("export", "query_pa_by_memid", "query_memid_by_pa"),
            # obmm_core.c:obmm_addr_query: offset past the region, unknown id, no region at pa
            "query_pa_offset_past_end": errno.EINVAL,
            "query_pa_unknown_id": errno.ENOENT,
            "query_memid_pa_zero": errno.ENOENT,
        }, exp
        res = exp["result"]
        # obmm_export fills the descriptor: the UBA and token from the driver, the length from
        # the sizes, the CNAs left 0 for the caller; the queries round-trip.
        assert (res["length"], res["scna"], res["dcna"]) == (SZ_2M, 0, 0), res
        assert (res["found"], res["offset"]) == (mem_id, PAGE), res

        pa = xc.py_json(
            B,
            "import json\nfrom obmm import decoder\n"
            f"print(json.dumps(decoder.default_decoder().resolve("
            f"{ida['node_id']}, {res['uba']}, {SZ_2M})))\n",
        )
        # The importer names its own controller (seid, scna) and the exporter's (deid, dcna).
        imp = run(xc, B, probe, "import", pa, SZ_2M, res["tokenid"], idb["eid"], idb["cna"],
                  ida["eid"], ida["cna"], SEED)  # fmt: skip
        assert errnos(imp) == {
            # libobmm.c:obmm_import: NULL desc; NUMA_REMOTE with base_dist outside 0..255
            "import_null_desc": errno.EINVAL,
            "import_remote_base_dist": errno.EINVAL,
            # vendor_adaptor.c:validate_cna_match: seid's controller has another primary_cna;
            # no controller has the seid
            "import_scna_not_seid": errno.ENODEV,
            "import_unknown_seid": errno.ENODEV,
            # the driver: import_to_region_flags (neither ALLOW_MMAP nor NUMA_REMOTE),
            # validate_pa_range (length not 2 MiB-aligned),
            # obmm_preimport_prefilled.c:get_pa_mapping (PREIMPORT with no declaration)
            "import_no_mode_flag": errno.EINVAL,
            "import_unaligned_length": errno.EINVAL,
            "import_preimport_undeclared": errno.EFAULT,
            "import": 0,
            # obmm_addr_check.c:occupy_pa_range: the range is imported already
            "import_again": errno.EEXIST,
            **ok("set_ownership_read", "set_ownership_write", "set_ownership_none"),
            # libobmm.c:obmm_set_ownership: a prot it has no state for, no ioctl
            "set_ownership_exec": errno.EINVAL,
            # obmm_shm_dev.c:validate_update_info: start not aligned; start >= end
            "set_ownership_unaligned": errno.EINVAL,
            "set_ownership_empty": errno.EINVAL,
            # obmm_shm_dev.c:obmm_shm_update_range: the mappings end before `end`
            "set_ownership_past_mapping": errno.EFAULT,
            **ok("query_memid_by_pa", "query_pa_by_memid"),
            # obmm_core.c:search_deactivate_obmm_region: a mapping holds the shmdev open
            "unimport_mapped": errno.EBUSY,
            # libobmm.c:obmm_unimport: mem_id 0, no ioctl (the driver would say ENOENT)
            "unimport_zero_id": errno.EINVAL,
            # obmm_import.c:obmm_unimport: flags; obmm_export.c:obmm_unexport: not an export
            "unimport_flags": errno.EINVAL,
            "unexport_of_import": errno.EINVAL,
            "unimport": 0,
            # obmm_core.c:search_deactivate_obmm_region: gone
            "unimport_again": errno.ENOENT,
        }, imp
        # B read, through its import, exactly what A wrote through its export.
        assert imp["read"] == {"mismatches": 0, "head": res["head"]}, imp["read"]
        # Ownership through libobmm changes the mapping: PROT_NONE faults, READ reads but does
        # not write, READ|WRITE writes, NONE faults again.
        segv = int(signal.SIGSEGV)
        faults = {k: imp[k]["signal"] for k in imp if "signal" in imp[k]}
        assert faults == {
            "read_before_ownership": segv,
            "write_while_reader": segv,
            "write_while_writer": 0,
            "read_after_none": segv,
        }, faults
        out = imp["result"]
        assert (out["found"], out["offset"], out["pa"]) == (out["mem_id"], PAGE, pa + PAGE)

        got = xc.py_json(
            A,
            f"import json, xnode\nprint(json.dumps(xnode.read_local({mem_id}, 0, {len(MARK)})"
            ".decode(errors='replace')))\n",
        )
        assert got == MARK.decode(), "A does not see what B wrote through libobmm"

        fin = run(xc, A, probe, "unexport", mem_id)
        mem_id = None if fin.get("unexport", {}).get("errno") == 0 else mem_id
        assert errnos(fin) == {
            # libobmm.c:obmm_unexport: mem_id 0, no ioctl (the driver would say ENOENT)
            "unexport_zero_id": errno.EINVAL,
            # obmm_export.c:obmm_unexport: flags
            "unexport_flags": errno.EINVAL,
            # obmm_core.c:search_deactivate_obmm_region: unknown id; a mapping holds it
            "unexport_unknown_id": errno.ENOENT,
            "unexport_mapped": errno.EBUSY,
            # obmm_import.c:obmm_unimport: an export is not an import
            "unimport_of_export": errno.EINVAL,
            "unexport": 0,
            "unexport_again": errno.ENOENT,
        }, fin
    finally:
        left = imp.get("import", {})
        if left.get("errno") == 0 and imp.get("unimport", {}).get("errno") != 0:
            xc.py(B, f"import xnode\nxnode.unimport({left['ret']})\n", check=False)
        if mem_id is not None:
            xc.py(A, f"import xnode\nxnode.unexport({mem_id})\n", check=False)


@pytest.fixture
def hugepage(xc: ClusterHarness) -> Iterator[None]:
    """One more 2 MiB hugetlbfs page on A for the test."""
    path = "/proc/sys/vm/nr_hugepages"
    old = int(xc.run(A, f"cat {path}").out)
    xc.run(A, f"echo {old + 1} > {path}")
    try:
        yield
    finally:
        xc.run(A, f"echo {old} > {path}", check=False)


def test_export_useraddr(xc: ClusterHarness, probe: str, hugepage: None) -> None:
    steps = run(xc, A, probe, "useraddr", identity(xc, A)["eid"])
    assert errnos(steps) == {
        # libobmm.c:obmm_export_useraddr: NULL desc, no ioctl
        "useraddr_null_desc": errno.EINVAL,
        # obmm_export_from_user.c:obmm_cmd_export_pid_allowed: ALLOW_MMAP; length not 2 MiB
        "useraddr_mmap_flag": errno.EINVAL,
        "useraddr_unaligned_length": errno.EINVAL,
        # obmm_export_from_user.c:hisi_workarounds_check_page_list: not a hugetlbfs page
        "useraddr_not_hugetlb": errno.EOPNOTSUPP,
        "useraddr": 0,
        # obmm_shm_dev.c:obmm_shm_fops_open: process memory has no mapping capability
        "useraddr_open_shmdev": errno.EPERM,
        "useraddr_unexport": 0,
    }, steps


def test_preimport_and_unpreimport(xc: ClusterHarness, probe: str) -> None:
    ida, idb = identity(xc, A), identity(xc, B)
    # The first whole memory block of B's window onto A's memory.
    pa, block = xc.py_json(
        B,
        "import json\nfrom obmm import decoder\n"
        "block = int(open('/sys/devices/system/memory/block_size_bytes').read(), 16)\n"
        f"w = next(w for w in decoder.default_decoder().windows() if w.node == {ida['node_id']})\n"
        "pa = -(-w.base // block) * block\n"
        "assert pa + block <= w.base + w.size, (w, block)\n"
        "print(json.dumps([pa, block]))\n",
    )
    steps = run(xc, B, probe, "preimport", pa, block, idb["eid"], idb["cna"], ida["eid"],
                ida["cna"])  # fmt: skip
    try:
        assert errnos(steps) == {
            # libobmm.c:obmm_preimport / obmm_unpreimport: NULL info; base_dist outside 0..255
            "preimport_null": errno.EINVAL,
            "unpreimport_null": errno.EINVAL,
            "preimport_base_dist": errno.EINVAL,
            # vendor_adaptor.c:validate_cna_match
            "preimport_scna_not_seid": errno.ENODEV,
            # obmm_preimport.c:check_preimport_cmd_common: length not whole blocks; flags
            "preimport_unaligned_length": errno.EINVAL,
            "preimport_flags": errno.EINVAL,
            # obmm_preimport_prefilled.c:get_pa_mapping: no declaration contains pa
            "unpreimport_undeclared": errno.EFAULT,
            "preimport": 0,
            # obmm_addr_check.c:occupy_pa_range: declared already
            "preimport_again": errno.EEXIST,
            # obmm_preimport_prefilled.c:preimport_release_prefilled: not the declared range;
            # obmm_preimport.c:check_unpreimport_cmd_common: flags
            "unpreimport_wrong_length": errno.EINVAL,
            "unpreimport_flags": errno.EINVAL,
            "unpreimport": 0,
            "unpreimport_again": errno.EFAULT,
        }, steps
        # obmm_preimport returns the remote node the driver chose for numa_id -1.
        assert steps["preimport_numa"]["numa_id"] >= 0, steps
    finally:
        declared = steps.get("preimport", {}).get("errno") == 0
        if declared and steps.get("unpreimport", {}).get("errno") != 0:
            xc.py(B, f"import obmm\nobmm.Obmm().undeclare_preimport({pa}, {block})\n", check=False)
