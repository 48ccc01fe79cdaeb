"""The cluster's registry of UBSE's shared memory, kept by the master node's service.

UBSE keeps its ledger on an elected master; every node's daemon forwards requests there and the
master sends the export to the lender's agent and the import to the attaching node's agent
(ubs-engine src/controllers/mem/mem_controller/api/ubse_mem_controller_share_api.cpp:
UbseMemShareBorrow, UbseMemShareAttach, UbseMemShareDetach, UbseMemShareReturn).  Ours is the
same shape with a fixed master (the service started without ``--master``) and synchronous
agents, so every object is in the EXIST stage when a call returns.

What each call refuses, and with which code, follows the functions cited at each method.  The
OBMM work is behind :class:`Agents` (the service's implementation reaches the nodes; the host
tests give a fake), so this module is plain logic.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from obmm.ubse import codes, rules
from obmm.ubse.codes import UbseError

#: ubs_mem_stage: the object exists (ours never shows CREATING or DELETING).
STAGE_EXIST = 3
#: An export that fails for want of memory sends the scheduler to the next candidate.
NO_ROOM = (errno.ENOMEM, errno.ENOSPC)


class AgentError(Exception):
    """An agent's OBMM step failed with `err` (an errno)."""

    def __init__(self, err: int, message: str) -> None:
        self.errno = err
        super().__init__(message)


class Agents(Protocol):
    """The OBMM steps on the nodes, by slot."""

    def export(self, slot: int, block: int, count: int) -> list[dict[str, Any]]:
        """`count` exports of `block` bytes on `slot`: their handles (obmm.handle dicts)."""
        ...

    def unexport(self, slot: int, mem_ids: Sequence[int]) -> None: ...

    def import_(self, slot: int, handles: Sequence[dict[str, Any]]) -> list[int]:
        """Import each handle on `slot` (decoder address from its UBA): the import memids."""
        ...

    def unimport(self, slot: int, mem_ids: Sequence[int]) -> None: ...


@dataclass(frozen=True)
class Identity:
    """Who asked: the peer credentials of the client's socket, as UBSE's UDS info."""

    uid: int
    gid: int
    pid: int
    username: str = ""

    def permits(self, other: Identity) -> bool:
        """Whether `other` may use what this identity made: root, uid 0 and the user ``ubse``
        always; else the same username if this one has one, else the same uid
        (ubs-engine src/adapter_plugins/mmi/ubse_mmi_def.cpp:UbseUdsInfo::CheckPermission)."""
        if other.username in ("ubse", "root") or other.uid == 0:
            return True
        if self.username:
            return self.username == other.username
        return self.uid == other.uid


@dataclass(frozen=True)
class Node:
    """One node as ubs_topo_node_t shows it, and where its service listens."""

    slot: int
    hostname: str
    addr: str = ""
    port: int = 0
    numa: tuple[int, ...] = (0,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "hostname": self.hostname,
            "addr": self.addr,
            "port": self.port,
            "numa": list(self.numa),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Node:
        return cls(
            slot=int(doc["slot"]),
            hostname=str(doc["hostname"]),
            addr=str(doc.get("addr", "")),
            port=int(doc.get("port", 0)),
            numa=tuple(int(n) for n in doc.get("numa", (0,))),
        )


@dataclass
class Attachment:
    mem_ids: list[int]
    owner: Identity
    #: The memids are the export's own (an attach on the lender): nothing to unimport.
    local: bool = False


@dataclass
class Shm:
    name: str
    size: int
    unit: int
    export_slot: int
    usr_info: bytes
    flag: int
    region: tuple[int, ...] | None
    owner: Identity
    blocks: list[dict[str, Any]]
    imports: dict[int, Attachment] = field(default_factory=dict)

    def desc(self, only: int | None = None) -> dict[str, Any]:
        """ubs_mem_shm_desc_t as data: every node's import, or only node `only`'s."""
        return {
            "name": self.name,
            "mem_size": self.size,
            "unit_size": self.unit,
            "export_slot": self.export_slot,
            "stage": STAGE_EXIST,
            "usr_info": self.usr_info.hex(),
            "imports": [
                {"slot": slot, "stage": STAGE_EXIST, "mem_ids": list(att.mem_ids)}
                for slot, att in sorted(self.imports.items())
                if only is None or slot == only
            ],
        }


class Registry:
    """Nodes and shared memory; every method is one UBSE request, atomic under one lock."""

    def __init__(self, agents: Agents, config: rules.Config | None = None) -> None:
        self.agents = agents
        self.config = config or rules.Config()
        self._lock = threading.RLock()
        self._nodes: dict[int, Node] = {}
        self._shms: dict[str, Shm] = {}

    # -- nodes ------------------------------------------------------------------------------

    def register(self, node: Node) -> None:
        with self._lock:
            self._nodes[node.slot] = node

    def nodes(self) -> list[Node]:
        with self._lock:
            return [self._nodes[s] for s in sorted(self._nodes)]

    def node(self, slot: int) -> Node:
        with self._lock:
            found = self._nodes.get(slot)
        if found is None:
            raise UbseError(codes.NODE_NOT_EXIST, f"no node has slot {slot}")
        return found

    def lent_and_borrowed(self, slot: int) -> tuple[int, int]:
        """Bytes `slot` lends (its exports) and borrows (its imports of others' exports)."""
        with self._lock:
            lent = sum(s.unit * len(s.blocks) for s in self._shms.values() if s.export_slot == slot)
            borrowed = sum(
                s.unit * len(s.blocks)
                for s in self._shms.values()
                if slot in s.imports and not s.imports[slot].local
            )
        return lent, borrowed

    # -- shared memory ----------------------------------------------------------------------

    def create(
        self,
        name: str,
        size: int,
        *,
        who: Identity,
        usr_info: bytes = bytes(rules.USR_INFO_LEN),
        flag: int = 0,
        region: Sequence[int] | None = None,
        provider: Sequence[int] | None = None,
    ) -> None:
        """ubs_mem_shm_create: export on a lender from `provider` (else the region, else any
        node), ceil(size / block) blocks of one memid each
        (UbseMemShareBorrow: 1006 for a name in use, 1013 when no node can lend)."""
        code = rules.shm_create_code(name, size, region, provider)
        if code:
            raise UbseError(code, f"shared memory {name!r} of {size} bytes refused")
        with self._lock:
            self._refuse_existing(name)
            region_t = tuple(region) if region is not None else None
            candidates = list(provider if provider is not None else region_t or self._nodes)
            self._export(name, size, who, usr_info, flag, region_t, candidates)

    def create_with_lender(
        self,
        name: str,
        lender_slot: int,
        lender_size: int,
        *,
        who: Identity,
        usr_info: bytes = bytes(rules.USR_INFO_LEN),
        flag: int = 0,
        region: Sequence[int] | None = None,
    ) -> None:
        """ubs_mem_shm_create_with_lender: the lender named (ubsmd's allocate with a provider
        host); its size need not be a multiple of 2 MiB, only at least 4 MiB."""
        code = rules.shm_create_with_lender_code(name, region, lender_size)
        if code:
            raise UbseError(code, f"shared memory {name!r} with lender {lender_slot} refused")
        with self._lock:
            self._refuse_existing(name)
            region_t = tuple(region) if region is not None else None
            self._export(name, lender_size, who, usr_info, flag, region_t, [lender_slot])

    def _refuse_existing(self, name: str) -> None:
        if name in self._shms:
            raise UbseError(codes.EXISTED, f"shared memory {name!r} exists")

    def _export(
        self,
        name: str,
        size: int,
        who: Identity,
        usr_info: bytes,
        flag: int,
        region: tuple[int, ...] | None,
        candidates: list[int],
    ) -> None:
        block = self.config.block
        count = rules.blocks_for(size, block)
        if count > rules.MAX_MEMID_NUM:
            raise UbseError(codes.ALLOCATE, f"{count} blocks of {block} bytes: over 2048")
        # The region's nodes must all be known (UBSE's RegionFilter: the lender must reach them).
        unknown = [s for s in region or () if s not in self._nodes]
        tried: list[str] = []
        for slot in candidates if not unknown else ():
            if slot not in self._nodes:
                tried.append(f"{slot}: no such node")
                continue
            if not self.config.may_lend(slot):
                tried.append(f"{slot}: not a lender")
                continue
            try:
                blocks = self.agents.export(slot, block, count)
            except AgentError as exc:
                if exc.errno in NO_ROOM:
                    tried.append(f"{slot}: {exc}")
                    continue
                raise UbseError(codes.INTERNAL, f"export on node {slot}: {exc}") from exc
            self._shms[name] = Shm(
                name, size, block, slot, bytes(usr_info), flag, region, who, blocks
            )
            return
        why = f"region nodes {unknown} unknown" if unknown else "; ".join(tried) or "no nodes"
        raise UbseError(codes.ALLOCATE, f"no node can lend {count} x {block} bytes ({why})")

    def _shm(self, name: str) -> Shm:
        code = rules.name_code(name)
        if code:
            raise UbseError(code, f"name {name!r} refused")
        found = self._shms.get(name)
        if found is None:
            raise UbseError(codes.NOT_EXIST, f"no shared memory {name!r}")
        return found

    def attach(self, name: str, slot: int, who: Identity) -> tuple[int, dict[str, Any]]:
        """ubs_mem_shm_attach on node `slot`: (0 or 1006, the descriptor with only this node's
        import).  Refusals as ShmAttachPreCheck: 1007 unknown, 1005 a node outside the region,
        1003 another user; a repeated attach is 1006 with the descriptor (ExistImportObjHandler);
        a failed import is 1005 (RealImportDecoder, MemShmImportExecutor)."""
        with self._lock:
            shm = self._shm(name)
            if shm.region is not None and slot not in shm.region:
                raise UbseError(codes.INTERNAL, f"node {slot} is not in {name!r}'s region")
            if not shm.owner.permits(who):
                raise UbseError(codes.AUTH_FAILED, f"{name!r} belongs to another user")
            if slot in shm.imports:
                return codes.EXISTED, shm.desc(only=slot)
            if slot == shm.export_slot:
                att = Attachment([int(b["mem_id"]) for b in shm.blocks], who, local=True)
            else:
                try:
                    mem_ids = self.agents.import_(slot, shm.blocks)
                except AgentError as exc:
                    raise UbseError(codes.INTERNAL, f"import on node {slot}: {exc}") from exc
                att = Attachment(mem_ids, who)
            shm.imports[slot] = att
            return codes.SUCCESS, shm.desc(only=slot)

    def detach(self, name: str, slot: int, who: Identity) -> None:
        """ubs_mem_shm_detach on node `slot` (UbseMemShareDetach: 1015 when it has not
        attached, an unknown name included; 1003 another user than the one that attached)."""
        with self._lock:
            code = rules.name_code(name)
            if code:
                raise UbseError(code, f"name {name!r} refused")
            shm = self._shms.get(name)
            att = shm.imports.get(slot) if shm is not None else None
            if shm is None or att is None:
                raise UbseError(codes.SHM_NO_ATTACH, f"node {slot} has not attached {name!r}")
            if not att.owner.permits(who):
                raise UbseError(codes.AUTH_FAILED, f"{name!r} was attached by another user")
            if not att.local:
                try:
                    self.agents.unimport(slot, att.mem_ids)
                except AgentError as exc:
                    raise UbseError(codes.INTERNAL, f"unimport on node {slot}: {exc}") from exc
            del shm.imports[slot]

    def delete(self, name: str, who: Identity) -> None:
        """ubs_mem_shm_delete (ShareReturnValidate: 1024 while attached, 1007 unknown, 1003
        another user)."""
        with self._lock:
            code = rules.name_code(name)
            if code:
                raise UbseError(code, f"name {name!r} refused")
            shm = self._shms.get(name)
            if shm is not None and shm.imports:
                raise UbseError(
                    codes.SHM_ATTACH_USING, f"{name!r} is attached on {sorted(shm.imports)}"
                )
            shm = self._shm(name)
            if not shm.owner.permits(who):
                raise UbseError(codes.AUTH_FAILED, f"{name!r} belongs to another user")
            try:
                self.agents.unexport(shm.export_slot, [int(b["mem_id"]) for b in shm.blocks])
            except AgentError as exc:
                raise UbseError(codes.INTERNAL, f"unexport on {shm.export_slot}: {exc}") from exc
            del self._shms[name]

    def get(self, name: str, who: Identity) -> dict[str, Any]:
        """ubs_mem_shm_get: the descriptor with every node's import (UbseMemShmGet: 1007, 1003)."""
        with self._lock:
            shm = self._shm(name)
            if not shm.owner.permits(who):
                raise UbseError(codes.AUTH_FAILED, f"{name!r} belongs to another user")
            return shm.desc()

    def list(self, who: Identity) -> list[dict[str, Any]]:
        """ubs_mem_shm_list: what `who` may see (UbseMemShmList skips the others)."""
        with self._lock:
            return [s.desc() for _, s in sorted(self._shms.items()) if s.owner.permits(who)]
