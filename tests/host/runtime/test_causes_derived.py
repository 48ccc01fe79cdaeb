"""obmm.causes against the errnos the pinned upstream driver's code can return, per operation.

:mod:`obmm.testbed.stages.errno_sources` derives, from the driver's ioctl dispatch and ops
tables, which ``-EXXX`` each operation's code reaches.  Every derived errno must have a row in
:data:`obmm.causes.CAUSES` or a reason in :data:`NOT_RETURNED`; every row the derivation does not
find needs a reason in :data:`FROM_OUTSIDE` (an errno of a kernel API, of the VFS, or of the
emulator alone), else it is reported.  The tree is an input given by path
(:func:`obmm.testbed.paths.ub_upstream_dir`); without it the comparison skips with one line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from obmm.causes import ANY_OP, CAUSES
from obmm.testbed import paths
from obmm.testbed.stages.errno_sources import (
    Derivation,
    Driver,
    calls_in,
    derive,
    errnos_in,
    functions,
)

UPSTREAM_OBMM = (paths.ub_upstream_dir() or Path("/nonexistent")) / "drivers" / "ub" / "obmm"
MISSING = paths.ub_upstream_missing("test_causes_derived", "drivers/ub/obmm")
NEEDS_TREE = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

#: The commands of /dev/obmm (obmm_core.c:obmm_dev_ioctl): a `*` row covers these.
DEV_OBMM_IOCTLS = (
    "EXPORT",
    "IMPORT",
    "UNEXPORT",
    "UNIMPORT",
    "ADDR_QUERY",
    "EXPORT_PID",
    "DECLARE_PREIMPORT",
    "UNDECLARE_PREIMPORT",
)

#: Derived, but user space never gets it from that operation: (op, errno) -> why.
NOT_RETURNED: dict[tuple[str, str], str] = {
    ("ADDR_QUERY", "ENODATA"): "obmm_export_region_ops.c:get_offset_detail_export_region: "
    "an internal bug only, the offset was range-checked just before",
    ("EXPORT", "EEXIST"): "obmm_core.c:insert_obmm_region: ids come from an IDA "
    "(init_obmm_region), a duplicate cannot be inserted",
    ("EXPORT_PID", "EEXIST"): "obmm_core.c:insert_obmm_region: as for EXPORT",
    ("EXPORT", "ENOTRECOVERABLE"): "obmm_export_from_pool.c:sg_alloc_table_from_memdesc: "
    "an internal consistency check of the chunk count",
    ("EXPORT_PID", "ENOTRECOVERABLE"): "obmm_export_from_pool.c:sg_alloc_table_from_memdesc: "
    "the pool path, which EXPORT_PID never takes (obmm_export.c:alloc_export_memory)",
    ("EXPORT", "ESRCH"): "obmm_export_from_user.c:alloc_export_memory_pid: the pid path, "
    "which EXPORT never takes (obmm_export.c:alloc_export_memory)",
    ("EXPORT", "ETIMEDOUT"): "obmm_cache.c:ub_write_queue_flush via alloc_export_memory_pid: "
    "pid path only, and an export region's flush never drains the write queue",
    ("EXPORT_PID", "ETIMEDOUT"): "obmm_cache.c:obmm_region_flush_range: an export region goes "
    "to flush_export_region, only imports reach ub_write_queue_flush",
    ("EXPORT_PID", "ENODEV"): "ubmempool_allocator.c:allocate_memory_contiguous: the pool "
    "path, which EXPORT_PID never takes (obmm_export.c:alloc_export_memory)",
    ("IMPORT", "ETIMEDOUT"): "obmm_import.c:obmm_import only logs release_import_memory's "
    "value on rollback (and that flush is CACHE_INVAL, no write-queue drain)",
    **{
        ("UNIMPORT", e): "obmm_import.c:release_import_memory: a failed restore (setup_pa, "
        "setup_remote_numa, setup_iomem_resource) returns ENOTRECOVERABLE, not its errno"
        for e in ("EAGAIN", "EEXIST", "ENODEV", "ENOMEM", "EPERM")
    },
}

#: Rows the derivation cannot find, the errno coming from outside the driver's own code.
FROM_OUTSIDE: dict[tuple[str, str], str] = {
    (ANY_OP, "EACCES"): "the VFS: /dev/obmm is 0600, open(2) fails before the driver",
    ("MMAP", "EACCES"): "the VFS (mm/mmap.c:do_mmap) checks the fd's mode before .mmap",
    ("OPEN", "ENOENT"): "the VFS: no /dev/obmm_shmdev<id> node",
    ("IMPORT", "EBUSY"): "the kernel's insert_resource (obmm_resource.c:setup_ubmem_resource)",
    ("DECLARE_PREIMPORT", "EBUSY"): "the kernel's insert_resource "
    "(obmm_resource.c:setup_ubmem_resource)",
    ("DECLARE_PREIMPORT", "EEXIST"): "the kernel's mtree_insert_range "
    "(obmm_addr_check.c:occupy_pa_range passes its value on)",
    **{
        (op, "ENOSPC"): "the kernel's ida_alloc_range (obmm_core.c:init_obmm_region)"
        for op in ("EXPORT", "EXPORT_PID", "IMPORT")
    },
    ("UNIMPORT", "EINTR"): "the kernel's memory offlining (remove_memory_remote, "
    "obmm_import.c:teardown_remote_numa passes its value on)",
    ("EXPORT", "EINTR"): "obmm_emu only (kmod/obmm_emu/FIDELITY.md)",
    ("EXPORT", "EBUSY"): "obmm_emu only (kmod/obmm_emu/FIDELITY.md)",
    ("IMPORT", "EACCES"): "obmm_emu only (kmod/obmm_emu/FIDELITY.md)",
    ("MMAP", "ENXIO"): "obmm_emu only (kmod/obmm_emu/FIDELITY.md)",
    ("UPDATE_RANGE", "EOVERFLOW"): "newer kernels' obmm_ownership.c and obmm_emu; "
    "the pinned driver does not check",
}


def in_causes(op: str, errno: str) -> bool:
    """Whether causes.py explains `errno` from `op` (a `*` row counts for ioctls)."""
    ioctl = op in DEV_OBMM_IOCTLS or op == "UPDATE_RANGE"
    return (op, errno) in CAUSES or (ioctl and (ANY_OP, errno) in CAUSES)


@pytest.fixture(scope="module")
def derived() -> Derivation:
    return derive(UPSTREAM_OBMM)


def derived_has(d: Derivation, op: str, errno: str) -> bool:
    """Whether the derivation finds `errno` for `op`; a `*` row counts when the ioctl handler's
    shared part has it or every /dev/obmm command does (each copies its own argument in)."""
    if op == ANY_OP:
        return errno in d.of(ANY_OP) or all(errno in d.of(c) for c in DEV_OBMM_IOCTLS)
    return errno in d.of(op)


@NEEDS_TREE
def test_every_derived_errno_is_in_causes(derived: Derivation) -> None:
    missing = [
        f"{op} {e} (from {', '.join(derived.where(op, e))})"
        for op in derived.ops()
        for e in sorted(derived.of(op))
        if not in_causes(op, e) and (op, e) not in NOT_RETURNED
    ]
    assert not missing, "errnos the driver can return that obmm/causes.py lacks:\n" + "\n".join(
        missing
    )


@NEEDS_TREE
def test_the_derivation_finds_every_operation(derived: Derivation) -> None:
    ops = {op for op, _ in CAUSES}
    assert {*DEV_OBMM_IOCTLS, "UPDATE_RANGE", "OPEN", "MMAP", "MPROTECT", ANY_OP} <= set(
        derived.ops()
    )
    assert ops <= set(derived.ops()), "causes.py names operations the driver has no entry for"


@NEEDS_TREE
def test_causes_rows_the_derivation_misses_are_explained(derived: Derivation) -> None:
    unexplained = [
        f"{op} {e}"
        for op, e in CAUSES
        if not derived_has(derived, op, e) and (op, e) not in FROM_OUTSIDE
    ]
    if unexplained:  # reported, not failed: the row may be right for a reason the code hides
        warnings.warn(
            "causes.py rows the driver's code does not name (add a reason to FROM_OUTSIDE): "
            + ", ".join(unexplained),
            stacklevel=1,
        )


@NEEDS_TREE
def test_allowlists_are_not_stale(derived: Derivation) -> None:
    stale = [f"NOT_RETURNED {k}" for k in NOT_RETURNED if k[1] not in derived.of(k[0])]
    stale += [f"NOT_RETURNED {k} (causes.py has it)" for k in NOT_RETURNED if in_causes(*k)]
    stale += [f"FROM_OUTSIDE {k} (no such row)" for k in FROM_OUTSIDE if k not in CAUSES]
    stale += [f"FROM_OUTSIDE {k} (derived)" for k in FROM_OUTSIDE if derived_has(derived, *k)]
    assert not stale, "\n".join(stale)


SAMPLE = r"""
/* return -ENOTCOMMENT; */
static int helper(int x)
{
	if (x == -EAGAIN)
		return -EIO;
	return x ? -ENOENT : 0;
}

static int unused(void) { return -EXDEV; }

static int warned(void) { return -ENOTRECOVERABLE; }

int entry(int x)
{
	int ret = helper(x);

	unused();
	WARN_ON(warned());
	pr_err("-ESTRING %d\n", ret);
	return ret ? ret : ERR_PTR(-ENOMEM);
}

static long dispatch(struct file *f, unsigned int cmd, unsigned long arg)
{
	if (!enabled)
		return -EOPNOTSUPP;
	switch (cmd) {
	case OBMM_CMD_FIRST:
		return entry(1);
	case OBMM_SHMDEV_SECOND: {
		return -EPERM;
	}
	default:
		return -ENOTTY;
	}
}

static int may_split(struct vm_area_struct *vma, unsigned long addr) { return -EINVAL; }

static const struct vm_operations_struct vm_ops = { .may_split = may_split };
const struct file_operations fops = { .unlocked_ioctl = dispatch, .mmap = kernel_helper };
"""


def test_derivation_on_a_sample(tmp_path: Path) -> None:
    src = tmp_path / "drv.c"
    src.write_text(SAMPLE)
    fns = {f.name: f for f in functions(src)}
    assert set(fns) == {"helper", "unused", "warned", "entry", "dispatch", "may_split"}
    assert fns["helper"].static and not fns["entry"].static
    # comparisons, comments and strings do not count
    assert errnos_in(fns["helper"].body) == {"EIO", "ENOENT"}
    assert errnos_in(fns["entry"].body) == {"ENOMEM"}
    # a bare call and one inside WARN_ON() drop the value: not followed
    assert calls_in(fns["entry"].body, fns) == {"helper"}
    assert Driver(tmp_path).by_name.keys() == fns.keys()
    d = derive(tmp_path)
    assert d.of("FIRST") == {"EIO", "ENOENT", "ENOMEM"}
    assert d.where("FIRST", "EIO") == ["drv.c:helper"]
    assert d.of("SECOND") == {"EPERM"}
    assert d.of(ANY_OP) == {"EOPNOTSUPP", "ENOTTY"}
    assert d.of("MUNMAP") == {"EINVAL"}
    assert "MMAP" not in d.ops()  # a kernel helper in the table: nothing of ours to read
