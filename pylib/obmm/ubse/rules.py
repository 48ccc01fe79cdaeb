"""UBSE's checks on a shared-memory request, its block rounding, and the config it reads.

The client library (ours: ``ubse/ubse_client.c``) makes the argument checks before it sends a
request, as UBSE's does (ubs-engine src/sdk/c/libubse_helper.cpp); the service makes them again
so a request from any client gets the same answer.  Facts, each from the function named:

* a name is 1..47 characters of letters, digits and ``._:-`` (``ubse_mem_name_is_valid``);
* a shared-memory size is at least 4 MiB (``UBS_MEM_MIN_SIZE``) and a multiple of 2 MiB
  (``UBSE_SHM_MEM_ALIGNMENT``; ``ubse_size_is_valid``);
* a region or provider node list has 1..16 entries (``ubse_mem_nodes_t_is_valid``);
* a lender's size is at least 4 MiB (``ubse_mem_shm_create_with_lender_req_valid``);
* the export is made of whole blocks of ``obmm.memory.block.size`` MiB, one memid each: a value
  in [4, 4096] and even, anything else is the default, 128 with 4K pages
  (ubse_node_controller_util.cpp:GetBlockSize).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field

from obmm.ubse import codes

MIB = 1 << 20
MIN_SIZE = 4 * MIB
SHM_ALIGNMENT = 2 * MIB
MAX_NAME_LENGTH = 48  # with the terminating NUL
MAX_SLOT_NUM = 16
MAX_MEMID_NUM = 2048
USR_INFO_LEN = 32
BLOCK_MIB_DEFAULT = 128
BLOCK_MIB_MIN = 4
BLOCK_MIB_MAX = 4096
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._:-")


def name_code(name: str | None) -> int:
    """0, or the code UBSE's client gives for this name."""
    if name is None:
        return codes.NULL_POINTER
    if not 0 < len(name) < MAX_NAME_LENGTH or not set(name) <= NAME_CHARS:
        return codes.INVALID_ARG
    return codes.SUCCESS


def nodes_code(slots: Sequence[int] | None) -> int:
    """0, or the code for a region/provider list (None: not given, which is valid)."""
    if slots is None:
        return codes.SUCCESS
    if not 0 < len(slots) <= MAX_SLOT_NUM:
        return codes.OUT_OF_RANGE
    return codes.SUCCESS


def size_code(size: int) -> int:
    if size < MIN_SIZE or size % SHM_ALIGNMENT:
        return codes.OUT_OF_RANGE
    return codes.SUCCESS


def shm_create_code(
    name: str | None, size: int, region: Sequence[int] | None, provider: Sequence[int] | None
) -> int:
    """ubs_mem_shm_create's (and _with_affinity's) checks, in UBSE's order."""
    for code in (name_code(name), size_code(size), nodes_code(region), nodes_code(provider)):
        if code:
            return code
    return codes.SUCCESS


def shm_create_with_lender_code(
    name: str | None, region: Sequence[int] | None, lender_size: int | None
) -> int:
    """ubs_mem_shm_create_with_lender's checks (lender_size None: no lender given)."""
    for code in (name_code(name), nodes_code(region)):
        if code:
            return code
    if lender_size is None or lender_size < MIN_SIZE:
        return codes.OUT_OF_RANGE
    return codes.SUCCESS


def block_mib(configured: int | None) -> int:
    """The block size GetBlockSize settles on for a configured value (None: not configured)."""
    if configured is not None and BLOCK_MIB_MIN <= configured <= BLOCK_MIB_MAX:
        return configured if configured % 2 == 0 else BLOCK_MIB_DEFAULT
    return BLOCK_MIB_DEFAULT


def blocks_for(size: int, block: int) -> int:
    """How many blocks of `block` bytes an export of `size` bytes takes (rounded up)."""
    return -(-size // block)


@dataclass(frozen=True)
class Config:
    """What UBSE reads from ubse.conf, as our service takes it (flags, or $OBMM_UBSE_*)."""

    #: obmm.memory.block.size, MiB (as given; :attr:`block` is what is used).
    block_mib: int | None = None
    #: The slots that may lend (UBSE's per-node isLender); empty: every node.
    lenders: tuple[int, ...] = field(default=())

    @property
    def block(self) -> int:
        return block_mib(self.block_mib) * MIB

    def may_lend(self, slot: int) -> bool:
        return not self.lenders or slot in self.lenders
