"""What the ubs-mem SDK's, ubsmd's and UBSE's error codes mean, and their likely causes, as data.

The stack above OBMM on a UB host: an application calls the ubs-mem SDK (``ubsmem_shmem_allocate``
and friends, libubsm), which asks the ubs-mem daemon (ubsmd) over IPC, which calls UBS Engine
(UBSE) through ``libubse-client.so.1``, whose daemon finally drives ``obmm.ko`` on the nodes.
Each layer has its own codes and folds the one below into a few: any failed UBSE call becomes
ubsmd's 800, and the SDK returns ubsmd's 800/801/802 all as 6050.  So "daemon error 800" names
a layer, not a cause; the UBSE code under it is in ubsmd's log.

Facts read from the public sources (no code of theirs here), each cause with the ``file:function``
(or ``file:CONSTANT``) that decides it, in the repository :data:`REPOS` names.
``obmm-testbed explain ubsm CODE`` prints an entry; the causes page prints :func:`render_markdown`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The repositories the citations point into, with the commit they were read at.
REPOS: dict[str, str] = {
    "ubs-mem": "openeuler-mirror/ubs-mem @ acc593fcde04 (master)",
    "ubs-engine": "openeuler-mirror/ubs-engine @ 594cfedd2418 (master)",
}

#: The layers, outermost first: who returns the code, and where a user sees it.
LAYERS: dict[str, str] = {
    "SDK": "returned by the ubs-mem SDK's ubsmem_* calls (UBSM_ERR_*)",
    "ubsmd": (
        "ubsmd's own code (MXM_ERR_*), in the SDK's and ubsmd's logs as ret=<code>; "
        "the caller gets it mapped (800, 801, 802 -> 6050)"
    ),
    "UBSE": "a UBS Engine code (ubs_error_t): in ubsmd's log as ret=<code>; ubsmd returns 800",
}


@dataclass(frozen=True)
class Cause:
    """One likely cause and the source that decides it."""

    text: str
    repo: str  # a key of REPOS
    where: str  # "path/file.ext:Function" or "path/file.ext:CONSTANT"

    def citation(self) -> str:
        return f"{self.repo} {self.where}"


@dataclass(frozen=True)
class UbsmCode:
    code: int
    layer: str  # a key of LAYERS
    name: str
    defined: Cause  # where the number is defined (text: the one-line meaning)
    causes: tuple[Cause, ...]
    note: str = ""

    @property
    def meaning(self) -> str:
        return self.defined.text


_ERR_H = "src/common/rack_mem_err.h"
_DEF_H = "src/app_lib/include/ubs_mem_def.h"
_MAP_H = "src/common/rack_mem_functions.h"
_ADAPTER = "src/under_api/ubse/ubse_mem_adapter.cpp"
_SHMEM = "src/app_lib/mxm_shm_lib/mxmem_shmem.cpp"
_LIBCOMMON = "src/app_lib/common/rack_mem_lib_common.h"
_IPC = "src/mxm_shm/ipc_handler.cpp"
_UBS_ERROR_H = "src/sdk/c/include/ubs_error.h"
_HELPER = "src/sdk/c/libubse_helper.cpp"
_SHARE_API = "src/controllers/mem/mem_controller/api/ubse_mem_controller_share_api.cpp"
_FILTERS = "src/controllers/mem/mem_scheduler/scheduler_filter"

_FOLDED_INTO_800 = (
    "ubsmd turns any failed UBSE call into 800 except a few it names: 1006 at create (6021 "
    "already exists), 1007 (6020), 1024 at delete (6024 in use), 1015 at detach (802)"
)

CODES: dict[int, UbsmCode] = {
    c.code: c
    for c in (
        UbsmCode(
            6010,
            "SDK",
            "UBSM_ERR_PARAM_INVALID",
            Cause(
                "an argument was refused, by the SDK itself or by ubsmd",
                "ubs-mem",
                f"{_DEF_H}:UBSM_ERR_PARAM_INVALID",
            ),
            (
                Cause(
                    "the 4 MiB alignment refusal: the size, rounded up to the page size, is 0 or "
                    "not a multiple of 4 MiB (RACK_MEM_PAGE_SIZE); refused in the calling "
                    "process before any request reaches ubsmd (internal code 104, "
                    "MXM_ERR_PARAM_INVALID; the SDK log says 'does not align with 4194304')",
                    "ubs-mem",
                    f"{_LIBCOMMON}:CheckRackMemSize",
                ),
                Cause(
                    "name or region_name is NULL, empty, or 48 characters or longer "
                    "(MAX_SHM_NAME_LENGTH, MAX_REGION_NAME_DESC_LENGTH)",
                    "ubs-mem",
                    f"{_SHMEM}:ubsmem_shmem_allocate_impl",
                ),
                Cause(
                    "flags outside the known set, or a combination the SDK forbids (NONCACHE, "
                    "ONLY_IMPORT_NONCACHE, WITH_LOCK and CACHE each allow only a few companions)",
                    "ubs-mem",
                    f"{_SHMEM}:ValidateFlag",
                ),
                Cause(
                    "UBSM_FLAG_MMAP_HUGETLB_PMD with a size that is not a multiple of the PMD "
                    "huge page (2 MiB with 4K pages, 512 MiB with 64K pages)",
                    "ubs-mem",
                    f"{_MAP_H}:GetHugeTlbPmdSize",
                ),
                Cause(
                    "ubsmd: a region lists more hosts than MEM_TOPOLOGY_MAX_HOSTS, or a node id "
                    "of the region is not a number",
                    "ubs-mem",
                    f"{_IPC}:MxmServerMsgHandle::ShmCreate",
                ),
                Cause(
                    "ubsmd's NULLPTR, PARAM_INVALID, MMAP_VA_FAILED and REGION_PARAM_INVALID all "
                    "reach the caller as 6010",
                    "ubs-mem",
                    f"{_MAP_H}:GetErrCode",
                ),
            ),
        ),
        UbsmCode(
            6020,
            "SDK",
            "UBSM_ERR_NOT_FOUND",
            Cause(
                "a region, shared memory, lease or lock of that name does not exist",
                "ubs-mem",
                f"{_DEF_H}:UBSM_ERR_NOT_FOUND",
            ),
            (
                Cause(
                    "allocate: region_name names no region ubsmd knows (MXM_ERR_REGION_NOT_EXIST)",
                    "ubs-mem",
                    f"{_IPC}:MxmServerMsgHandle::ShmCreate",
                ),
                Cause(
                    "map: UBSE does not know the shared memory name (UBSE 1007, "
                    "MXM_ERR_SHM_NOT_EXIST): never allocated, or already deallocated",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmGetUserData",
                ),
                Cause(
                    "deallocate: UBSE does not know the name (UBSE 1007)",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmDelete",
                ),
                Cause(
                    "ubsmd's REGION_NOT_FOUND, REGION_NOT_EXIST, SHM_NOT_FOUND, SHM_NOT_EXIST, "
                    "LEASE_NOT_FOUND, LEASE_NOT_EXIST and LOCK_NOT_FOUND all reach the caller "
                    "as 6020",
                    "ubs-mem",
                    f"{_MAP_H}:GetErrCode",
                ),
            ),
        ),
        UbsmCode(
            6050,
            "SDK",
            "UBSM_ERR_UBSE",
            Cause(
                "ubsmd's call into UBSE failed: ubsmd returned 800, 801 or 802 (see those); "
                "the SDK's log line names which (e.g. 'UbsMemShmCreate failed, ret=800')",
                "ubs-mem",
                f"{_DEF_H}:UBSM_ERR_UBSE",
            ),
            (
                Cause(
                    "800 (MXM_ERR_UBSE_INNER), 801 (MXM_ERR_UBSE_LIB) and 802 "
                    "(MXM_ERR_UBSE_NOT_ATTACH) all map to 6050",
                    "ubs-mem",
                    f"{_MAP_H}:GetErrCode",
                ),
                Cause(
                    "allocate logs ubsmd's code before mapping it",
                    "ubs-mem",
                    f"{_SHMEM}:ubsmem_shmem_allocate_impl",
                ),
            ),
        ),
        UbsmCode(
            6051,
            "SDK",
            "UBSM_ERR_OBMM",
            Cause(
                "an OBMM step in the calling process failed: opening or switching the ownership "
                "of the shared memory's /dev/obmm_shmdev devices",
                "ubs-mem",
                f"{_DEF_H}:UBSM_ERR_OBMM",
            ),
            (
                Cause(
                    "map: opening /dev/obmm_shmdevN failed (MXM_ERR_SHM_OBMM_OPEN; the open's "
                    "errno is in the SDK's log), for example a cacheable open of an import the "
                    "driver allows only with O_SYNC (EPERM)",
                    "ubs-mem",
                    "src/app_lib/mxm_shm_lib/RackMemShm.cpp:RackMemShmMmapByMemID",
                ),
                Cause(
                    "the SDK opens with O_SYNC only when the memory was allocated with "
                    "UBSM_FLAG_NONCACHE or UBSM_FLAG_ONLY_IMPORT_NONCACHE, cacheable otherwise",
                    "ubs-mem",
                    f"{_LIBCOMMON}:ObmmOpenInternal",
                ),
                Cause(
                    "set_ownership: the OBMM ownership switch of a mapped range failed "
                    "(MXM_ERR_OBMM_INNER)",
                    "ubs-mem",
                    "src/app_lib/mxm_shm_lib/RackMemShm.cpp:RackMemShm::UbsMemShmSetOwnerShipOpt",
                ),
            ),
        ),
        UbsmCode(
            800,
            "ubsmd",
            "MXM_ERR_UBSE_INNER",
            Cause(
                "a UBSE call made by ubsmd failed; the UBSE code is in ubsmd's log "
                "(e.g. 'pUbseMemShmCreate failed, ret=1013')",
                "ubs-mem",
                f"{_ERR_H}:MXM_ERR_UBSE_INNER",
            ),
            (
                Cause(
                    "allocate: UBSE refused or failed the shared-memory create (its code: 1000, "
                    "1005, 1013, ... see those); tried first with the caller's NUMA affinity, "
                    "then without",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmCreate",
                ),
                Cause(
                    "allocate in the 'default' region: UBSE's node list has fewer than two nodes "
                    "(MIN_NODE_NUM): a one-node cluster, or the other node has not joined",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::PopulateHostNameMap",
                ),
                Cause(
                    "UBSE's topology calls failed (ubs_topo_node_local_get, ubs_topo_link_list; "
                    "ubs_topo_node_list in PopulateHostNameMap): the UBSE daemon is not running "
                    "or its socket is not reachable by ubsmd",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::InitializeRegionList",
                ),
                Cause(
                    "map/attach: UBSE's attach failed (1003 another user, 1005 decoder or obmm "
                    "import failure on the importing node)",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmAttach",
                ),
                Cause(
                    "deallocate: UBSE's delete failed with anything but 1024 or 1007",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmDelete",
                ),
            ),
            note=_FOLDED_INTO_800,
        ),
        UbsmCode(
            801,
            "ubsmd",
            "MXM_ERR_UBSE_LIB",
            Cause(
                "ubsmd could not load the UBSE client library or one of its symbols",
                "ubs-mem",
                f"{_ERR_H}:MXM_ERR_UBSE_LIB",
            ),
            (
                Cause(
                    "/usr/lib64/libubse-client.so.1 is missing or cannot be loaded (UBSE's client "
                    "package not installed); ubsmd loads it lazily, so every call that needs UBSE "
                    "fails this way",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::Initialize",
                ),
                Cause(
                    "the library lacks a symbol ubsmd resolves: all of them are required "
                    "(ubs_engine_client_*, ubs_topo_*, ubs_mem_fd_*/numa_*/shm_*, "
                    "ubs_engine_log_callback_register) and the missing one is named in ubsmd's "
                    "log; a UBSE client without the shared-memory calls (ubs-engine @973f4300, "
                    "branch br_container_dev_20260130, has no ubs_mem_shm_*) fails this way",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::DlopenLibUbse",
                ),
            ),
        ),
        UbsmCode(
            802,
            "ubsmd",
            "MXM_ERR_UBSE_NOT_ATTACH",
            Cause(
                "UBSE says this node never attached the shared memory being detached",
                "ubs-mem",
                f"{_ERR_H}:MXM_ERR_UBSE_NOT_ATTACH",
            ),
            (
                Cause(
                    "detach/unmap of a name UBSE has no attach record for on this node "
                    "(UBSE 1015, UBS_ENGINE_ERR_SHM_NO_ATTACH)",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmDetach",
                ),
                Cause(
                    "ubsmd's own unmap path treats it as done; only callers that pass it on see "
                    "6050",
                    "ubs-mem",
                    f"{_IPC}:ShmUnMapInner",
                ),
            ),
        ),
        UbsmCode(
            1000,
            "UBSE",
            "UBS_ENGINE_ERR_OUT_OF_RANGE",
            Cause(
                "an argument out of range, refused by UBSE's client library before the request "
                "is sent",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_OUT_OF_RANGE",
            ),
            (
                Cause(
                    "shared-memory size below 4 MiB (UBS_MEM_MIN_SIZE) or not a multiple of "
                    "2 MiB (UBSE_SHM_MEM_ALIGNMENT)",
                    "ubs-engine",
                    f"{_HELPER}:ubse_size_is_valid",
                ),
                Cause(
                    "a region or provider node list that is empty or longer than "
                    "UBS_MEM_MAX_SLOT_NUM",
                    "ubs-engine",
                    f"{_HELPER}:ubse_mem_nodes_t_is_valid",
                ),
                Cause(
                    "the UBSE socket path given to the client is longer than 107 characters",
                    "ubs-engine",
                    "src/sdk/c/ubs_engine.c:ubs_engine_client_initialize",
                ),
            ),
            note=(
                "ubsmd's MXM_ERR_UNKNOWN is 1000 too (an exception while cleaning an unused "
                "attach record, ipc_handler.cpp:CleanNotUsedRecordShareMemory); the SDK has no "
                "mapping for it and returns 6099 (UBSM_ERR_BUFF)"
            ),
        ),
        UbsmCode(
            1003,
            "UBSE",
            "UBS_ENGINE_ERR_AUTH_FAILED",
            Cause(
                "the user asking is not the user that created the shared memory",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_AUTH_FAILED",
            ),
            (
                Cause(
                    "attach: the caller's username differs from the creator's (their uids, when "
                    "the creator has no username recorded); root, uid 0 and 'ubse' always pass",
                    "ubs-engine",
                    "src/adapter_plugins/mmi/ubse_mmi_def.cpp:UbseUdsInfo::CheckPermission",
                ),
                Cause(
                    "attach is refused where that check fails",
                    "ubs-engine",
                    f"{_SHARE_API}:ShmAttachPreCheck",
                ),
                Cause(
                    "detach by another user than the one that attached",
                    "ubs-engine",
                    f"{_SHARE_API}:UbseMemShareDetach",
                ),
                Cause(
                    "delete by another user than the creator",
                    "ubs-engine",
                    f"{_SHARE_API}:ShareReturnValidate",
                ),
            ),
        ),
        UbsmCode(
            1005,
            "UBSE",
            "UBS_ENGINE_ERR_INTERNAL",
            Cause(
                "UBSE failed inside: on the importing node, most often the decoder or the OBMM "
                "import",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_INTERNAL",
            ),
            (
                Cause(
                    "attach: the importing node's UB decoder entry could not be added (or its "
                    "chip/die not found for the socket)",
                    "ubs-engine",
                    f"{_SHARE_API}:RealImportDecoder",
                ),
                Cause(
                    "attach: the OBMM import on the importing node failed "
                    "(UBSE_MMI_OBMM_OP_FAILED, an internal code the client reports as 1005)",
                    "ubs-engine",
                    "src/adapter_plugins/mmi/ubse_mem_instance_inner.cpp:MemInstanceInnerShm::MemShmImportExecutor",
                ),
                Cause(
                    "the client maps every UBSE-internal code (10000 and up) it does not name to "
                    "1005",
                    "ubs-engine",
                    f"{_HELPER}:ubse_map_daemon_error",
                ),
                Cause(
                    "attach from a node that is not in the shared memory's region",
                    "ubs-engine",
                    f"{_SHARE_API}:ShmAttachPreCheck",
                ),
                Cause(
                    "the export or import object could not be sent to the node's agent",
                    "ubs-engine",
                    f"{_SHARE_API}:HandleSendExportError",
                ),
            ),
        ),
        UbsmCode(
            1013,
            "UBSE",
            "UBS_ENGINE_ERR_ALLOCATE",
            Cause(
                "UBSE's scheduler found no node to lend the memory",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_ALLOCATE",
            ),
            (
                Cause(
                    "the scheduler's filters left no lender (retried while nodes reconcile)",
                    "ubs-engine",
                    f"{_SHARE_API}:ShareAllocate",
                ),
                Cause(
                    "a shared-memory request passes ConfigConsistency, LenderRole, Provider, "
                    "NodeState, Region, LendCount, TopoReachability, MaxLentSize and FreeMemory "
                    "filters (and RequestedProviders, SocketAffinity, SpecifiedLender when asked)",
                    "ubs-engine",
                    "src/controllers/mem/mem_scheduler/ubse_mem_scheduler_request.cpp:"
                    "SchedulerRequest::FromShareBorrowReq",
                ),
                Cause(
                    "no socket has the requested size free above its high watermark",
                    "ubs-engine",
                    f"{_FILTERS}/ubse_mem_scheduler_free_memory_filter.cpp:FreeMemoryFilter::FilterNodes",
                ),
                Cause(
                    "the other nodes are configured not to lend (isLender=false in ubse.conf)",
                    "ubs-engine",
                    f"{_FILTERS}/ubse_mem_scheduler_lender_role_filter.cpp:LenderRoleFilter::FilterNodes",
                ),
                Cause(
                    "the candidate nodes are not in the WORKING cluster state",
                    "ubs-engine",
                    f"{_FILTERS}/ubse_mem_scheduler_node_state_filter.cpp:NodeStateFilter::FilterNodes",
                ),
                Cause(
                    "a candidate cannot reach every node of the requested region",
                    "ubs-engine",
                    f"{_FILTERS}/ubse_mem_scheduler_region_filter.cpp:RegionFilter::FilterNodes",
                ),
                Cause(
                    "requests are rounded up to whole blocks of obmm.memory.block.size (128 MiB "
                    "by default with 4K pages and buddy_highmem or hugetlb_pmd, 512 MiB with 64K "
                    "pages, 1 GiB with hugetlb_pud), so small allocations use a lender's memory "
                    "up sooner than their sizes add up to",
                    "ubs-engine",
                    "src/controllers/node/ubse_node_controller_util.cpp:GetBlockSize",
                ),
                Cause(
                    "the export is made of ceil(size / block size) blocks",
                    "ubs-engine",
                    "src/adapter_plugins/mmi/ubse_mem_instance_inner.cpp:"
                    "MemInstanceInnerCommon::SetObmmDescDefaultErrorValue",
                ),
            ),
        ),
        UbsmCode(
            1006,
            "UBSE",
            "UBS_ENGINE_ERR_EXISTED",
            Cause(
                "the shared memory (or this node's attach of it) exists already",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_EXISTED",
            ),
            (
                Cause(
                    "create: the name is in use, by an export or an import of that name",
                    "ubs-engine",
                    f"{_SHARE_API}:UbseMemShareBorrow",
                ),
                Cause(
                    "attach on a node that has attached: the descriptor comes back all the same, "
                    "and ubsmd takes it as success",
                    "ubs-engine",
                    f"{_SHARE_API}:ExistImportObjHandler",
                ),
                Cause(
                    "ubsmd turns a create's 1006 into 6021 (already exists)",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmCreate",
                ),
            ),
        ),
        UbsmCode(
            1007,
            "UBSE",
            "UBS_ENGINE_ERR_NOT_EXIST",
            Cause(
                "no shared memory of that name",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_NOT_EXIST",
            ),
            (
                Cause(
                    "attach of a name with no export (never created, or deleted)",
                    "ubs-engine",
                    f"{_SHARE_API}:ShmAttachPreCheck",
                ),
                Cause(
                    "delete of a name with no export",
                    "ubs-engine",
                    f"{_SHARE_API}:ShareReturnValidate",
                ),
            ),
        ),
        UbsmCode(
            1015,
            "UBSE",
            "UBS_ENGINE_ERR_SHM_NO_ATTACH",
            Cause(
                "this node has not attached the shared memory",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_SHM_NO_ATTACH",
            ),
            (
                Cause(
                    "detach on a node without an import of that name (an unknown name included)",
                    "ubs-engine",
                    f"{_SHARE_API}:UbseMemShareDetach",
                ),
                Cause(
                    "ubsmd turns it into 802",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmDetach",
                ),
            ),
        ),
        UbsmCode(
            1024,
            "UBSE",
            "UBS_ENGINE_ERR_SHM_ATTACH_USING",
            Cause(
                "the shared memory is attached somewhere, so it cannot be deleted",
                "ubs-engine",
                f"{_UBS_ERROR_H}:UBS_ENGINE_ERR_SHM_ATTACH_USING",
            ),
            (
                Cause(
                    "delete while any node still has an import of it: detach there first",
                    "ubs-engine",
                    f"{_SHARE_API}:ShareReturnValidate",
                ),
                Cause(
                    "ubsmd turns it into 6024 (in use)",
                    "ubs-mem",
                    f"{_ADAPTER}:UbseMemAdapter::ShmDelete",
                ),
            ),
        ),
    )
}

#: Words `explain ubsm` takes for a code.
ALIASES: dict[str, int] = {"align": 6010, "alignment": 6010, "4mib": 6010}


def lookup(key: str) -> UbsmCode | None:
    """The entry for a code given as a number or an alias (`align`), or None."""
    key = key.strip().lower()
    if key in ALIASES:
        return CODES[ALIASES[key]]
    if key.isdigit():
        return CODES.get(int(key))
    return None


def known() -> str:
    """The codes and aliases `explain ubsm` knows, for its refusal message."""
    codes = ", ".join(str(c) for c in CODES)
    return f"{codes} (or {', '.join(ALIASES)} for the 4 MiB alignment refusal)"


def render_text(entry: UbsmCode) -> str:
    """What `obmm-testbed explain ubsm CODE` prints."""
    lines = [
        f"{entry.code} {entry.name} ({entry.layer}: {LAYERS[entry.layer]})",
        f"  {entry.meaning}  [{entry.defined.citation()}]",
        "likely causes:",
    ]
    lines += [f"  - {c.text}  [{c.citation()}]" for c in entry.causes]
    if entry.note:
        lines.append(f"note: {entry.note}")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """The causes page's table of the SDK's, ubsmd's and UBSE's codes."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| code | layer | name | meaning | likely causes (source) |", "|---|---|---|---|---|"]
    for entry in CODES.values():
        causes = [f"{cell(c.text)} (`{c.citation()}`)" for c in entry.causes]
        if entry.note:
            causes.append(f"note: {cell(entry.note)}")
        lines.append(
            f"| {entry.code} | {entry.layer} | `{entry.name}` | {cell(entry.meaning)} "
            f"(`{entry.defined.citation()}`) | {'<br>'.join(causes)} |"
        )
    sources = "; ".join(f"{k}: {v}" for k, v in REPOS.items())
    return "\n".join(lines) + f"\n\nSources read: {sources}.\n"
