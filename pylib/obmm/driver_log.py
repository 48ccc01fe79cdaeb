"""The real OBMM driver's kernel log lines at the checks where it refuses a call: facts.

Each :class:`Line` is one format string of openeuler-mirror/kernel ``drivers/ub/obmm``, as its
``pr_err()`` writes it (without the trailing ``\\n``; ``EID_FMT64`` expanded), with the places
(``<file>.c:<function>``) that log it.  Every line has the prefix of ``obmm_core.h``'s
``pr_fmt`` (:data:`PREFIX`); a file whose own ``pr_fmt`` adds a sub-prefix after it
(``obmm_addr_check.c``'s ``addr_check:``) has it in :attr:`Line.sub`.  The commits the facts
were read at are those FIDELITY.md names (``obmm_import.c@bf00953``, ``obmm_core.c@53eaf2b``,
``obmm_export.c@d4f4936``, ``obmm_export_from_pool.c@d4f4936``,
``obmm_export_from_user.c@80a7753``, ``obmm_preimport.c@7863d54``,
``obmm_preimport_prefilled.c@7863d54``, ``obmm_shm_dev.c@753ece1``, ``ubmempool_allocator.c``;
``obmm_addr_check.c`` as in the dkms tree at 65ba333).

The emulated driver logs these lines at the same checks (``kmod/obmm_emu``: ``obmm_refuse()``
and ``obmm_klog()``); where the real driver refuses without a line, or the check is the
emulator's own, it logs its own line, marked ``emulator:``, and :data:`EMULATOR_OWN` says why.
``tests/host/tools/test_refusal_lines.py`` holds both to this table, and the table to a given
upstream tree.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``obmm_core.h``: ``#define pr_fmt(fmt) "OBMM: " fmt``.
PREFIX = "OBMM: "

#: The real driver's format macros, as a format scanner expands them (``obmm_core.h``).
MACROS = {"EID_FMT64": "%#llx:%#llx"}


@dataclass(frozen=True)
class Line:
    """One log line of the real driver: its level, its format, where it is logged, and the
    sub-prefix its file's ``pr_fmt`` puts between :data:`PREFIX` and the format (``sub``)."""

    level: str
    fmt: str
    where: tuple[str, ...]
    sub: str = ""

    @property
    def files(self) -> set[str]:
        return {w.split(":", 1)[0] for w in self.where}

    @property
    def text(self) -> str:
        """What follows :data:`PREFIX` in the log: the sub-prefix, then the format."""
        return self.sub + self.fmt


def _err(fmt: str, *where: str) -> Line:
    return Line("err", fmt, where)


#: ``obmm_addr_check.c``: ``#define pr_fmt(fmt) "OBMM: addr_check:" fmt`` (no space after it).
ADDR_CHECK = "addr_check:"


def _addr_check(fmt: str, *where: str) -> Line:
    return Line("err", fmt, where, ADDR_CHECK)


#: The real driver's lines at the checks the emulator makes, by operation.
REAL: tuple[Line, ...] = (
    # /dev/obmm: every ioctl
    _err("obmm feature not enabled", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load export argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to write export result", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load import argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to write import result", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load unexport argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load unimport argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load addr_query argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to write obmm_query result", "obmm_core.c:obmm_dev_ioctl"),
    _err("Failed to load export_pid param.", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to write export_pid result.", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to load preimport argument", "obmm_core.c:obmm_dev_ioctl"),
    _err("failed to write preimport result", "obmm_core.c:obmm_dev_ioctl"),
    # regions
    _err("Failed to allocate mem_id, ret=%pe", "obmm_core.c:init_obmm_region"),
    _err("Failed to create device %d. ret=%pe", "obmm_core.c:register_obmm_region"),
    _err("mem_id=%llu is out of valid mem_id range.", "obmm_core.c:validate_obmm_mem_id"),
    _err(
        "failed to deactivate: region with mem_id=%d not found.",
        "obmm_core.c:search_deactivate_obmm_region",
    ),
    _err(
        "failed to deactivate: region %d is being used or in creation/destruction process.",
        "obmm_core.c:search_deactivate_obmm_region",
    ),
    _err("priv_len=%u too large (limit=%u).", "obmm_core.c:set_obmm_region_priv"),
    _err("failed to save private data.", "obmm_core.c:set_obmm_region_priv"),
    _err("invalid vendor_len = 0x%x, should less than 0x%x", "obmm_export.c:set_export_vendor"),
    _err("failed to save vendor data.", "obmm_export.c:set_export_vendor"),
    _err("%#x is not a known scna, lookup ret=%pe", "obmm_core.c:validate_scna"),
    # UNEXPORT / UNIMPORT
    _err("%s: invalid flags %#llx.", "obmm_export.c:obmm_unexport", "obmm_import.c:obmm_unimport"),
    _err(
        "%s: mem_id=%llu region type mismatched.",
        "obmm_export.c:obmm_unexport",
        "obmm_import.c:obmm_unimport",
    ),
    _err(
        "%s: mem_id=%llu failed, %pe.", "obmm_export.c:obmm_unexport", "obmm_import.c:obmm_unimport"
    ),
    _err(
        "remove_memory_remote(nid=%d, size=%#llx) failed: ret=%pe.",
        "obmm_import.c:teardown_remote_numa",
    ),
    # ADDR_QUERY
    _err("invalid query key type: %u.", "obmm_core.c:obmm_addr_query"),
    _err("region %llu not found.", "obmm_core.c:obmm_addr_query"),
    _err("%s: invalid offset 0x%lx", "obmm_import.c:get_offset_detail_import"),
    # EXPORT
    _err(
        "Size list is too long: max=%d, actual_length=%lld",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err(
        "Invalid pxm_numa %d",
        "obmm_export_from_pool.c:calculate_export_region_size",
        "obmm_export_from_user.c:hisi_workarounds_check_page_list",
    ),
    _err(
        "The size of new OBMM region 0x%llx on node %d is not aligned to OBMM memseg size %#lx.",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err(
        "Cannot export memory from offlined or remote numa node %d",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err("Memory size overflowed!", "obmm_export_from_pool.c:calculate_export_region_size"),
    _err(
        "The size of new OBMM region is 0. Non-zero value expected",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err(
        "Cannot use memory from multiple sockets or memory and ub controller is from different "
        "sockets.",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err(
        "memory numa id ranges: [%d, %d], ub controller pxm: %d.",
        "obmm_export_from_pool.c:calculate_export_region_size",
    ),
    _err(
        "undefined flags specified in export flags parameter %#lx.",
        "obmm_export.c:export_flags_to_region_flags",
    ),
    _err(
        "invalid size 0x%llx on node %d: not aligned to mempool granu %#lx",
        "obmm_export_from_pool.c:alloc_export_memory_pool",
    ),
    _err("%s:no allocator working on node %d", "ubmempool_allocator.c:allocate_memory_contiguous"),
    _err(
        "%s: failed to alloc %#llx bytes for node %d",
        "ubmempool_allocator.c:allocate_memory_contiguous",
    ),
    # EXPORT_PID
    _err(
        "invalid flags %#llx encountered in export_user_addr.",
        "obmm_export_from_user.c:obmm_cmd_export_pid_allowed",
    ),
    _err(
        "ALLOW_MMAP flag is not allowed in export_user_addr.",
        "obmm_export_from_user.c:obmm_cmd_export_pid_allowed",
    ),
    _err(
        "FAST flag is not allowed in export_user_addr.",
        "obmm_export_from_user.c:obmm_cmd_export_pid_allowed",
    ),
    _err(
        "export sizeof 0 memory is not allowed.",
        "obmm_export_from_user.c:obmm_cmd_export_pid_allowed",
    ),
    _err(
        "export memory size is not aligned to PMD_SIZE.",
        "obmm_export_from_user.c:obmm_cmd_export_pid_allowed",
    ),
    _err("get tsk from pid(%d) failed.", "obmm_export_from_user.c:alloc_export_memory_pid"),
    _err("get mm from pid(%d) failed.", "obmm_export_from_user.c:alloc_export_memory_pid"),
    _err("pin memory failed, %d.", "obmm_export_from_user.c:alloc_export_memory_pid"),
    _err("failed to pin user pages(%d/%lu)!", "obmm_export_from_user.c:alloc_export_memory_pid"),
    _err(
        "Only hugetlbfs pages are allowed",
        "obmm_export_from_user.c:hisi_workarounds_check_page_list",
    ),
    _err("Invalid node ID %d.", "obmm_export_from_user.c:hisi_workarounds_check_page_list"),
    _err("hisi workarounds check no passing.", "obmm_export_from_user.c:alloc_export_memory_pid"),
    # IMPORT
    _err(
        "Invalid import flags %#lx (unknown flags: %#lx).", "obmm_import.c:import_to_region_flags"
    ),
    _err(
        "Exactly one of {ALLOW_MMAP, NUMA_REMOTE} must be specified as import flag.",
        "obmm_import.c:import_to_region_flags",
    ),
    _err("Preimport must be used with NUMA_REMOTE.", "obmm_import.c:import_to_region_flags"),
    _err("Zero memory segment size is invalid", "obmm_import.c:validate_import_region"),
    _err(
        "PA segments not aligned to OBMM basic granu: base=%#llx, size=%#zx, granularity=%#lx.",
        "obmm_import.c:validate_pa_range",
    ),
    _err("PA=0 unexpected.", "obmm_import.c:validate_pa_range"),
    _err("PA range overflow: base=%#llx, size=%#zx.", "obmm_import.c:validate_pa_range"),
    _err(
        "invalid numa base distance %d: reserved values used.",
        "obmm_preimport.c:is_numa_base_dist_valid",
    ),
    _err(
        "PA range invalid. Non-UBMEM memory cannot be mmaped as import memory",
        "obmm_import.c:get_pa_range_mem_cap",
    ),
    _err("failed to setup ubmem resource: ret=%pe", "obmm_import.c:setup_pa"),
    _err("memid=%d: failed to setup memdev resource: %pe", "obmm_import.c:setup_iomem_resource"),
    _err("Remote NUMA creation failed: %d", "obmm_import.c:setup_remote_numa"),
    _err(
        "failed to teardown remote numa on rollback, ret=%pe.",
        "obmm_import.c:prepare_import_memory",
    ),
    _err("Failed to prepare import memory: ret=%pe", "obmm_import.c:obmm_import"),
    # the PA-range tree of direct imports and preimport declarations (IMPORT, DECLARE_PREIMPORT)
    _addr_check("failed to occupy PA range: ret=%pe", "obmm_addr_check.c:occupy_pa_range"),
    _err("Failed to create import device. ret=%pe", "obmm_import.c:obmm_import"),
    _err(
        "PA range invalid. Cacheable memory cannot be managed with numa.remote",
        "obmm_import.c:setup_remote_numa",
    ),
    # IMPORT of a preimported range
    _err("No information found with PA requested.", "obmm_preimport_prefilled.c:get_pa_mapping"),
    _err("PA requested is not a preimport address.", "obmm_preimport_prefilled.c:get_pa_mapping"),
    _err("Preimport process not finished. Try later.", "obmm_preimport_prefilled.c:get_pa_mapping"),
    _err(
        "scna-dcna pair mismatch: <%#x, %#x> used in import; <%#x, %#x> in preimport.",
        "obmm_preimport.c:check_preimport_datapath_common",
    ),
    _err(
        "seid mismatch: %#llx:%#llx used in import; %#llx:%#llx in preimport.",
        "obmm_preimport.c:check_preimport_datapath_common",
    ),
    _err(
        "deid mismatch: %#llx:%#llx used in import; %#llx:%#llx in preimport.",
        "obmm_preimport.c:check_preimport_datapath_common",
    ),
    _err(
        "requested range is not managed by preimport.",
        "obmm_preimport_prefilled.c:occupy_ppr_blocks",
    ),
    _err(
        "requested range conflicts on preimport block %lu.",
        "obmm_preimport_prefilled.c:occupy_ppr_blocks",
    ),
    # DECLARE_PREIMPORT / UNDECLARE_PREIMPORT
    _err("Module is dying. Reject all preimport requests", "obmm_preimport.c:obmm_preimport"),
    _err("preimport length not aligned to %#lx.", "obmm_preimport.c:check_preimport_cmd_common"),
    _err("preimport base PA not aligned to %#lx.", "obmm_preimport.c:check_preimport_cmd_common"),
    _err("preimport PA range overflowed.", "obmm_preimport.c:check_preimport_cmd_common"),
    _err("invalid preimport length 0.", "obmm_preimport.c:check_preimport_cmd_common"),
    _err(
        "undefined preimport flags specified in %#llx.",
        "obmm_preimport.c:check_preimport_cmd_common",
    ),
    _err("invalid preimport PA base addr 0.", "obmm_preimport_prefilled.c:check_preimport_cmd"),
    _err(
        "failed to allocate preimport range bitmap.",
        "obmm_preimport_prefilled.c:create_prefilled_preimport_range",
    ),
    _err(
        "failed to setup ubmem resource on preimport: ret=%pe",
        "obmm_preimport_prefilled.c:create_prefilled_preimport_range",
    ),
    _err(
        "PA range invalid. Cacheable memory cannot be managed with preimport",
        "obmm_preimport.c:preimport_prepare_common",
    ),
    _err(
        "failed to call add_memory_remote(nid=%d): %pe", "obmm_preimport.c:preimport_prepare_common"
    ),
    _err(
        "undefined unpreimport flags specified in %#llx.",
        "obmm_preimport.c:check_unpreimport_cmd_common",
    ),
    _err(
        "failed to identify preimport range during unpreimport.",
        "obmm_preimport_prefilled.c:preimport_release_prefilled",
    ),
    _err(
        "requested range touches ppr but is not an exact match.",
        "obmm_preimport_prefilled.c:preimport_release_prefilled",
    ),
    _err(
        "preimport cannot be released: %u active users found.",
        "obmm_preimport_prefilled.c:preimport_release_prefilled",
    ),
    # shmdev open
    _err(
        "Noncacheable region %d cannot be mmaped with cachable mode.",
        "obmm_shm_dev.c:obmm_shm_fops_open",
    ),
    _err(
        "Cacheable region %d cannot be mmaped with noncachable mode.",
        "obmm_shm_dev.c:obmm_shm_fops_open",
    ),
    # shmdev mmap
    _err(
        "mmap region %d: MAP_PRIVATE is not supported, use MAP_SHARED",
        "obmm_shm_dev.c:obmm_shm_fops_mmap",
    ),
    _err("mmap region %d: not allow to be mmaped", "obmm_shm_dev.c:obmm_shm_fops_mmap"),
    _err("%s false: vm_flags: %#lx, f_mode: %#x", "obmm_shm_dev.c:validate_perm"),
    _err("mmap region %d: invalid vma permission", "obmm_shm_dev.c:obmm_shm_fops_mmap"),
    _err("PMD mmap vma not PMD-aligned: start=%#lx end=%#lx", "obmm_shm_dev.c:obmm_shm_fops_mmap"),
    _err("PMD mmap offset not PMD-aligned: offset=%#lx", "obmm_shm_dev.c:obmm_shm_fops_mmap"),
    _err(
        "map with PAGE_SIZE and PMD_SIZE granu should not be mixed on the same region",
        "obmm_shm_dev.c:obmm_shm_fops_mmap",
    ),
    _err(
        "mmap region %d: offset:%#lx, size:%#lx over region size: %#llx",
        "obmm_shm_dev.c:obmm_shm_fops_mmap",
    ),
    _err(
        "region cannot be mapped to cc and nc at the same time",
        "obmm_shm_dev.c:obmm_shm_fops_mmap",
    ),
    _err("Failed to mmap region %d. ret=%pe", "obmm_shm_dev.c:obmm_shm_fops_mmap"),
    # shmdev UPDATE_RANGE
    _err("failed to load update_range argument", "obmm_shm_dev.c:obmm_shm_fops_ioctl"),
    _err(
        "Ownership operation is not applicable to o-sync mmap %d.",
        "obmm_shm_dev.c:validate_update_info",
    ),
    _err(
        "error updating ownership: ownership of memdev %d not initialized.",
        "obmm_shm_dev.c:validate_update_info",
    ),
    _err("invalid range: start=%#llx end=%#llx", "obmm_shm_dev.c:validate_update_info"),
    _err(
        "ownership update must be aligned: pid=%d start=%#llx end=%#llx",
        "obmm_shm_dev.c:validate_update_info",
    ),
    _err("Invalid mem_state: %#x", "obmm_shm_dev.c:validate_state"),
    _err(
        "VMA gap detected: expected start=%#lx, actual=%#lx", "obmm_shm_dev.c:obmm_shm_update_range"
    ),
    _err(
        "VMA does not belong to this region: vma=[%#lx, %#lx)",
        "obmm_shm_dev.c:obmm_shm_update_range",
    ),
    _err(
        "VMAs do not cover requested range: expected_end=%#llx actual_end=%#lx",
        "obmm_shm_dev.c:obmm_shm_update_range",
    ),
)

_SILENT = "the real driver refuses here without a line of its own"
_EMULATOR = "a check only the emulator makes"
_UNREAD = "the real line is in a file the facts were not read from"

#: The emulator's own refusal lines (``obmm_refuse_emu()``): format -> why it is not a real line.
EMULATOR_OWN: dict[str, str] = {
    "no memory for a region": _SILENT + " (kzalloc() of the region fails: -ENOMEM)",
    "no memory for a preimport range": _SILENT + " (kzalloc() fails: -ENOMEM)",
    "no memory for the PA range": _SILENT + " (kzalloc() fails: -ENOMEM)",
    "no memory for the quarantine entry": _EMULATOR + " (the pinned pages' quarantine)",
    "no memory for a page list of %lu pages": _SILENT + " (kvmalloc_array() fails: -ENOMEM)",
    "no memory for %u bytes of vendor data": _SILENT + " (kmalloc() fails: -ENOMEM)",
    "no active region contains pa=%#llx": _SILENT + " (obmm_core.c:obmm_query_by_pa: -ENOENT)",
    "mem_id=%llu: invalid offset %#llx (size exceeded)": _UNREAD
    + " (an export's offset: obmm_export_region_ops.c:get_offset_detail_export_region)",
    "invalid cache_ops %u": _UNREAD + " (obmm_cache.c:obmm_is_valid_cache_ops)",
    "cannot allocate %#llx bytes%s from the pool of node %d": _EMULATOR
    + " (an allocation that failed otherwise than ENOMEM: a wait for quarantined memory)",
    "no free export record slot in the control region (%d per node)": _EMULATOR
    + " (the control region's record slots)",
    "length %#llx not a multiple of memseg size %#llx": _EMULATOR
    + " (FIDELITY.md: EXPORT_PID memsegs)",
    "memseg %lu (page %lu) is not physically contiguous and %#llx-aligned": _EMULATOR
    + " (FIDELITY.md: EXPORT_PID memsegs)",
    "the caller may not access pid(%d) (ptrace credential rule)": _EMULATOR
    + " (FIDELITY.md: EXPORT_PID of another process)",
    "length %#llx exceeds the machine's RAM (%lu pages)": _EMULATOR
    + " (refused before the page array is sized)",
    "no live export covers pa=%#llx size=%#llx: memory nobody exported is not hot-added": _EMULATOR
    + " (the emulated UMMU)",
    "pa=%#llx size=%#llx: its exporter maps that memory (EXPORT_PID or mapped export): "
    "not hot-added": _EMULATOR + " (the emulated UMMU: FIDELITY.md, a borrow of mapped memory)",
    "emulated UMMU: the export covering pa=%#llx was withdrawn during the import": _EMULATOR
    + " (the emulated UMMU)",
    "emulated UMMU: the export covering pa=%#llx was withdrawn while the import waited for a "
    "memory hot-plug": _EMULATOR + " (the emulated UMMU)",
    "killed while waiting for a memory hot-plug to finish (pa=%#llx)": _EMULATOR
    + " (the real wait is not killable: FIDELITY.md)",
    "killed while waiting for a memory hot-plug to finish": _EMULATOR
    + " (the real wait is not killable: FIDELITY.md)",
    "import %d was revoked (its export is gone)": _EMULATOR + " (the emulated UMMU)",
}


def real_formats() -> dict[str, Line]:
    """The table by the text after :data:`PREFIX` (sub-prefix and format)."""
    return {line.text: line for line in REAL}
