"""What one node does for the master: OBMM exports, and imports through its decoder.

On the lender UBSE's agent exports one memid per block (ubs-engine
src/adapter_plugins/mmi/ubse_mem_instance_inner.cpp: MemInstanceInnerCommon); on the importer it
gets the decoder address from the UB Manager and imports there with the importer's own CNA/EID
(ubse_mem_controller_share_api.cpp:RealImportDecoder, MemShmImportExecutor).  Ours resolves
the address with :mod:`obmm.decoder` (on the testbed: the window onto the exporter that the UBA
names) and imports with :mod:`obmm.identity`'s CNA and EID, as every other importer here does.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import obmm
from obmm import decoder, identity
from obmm.handle import Handle
from obmm.ubse.registry import AgentError

NODE_SYSFS = Path("/sys/devices/system/node")


def _agent_error(step: str, exc: Exception) -> AgentError:
    err = exc.errno if isinstance(exc, OSError) and exc.errno else 0
    return AgentError(err, f"{step}: {exc}")


def export(block: int, count: int) -> list[dict[str, Any]]:
    """`count` exports of `block` bytes, their handles; none left behind if one fails."""
    me = identity.NodeIdentity.local()
    done: list[int] = []
    handles = []
    with obmm.Obmm() as dev:
        try:
            for _ in range(count):
                exp = dev.export(block)
                done.append(exp.mem_id)
                handles.append(Handle.from_export(exp, me).to_dict())
        except (OSError, decoder.DecoderError) as exc:
            for mem_id in reversed(done):
                dev.unexport(mem_id)
            raise _agent_error(f"export {len(done) + 1} of {count}", exc) from exc
    return handles


def unexport(mem_ids: Sequence[int]) -> None:
    with obmm.Obmm() as dev:
        for mem_id in mem_ids:
            try:
                dev.unexport(mem_id)
            except OSError as exc:
                raise _agent_error(f"unexport {mem_id}", exc) from exc


def import_(handles: Sequence[dict[str, Any]]) -> list[int]:
    """Import every handle at the decoder address its UBA resolves to; none left if one fails."""
    done: list[int] = []
    dec = decoder.default_decoder()
    with obmm.Obmm() as dev:
        try:
            scna, seid = identity.local_cna(), identity.local_eid()
            for doc in handles:
                h = Handle.from_dict(doc)
                addr = dec.resolve(h.node_id, h.uba, h.length)
                imp = dev.import_(
                    addr, h.length, scna=scna, dcna=h.scna, tokenid=h.tokenid, seid=seid,
                    deid=h.seid,
                )  # fmt: skip
                done.append(imp.mem_id)
        except (OSError, decoder.DecoderError) as exc:
            for mem_id in reversed(done):
                dev.unimport(mem_id)
            raise _agent_error(f"import {len(done) + 1} of {len(handles)}", exc) from exc
    return done


def unimport(mem_ids: Sequence[int]) -> None:
    with obmm.Obmm() as dev:
        for mem_id in mem_ids:
            try:
                dev.unimport(mem_id)
            except OSError as exc:
                raise _agent_error(f"unimport {mem_id}", exc) from exc


def hostname() -> str:
    return socket.gethostname()


def numa_nodes(root: Path = NODE_SYSFS) -> list[int]:
    """This machine's NUMA nodes (0 when sysfs has none)."""
    found = sorted(int(p.name[4:]) for p in root.glob("node[0-9]*") if p.name[4:].isdigit())
    return found or [0]


def numa_meminfo(node: int, root: Path = NODE_SYSFS) -> tuple[int, int]:
    """(MemTotal, MemFree) of NUMA node `node`, bytes (the whole machine's without sysfs)."""
    path = root / f"node{node}" / "meminfo"
    text = path.read_text() if path.exists() else Path("/proc/meminfo").read_text()
    values = {}
    for key in ("MemTotal", "MemFree"):
        m = re.search(rf"{key}:\s+(\d+) kB", text)
        values[key] = int(m.group(1)) * 1024 if m else 0
    return values["MemTotal"], values["MemFree"]


def numastat() -> list[dict[str, int]]:
    out = []
    for node in numa_nodes():
        total, free = numa_meminfo(node)
        out.append({"numa": node, "total": total, "free": free})
    return out
