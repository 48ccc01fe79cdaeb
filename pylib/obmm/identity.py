"""This node's fabric identity: the node number, CNA and EID an exporter writes into a handle.

Read the way libobmm reads them, so the same code works on obmm_emu and on a real UB host:

* ``cna`` and ``eid``: the first UB controller's sysfs, the directory that holds
  ``ub_bus_controller<i>/*/ubc`` (a file on UB hosts: drivers/ub/ubus/sysfs.c);
* ``node_id``: the index decoders resolve and handles carry: the testbed fabric's
  ``node_id`` (``/sys/kernel/obmm_emu``, or ``/sys/kernel/ub_compat`` under the real driver),
  else ``$OBMM_NODE_ID`` (on hardware the site numbers its hosts; the hardware stage sets it to
  the host's position in its host list).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from obmm import envvars
from obmm.decoder import DecoderError, fabric_sysfs, read_sysfs_int

#: Bytes in an EID, in the UAPI's import command and in a handle.
EID_SIZE = 16
#: Bits of the EID that a controller's sysfs ``eid`` holds; the rest of the 16 bytes are zero.
EID_SYSFS_BYTES = 4
DEFAULT_SYSFS = "/sys/devices"
#: libobmm's vendor adaptor looks at ub_bus_controller0..7.
MAX_CONTROLLERS = 8


def _controller(sysfs: str) -> Path:
    """The first UB controller's directory, found as libobmm's vendor adaptor does: the lowest
    ``ub_bus_controller<i>`` with a ``*/ubc`` entry, and that entry's directory."""
    for i in range(MAX_CONTROLLERS):
        for path in sorted(Path(sysfs).glob(f"ub_bus_controller{i}/*/ubc")):
            if (path.parent / "primary_cna").exists():
                return path.parent
    raise DecoderError(f"no {sysfs}/ub_bus_controller*/*/ubc: no UB controller")


def local_cna(sysfs: str = DEFAULT_SYSFS) -> int:
    """This node's primary CNA, as libobmm reads it (ub_bus_controller<i>/*/primary_cna)."""
    return read_sysfs_int(_controller(sysfs) / "primary_cna")


def local_eid(sysfs: str = DEFAULT_SYSFS) -> bytes:
    """The 16-byte EID of this node's controller as libobmm builds it: the sysfs ``eid`` as
    the first 4 bytes (host order), the rest zero."""
    value = read_sysfs_int(_controller(sysfs) / "eid")
    if not 0 < value < 1 << (8 * EID_SYSFS_BYTES):
        raise DecoderError(f"controller eid {value:#x} is not a non-zero 32-bit value")
    return value.to_bytes(EID_SYSFS_BYTES, sys.byteorder).ljust(EID_SIZE, b"\0")


def local_node_id(emu_sysfs: str | None = None) -> int:
    """The node index handles carry and decoders resolve: the testbed fabric's ``node_id``,
    else ``$OBMM_NODE_ID``."""
    path = Path(emu_sysfs or fabric_sysfs()) / "node_id"
    if path.exists():
        return read_sysfs_int(path)
    text = envvars.NODE_ID.raw() or ""
    try:
        return int(text, 0)
    except ValueError:
        raise DecoderError(
            f"{path} does not exist (no testbed fabric) and ${envvars.NODE_ID.name} is "
            f"{'unset' if not text else repr(text)}: set it to this host's node number"
        ) from None


@dataclass(frozen=True)
class NodeIdentity:
    """Who this node is on the fabric, as a handle's source fields carry it."""

    node_id: int
    cna: int
    eid: bytes

    @classmethod
    def local(cls, *, sysfs: str = DEFAULT_SYSFS, emu_sysfs: str | None = None) -> NodeIdentity:
        """Read from this machine (raises DecoderError naming what is missing)."""
        # The controller first: without one this is not a UB node at all.
        cna, eid = local_cna(sysfs), local_eid(sysfs)
        return cls(node_id=local_node_id(emu_sysfs), cna=cna, eid=eid)
