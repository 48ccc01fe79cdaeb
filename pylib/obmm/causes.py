"""What can go wrong: likely causes per (operation, errno), as data.

Built from the real driver's check order (docs/obmm-driver.md section 4, citing
drivers/ub/obmm/ file:function).  `obmm.errors` takes
its hints from here and docs/causes.md prints the same table (`render_markdown`, `ci/sync_docs.py`).
"""

from __future__ import annotations

#: Causes that apply to every /dev/obmm ioctl.
ANY_OP = "*"

CAUSES: dict[tuple[str, str], tuple[str, ...]] = {
    (ANY_OP, "EOPNOTSUPP"): (
        "the UB memory feature is not enabled (ub_feature_get() lacks UB_MEM_*): "
        "every /dev/obmm ioctl fails this way although the module is loaded",
    ),
    (ANY_OP, "ENOTTY"): ("unknown ioctl command for this device",),
    (ANY_OP, "EFAULT"): (
        "the argument (or priv / vendor_info) pointer is not readable, or the result "
        "could not be copied back (the object was created anyway)",
    ),
    (ANY_OP, "EACCES"): ("/dev/obmm is root-only (mode 0600)",),
    ("EXPORT", "E2BIG"): ("length (the number of size[] entries) > 16",),
    ("EXPORT", "EINVAL"): (
        "pxm_numa < 0 or > 16",
        "a size[i] is not a multiple of the memseg granule (2 MiB by default)",
        "all sizes are 0",
        "the NUMA nodes used and pxm_numa are not on one socket, or a node has no CPU",
        "flags outside ALLOW_MMAP|FAST (0x3)",
        "priv_len > 512 or vendor_len > 128",
        "a size is not a multiple of the pool allocator granule (mem_allocator_granu)",
    ),
    ("EXPORT", "ENODEV"): (
        "a non-zero size[i] names a NUMA node that is not online and local",
        "no pool allocator on that node",
    ),
    ("EXPORT", "EOVERFLOW"): ("the sum of size[] overflows",),
    ("EXPORT", "ENOSPC"): ("all 2^20-1 region ids are in use",),
    ("EXPORT", "ENOMEM"): (
        "less free memory than asked in the pool and the system together (a short pool is "
        "refilled from the system: there is no pool limit; obmm_emu: the node's export pool, "
        "pool_size, is the limit)",
        "FAST was given and not enough already-zeroed pool memory is available",
    ),
    ("EXPORT", "EINTR"): (
        "obmm_emu only: a signal arrived while the export waited for memory still "
        "quarantined after an unexport (kmod/obmm_emu/FIDELITY.md)",
    ),
    ("EXPORT", "EPERM"): ("the UMMU refused a translation device (ummu_core_alloc_tdev)",),
    ("EXPORT", "EBUSY"): (
        "obmm_emu only: just unexported memory could satisfy it, and a live node has not "
        "acknowledged its revocation yet (a stopped importer; kmod/obmm_emu/FIDELITY.md)",
    ),
    ("EXPORT_PID", "EINVAL"): (
        "flags must be 0 (ALLOW_MMAP and FAST are refused)",
        "length is 0 or not a multiple of PMD_SIZE (2 MiB with 4K pages)",
        "priv_len > 512 or vendor_len > 128",
        "offset/length not multiples of the memseg granule",
    ),
    ("EXPORT_PID", "ESRCH"): ("pid is not a live process in the initial pid namespace",),
    ("EXPORT_PID", "EOPNOTSUPP"): (
        "the pages are not hugetlbfs pages (anonymous memory and THP are refused)",
        "the pages or pxm_numa are on a node >= 16 or on more than one socket",
    ),
    ("EXPORT_PID", "ENOMEM"): ("only part of the range could be pinned",),
    ("EXPORT_PID", "EFAULT"): (
        "pinning failed: the range has a hole or is not mapped in that process",
    ),
    ("EXPORT_PID", "EPERM"): (
        "the UMMU refused a translation device (ummu_core_alloc_tdev)",
        "the module is being unloaded",
    ),
    ("EXPORT_PID", "ENOSPC"): ("all region ids are in use",),
    ("UNEXPORT", "ENOENT"): (
        "no region with this mem_id (mem_id 0 included; libobmm says EINVAL for 0)",
    ),
    ("UNEXPORT", "EINVAL"): ("flags != 0", "mem_id names an import, not an export"),
    ("UNEXPORT", "EBUSY"): (
        "a /dev/obmm_shmdev<id> file is still open or mapped, or the region is being created",
    ),
    ("UNIMPORT", "ENOENT"): (
        "no region with this mem_id (mem_id 0 included; libobmm says EINVAL for 0)",
    ),
    ("UNIMPORT", "EINVAL"): ("flags != 0", "mem_id names an export, not an import"),
    ("UNIMPORT", "EBUSY"): (
        "a /dev/obmm_shmdev<id> file is still open or mapped, or the region is being created",
        "NUMA_REMOTE: memory offlining found an unmovable page on the borrowed node",
    ),
    ("UNIMPORT", "EINTR"): (
        "NUMA_REMOTE: a signal arrived while memory offlining waited for a page of the "
        "borrowed node that could not move yet (pinned, e.g. held by a pipe); retry",
    ),
    ("IMPORT", "EINVAL"): (
        "flags outside 0x7, not exactly one of ALLOW_MMAP / NUMA_REMOTE, or "
        "PREIMPORT without NUMA_REMOTE",
        "priv_len > 512",
        "length 0, addr 0, addr or length not 2 MiB aligned, or addr + length overflows",
        "NUMA_REMOTE with base_dist in 1..10",
        "addr is not UB memory of this controller (not in a decoder window)",
        "NUMA_REMOTE on a non-cacheable range; preimport parameters differ from the declaration",
    ),
    ("IMPORT", "ENODEV"): (
        "scna is not the CNA of a local UB controller (use the importer's own CNA)",
        "NUMA_REMOTE without PREIMPORT: the controller of scna has no NUMA node, so the new "
        "node's distances cannot be set",
    ),
    ("IMPORT", "EFAULT"): ("PREIMPORT: no declaration contains addr (DECLARE_PREIMPORT first)",),
    ("IMPORT", "EACCES"): (
        "obmm_emu only: NUMA_REMOTE of a range no live export covers (the emulator never "
        "hot-adds memory nobody exported; the real driver does not check the tokenid)",
        "obmm_emu only: NUMA_REMOTE of an EXPORT_PID export or of an export its exporter "
        "maps (its processes read and write that memory)",
    ),
    ("IMPORT", "ENOTRECOVERABLE"): ("a step failed and undoing the steps before it failed too",),
    ("IMPORT", "EEXIST"): (
        "the PA range overlaps an existing import or preimport "
        "(the docs say EBUSY; the driver returns EEXIST)",
    ),
    ("IMPORT", "EBUSY"): ("the range conflicts with another iomem resource",),
    ("IMPORT", "ENOSPC"): ("all region ids are in use",),
    ("IMPORT", "EPERM"): (
        "NUMA_REMOTE hot-add failed (length/addr not memory-block multiples: "
        "128 MiB with 4K pages)",
        "NUMA_REMOTE: numa_id is not a remote NUMA node, or no remote node is unused "
        "(each borrow without numa_id takes a new one; preimport declarations reserve theirs)",
    ),
    ("IMPORT", "EAGAIN"): ("the preimport range is not ready yet",),
    ("IMPORT", "ENOMEM"): (
        "the kernel could not allocate the region's bookkeeping (obmm_import.c:obmm_import, "
        "obmm_addr_check.c:occupy_pa_range, obmm_resource.c:setup_ubmem_resource)",
    ),
    ("ADDR_QUERY", "ENOENT"): ("no active region contains this PA, or no such mem_id",),
    ("ADDR_QUERY", "EINVAL"): ("offset >= region size", "unknown key_type"),
    ("DECLARE_PREIMPORT", "EINVAL"): (
        "pa or length not a multiple of the memory block size, zero, or overflowing",
        "flags != 0, pa == 0, invalid base_dist, or the range is not cacheable UB memory",
    ),
    ("DECLARE_PREIMPORT", "ENODEV"): (
        "unknown scna",
        "the controller of scna has no NUMA node, so the node's distances cannot be set",
    ),
    ("DECLARE_PREIMPORT", "EEXIST"): ("the range overlaps another import or preimport",),
    ("DECLARE_PREIMPORT", "EBUSY"): ("iomem resource conflict",),
    ("DECLARE_PREIMPORT", "EPERM"): (
        "module is unloading, or the memory hot-add failed (numa_id not a remote node, or "
        "no unused remote node left)",
    ),
    ("DECLARE_PREIMPORT", "ENOMEM"): (
        "the kernel could not allocate the declaration's bookkeeping "
        "(obmm_preimport_prefilled.c:create_prefilled_preimport_range, "
        "obmm_addr_check.c:occupy_pa_range, obmm_resource.c:setup_ubmem_resource)",
    ),
    ("UNDECLARE_PREIMPORT", "EINVAL"): (
        "flags != 0, the PA is not a preimport range, or pa/length do not match "
        "the declaration exactly",
    ),
    ("UNDECLARE_PREIMPORT", "EFAULT"): ("the PA was never declared",),
    ("UNDECLARE_PREIMPORT", "EBUSY"): ("imports still use the range",),
    ("UNDECLARE_PREIMPORT", "EAGAIN"): ("the range is not ready",),
    ("OPEN", "EPERM"): (
        "cacheable open of a region without cacheable capability, or O_SYNC open "
        "without non-cacheable capability",
        "the region came from EXPORT_PID (it can never be opened)",
    ),
    ("OPEN", "EAGAIN"): ("the region is still being created",),
    ("OPEN", "ENOENT"): ("no /dev/obmm_shmdev<id>: wrong mem_id or already unexported",),
    ("MMAP", "EINVAL"): (
        "not MAP_SHARED",
        "offset >= size or length > size - offset",
        "PMD flag set but start, end or offset not 2 MiB aligned",
    ),
    ("MMAP", "EACCES"): (
        "the fd is not open for reading, or PROT_WRITE on one not open for writing: the VFS "
        "refuses it before the driver (whose own check would say EPERM)",
    ),
    ("MMAP", "ENXIO"): (
        "obmm_emu only: the import is revoked (its export was withdrawn, or the exporter died "
        "or reloaded) or no live export ever covered it; real: the UMMU faults the access",
    ),
    ("MMAP", "EPERM"): (
        "the region was exported/imported without ALLOW_MMAP",
        "page and PMD granule mixed on one region (the first mmap fixes it)",
        "cacheable and O_SYNC mappings of one region at the same time",
    ),
    ("MMAP", "ENOMEM"): (
        "the first mmap of a region could not allocate its per-page ownership table, "
        "which grows with the region's size (obmm_ownership.c:init_ownership_info)",
    ),
    ("MPROTECT", "EOPNOTSUPP"): ("mprotect/mremap of an OBMM mapping is refused",),
    ("MUNMAP", "EINVAL"): (
        "munmap (or mremap shrinking) part of a mapping at an address not aligned to its "
        "granule (2 MiB for a PMD mapping): the split is refused "
        "(obmm_shm_dev.c:obmm_vma_may_split)",
    ),
    ("UPDATE_RANGE", "EINVAL"): (
        "fd opened with O_SYNC, or no cacheable mmap yet",
        "start >= end, or start/end unaligned",
        "invalid mem_state (bits outside 0xf, RESV cache bits, READEXEC with NC/DEVICE, "
        "NORMAL_NC with access other than NO_ACCESS) or cache_ops > INFER",
    ),
    ("UPDATE_RANGE", "EPERM"): ("requested access exceeds the fd's open mode",),
    ("UPDATE_RANGE", "EFAULT"): ("[start, end) is not fully covered by this region's mappings",),
    ("UPDATE_RANGE", "EOVERFLOW"): (
        "a 65536th reader or writer of a page: only in newer kernels (openeuler-mirror/kernel "
        "obmm_ownership.c@401e969) and obmm_emu; the pinned upstream driver does not check",
    ),
    ("UPDATE_RANGE", "ETIMEDOUT"): (
        "an import's write-back: the UB write queue did not drain within 1000 ms",
    ),
    ("UNIMPORT", "ETIMEDOUT"): (
        "the write-back before release: the UB write queue did not drain within 1000 ms",
    ),
    ("UNIMPORT", "ENOTRECOVERABLE"): (
        "a release step failed and its rollback failed too, or a preimported range could not "
        "be put back isolated",
    ),
    ("UNEXPORT", "ENOTRECOVERABLE"): (
        "the UMMU refused to free the device and restoring the mapping failed",
    ),
}


def causes(op: str, errname: str) -> tuple[str, ...]:
    """Likely causes of `errname` from `op`, the operation's own first."""
    return CAUSES.get((op, errname), ()) + CAUSES.get((ANY_OP, errname), ())


def render_markdown() -> str:
    """The "what can go wrong" table of docs/causes.md."""
    lines = ["| operation | errno | likely causes |", "|---|---|---|"]
    for (op, errname), texts in CAUSES.items():
        shown_op = "any `/dev/obmm` ioctl" if op == ANY_OP else op
        cell = "<br>".join(t.replace("|", "\\|") for t in texts)
        lines.append(f"| {shown_op} | `{errname}` | {cell} |")
    return "\n".join(lines) + "\n"
