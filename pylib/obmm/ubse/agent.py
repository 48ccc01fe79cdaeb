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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import obmm
from obmm import decoder, identity
from obmm.handle import Handle
from obmm.ubse.registry import AgentError

NODE_SYSFS = Path("/sys/devices/system/node")
T = TypeVar("T")
R = TypeVar("R")


def _agent_error(step: str, exc: Exception) -> AgentError:
    err = exc.errno if isinstance(exc, OSError) and exc.errno else 0
    return AgentError(err, f"{step}: {exc}")


def _all_or_none(
    verb: str, items: Sequence[T], one: Callable[[T], tuple[int, R]], undo: Callable[[int], None]
) -> list[R]:
    """`one` of each item (its memid and its result), in order; if one fails, the memids done
    so far are undone, newest first, and the error names which of how many failed."""
    done: list[int] = []
    results: list[R] = []
    try:
        for item in items:
            mem_id, result = one(item)
            done.append(mem_id)
            results.append(result)
    except (OSError, decoder.DecoderError) as exc:
        for mem_id in reversed(done):
            undo(mem_id)
        raise _agent_error(f"{verb} {len(done) + 1} of {len(items)}", exc) from exc
    return results


def _each(verb: str, mem_ids: Sequence[int], release: Callable[[int], None]) -> None:
    """`release` of every memid, in order; the first that fails stops it, named."""
    for mem_id in mem_ids:
        try:
            release(mem_id)
        except OSError as exc:
            raise _agent_error(f"{verb} {mem_id}", exc) from exc


def export(block: int, count: int) -> list[dict[str, Any]]:
    """`count` exports of `block` bytes, their handles; none left behind if one fails."""
    me = identity.NodeIdentity.local()
    with obmm.Obmm() as dev:

        def one(_: int) -> tuple[int, dict[str, Any]]:
            exp = dev.export(block)
            return exp.mem_id, Handle.from_export(exp, me).to_dict()

        return _all_or_none("export", range(count), one, dev.unexport)


def unexport(mem_ids: Sequence[int]) -> None:
    with obmm.Obmm() as dev:
        _each("unexport", mem_ids, dev.unexport)


def import_(handles: Sequence[dict[str, Any]]) -> list[int]:
    """Import every handle at the decoder address its UBA resolves to; none left if one fails."""
    dec = decoder.default_decoder()
    with obmm.Obmm() as dev:

        def one(doc: dict[str, Any]) -> tuple[int, int]:
            h = Handle.from_dict(doc)
            addr = dec.resolve(h.node_id, h.uba, h.length)
            imp = dev.import_(
                addr, h.length, scna=identity.local_cna(), dcna=h.scna, tokenid=h.tokenid,
                seid=identity.local_eid(), deid=h.seid,
            )  # fmt: skip
            return imp.mem_id, imp.mem_id

        return _all_or_none("import", handles, one, dev.unimport)


def unimport(mem_ids: Sequence[int]) -> None:
    with obmm.Obmm() as dev:
        _each("unimport", mem_ids, dev.unimport)


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
