"""UBSE's return codes that our service and client library give, with where UBSE defines them.

Numbers from UBSE's public client header (ubs-engine ``src/sdk/c/include/ubs_error.h``,
``ubs_error_t``); the meaning of each in the shared-memory calls from the server code cited in
docs/ubs-mem.md.  ubsmd compares against these numbers, so they must not change.
"""

from __future__ import annotations

SUCCESS = 0
#: ``UBS_ERR_INVALID_ARG``: a name that is empty, 48 characters or longer, or has a character
#: other than letters, digits and ``._:-`` (libubse_helper.cpp:ubse_mem_name_is_valid).
INVALID_ARG = 1
#: ``UBS_ERR_NULL_POINTER``.
NULL_POINTER = 3
#: ``UBS_ERR_NOT_SUPPORTED``: the fd and NUMA borrowing calls (not ours; docs/ubs-mem.md).
NOT_SUPPORTED = 41
#: ``UBS_ENGINE_ERR_OUT_OF_RANGE``: size under 4 MiB or not a multiple of 2 MiB; a node list
#: empty or over 16 (libubse_helper.cpp:ubse_size_is_valid, ubse_mem_nodes_t_is_valid).
OUT_OF_RANGE = 1000
#: ``UBS_ENGINE_ERR_CONNECTION_FAILED``: the client could not reach the service's socket.
CONNECTION_FAILED = 1002
#: ``UBS_ENGINE_ERR_AUTH_FAILED``: another user's shared memory
#: (ubse_mmi_def.cpp:UbseUdsInfo::CheckPermission).
AUTH_FAILED = 1003
#: ``UBS_ENGINE_ERR_INTERNAL``: the import on the attaching node failed, or that node is not
#: in the region (ubse_mem_controller_share_api.cpp:ShmAttachPreCheck, RealImportDecoder).
INTERNAL = 1005
#: ``UBS_ENGINE_ERR_EXISTED``: create of a name that exists; attach on a node that has attached
#: (the descriptor is returned all the same: ExistImportObjHandler).
EXISTED = 1006
#: ``UBS_ENGINE_ERR_NOT_EXIST``: no shared memory of that name.
NOT_EXIST = 1007
#: ``UBS_ENGINE_ERR_ALLOCATE``: no node can lend (ShareAllocate's scheduler found none).
ALLOCATE = 1013
#: ``UBS_ENGINE_ERR_SHM_NO_ATTACH``: detach on a node that has not attached.
SHM_NO_ATTACH = 1015
#: ``UBS_ENGINE_ERR_SHM_ATTACH_USING``: delete while a node is attached (ShareReturnValidate).
SHM_ATTACH_USING = 1024
#: ``UBS_ENGINE_ERR_NODE_NOT_EXIST``: a slot id no node has (numastat).
NODE_NOT_EXIST = 1027

NAMES: dict[int, str] = {
    SUCCESS: "UBS_SUCCESS",
    INVALID_ARG: "UBS_ERR_INVALID_ARG",
    NULL_POINTER: "UBS_ERR_NULL_POINTER",
    NOT_SUPPORTED: "UBS_ERR_NOT_SUPPORTED",
    OUT_OF_RANGE: "UBS_ENGINE_ERR_OUT_OF_RANGE",
    CONNECTION_FAILED: "UBS_ENGINE_ERR_CONNECTION_FAILED",
    AUTH_FAILED: "UBS_ENGINE_ERR_AUTH_FAILED",
    INTERNAL: "UBS_ENGINE_ERR_INTERNAL",
    EXISTED: "UBS_ENGINE_ERR_EXISTED",
    NOT_EXIST: "UBS_ENGINE_ERR_NOT_EXIST",
    ALLOCATE: "UBS_ENGINE_ERR_ALLOCATE",
    SHM_NO_ATTACH: "UBS_ENGINE_ERR_SHM_NO_ATTACH",
    SHM_ATTACH_USING: "UBS_ENGINE_ERR_SHM_ATTACH_USING",
    NODE_NOT_EXIST: "UBS_ENGINE_ERR_NODE_NOT_EXIST",
}


class UbseError(Exception):
    """A request refused or failed with UBSE's `code`."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(f"{NAMES.get(code, code)} ({code}): {message}")
