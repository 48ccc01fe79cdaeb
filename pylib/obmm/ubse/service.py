"""One node's service: the Unix socket its client library calls, the TCP port its peers call.

Every node runs one.  The one started without a master is the master: it keeps the
:class:`~obmm.ubse.registry.Registry`; the others register with it at start and forward each
client request there (as UBSE's daemons send theirs to the elected master:
ubse_mem_controller_dispatcher.cpp:SendToMasterIfNotMaster).  The master reaches each node's
agent (:mod:`obmm.ubse.agent`) over the same TCP port.

Who asks is the client socket's peer credentials (SO_PEERCRED), as UBSE takes its UDS info
from the connection (ubse_mem_controller_dispatcher.cpp:GenUdsInfo), not from arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obmm import envvars
from obmm.ubse import agent, codes, rules, wire
from obmm.ubse.codes import UbseError
from obmm.ubse.registry import AgentError, Identity, Node, Registry

log = logging.getLogger("obmm.ubse")

#: Where the client library finds the service unless told ($OBMM_UBSE_SOCKET, or
#: ubs_engine_client_initialize's path).  Keep equal to UBSE_DEFAULT_SOCKET in ubse/ubse_client.c.
DEFAULT_SOCKET: str = envvars.UBSE_SOCKET.default
DEFAULT_PORT: int = envvars.UBSE_PORT.default
#: How long a node keeps trying to register with a master that is not up yet.
REGISTER_WITHIN_S = 120.0
_UCRED = struct.Struct("3i")


def peer_identity(sock: socket.socket) -> Identity:
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    try:
        username = pwd.getpwuid(uid).pw_name
    except KeyError:
        username = ""
    return Identity(uid=uid, gid=gid, pid=pid, username=username)


class LocalAgent:
    """The agent calls, by name, as the TCP port serves them to the master."""

    def handle(self, op: str, req: dict[str, Any]) -> Any:
        if op == "agent_export":
            return agent.export(int(req["block"]), int(req["count"]))
        if op == "agent_unexport":
            agent.unexport([int(m) for m in req["mem_ids"]])
            return None
        if op == "agent_import":
            return agent.import_(req["handles"])
        if op == "agent_unimport":
            agent.unimport([int(m) for m in req["mem_ids"]])
            return None
        if op == "agent_numastat":
            return agent.numastat()
        raise UbseError(codes.INTERNAL, f"unknown agent op {op!r}")


class RemoteAgents:
    """registry.Agents over the nodes' TCP ports (this node's own calls made in process)."""

    def __init__(self, service: NodeService) -> None:
        self.service = service

    def _call(self, slot: int, op: str, **args: Any) -> Any:
        if slot == self.service.me.slot:
            return self.service.local.handle(op, args)
        node = self.service.registry_or_fail().node(slot)
        try:
            resp = wire.call(node.addr, node.port, {"op": op, **args})
        except wire.WireError as exc:
            raise AgentError(0, f"node {slot} unreachable: {exc}") from exc
        if resp.get("code"):
            raise AgentError(int(resp.get("errno", 0)), str(resp.get("message")))
        return resp.get("data")

    def export(self, slot: int, block: int, count: int) -> list[dict[str, Any]]:
        return list(self._call(slot, "agent_export", block=block, count=count))

    def unexport(self, slot: int, mem_ids: Any) -> None:
        self._call(slot, "agent_unexport", mem_ids=list(mem_ids))

    def import_(self, slot: int, handles: Any) -> list[int]:
        return [int(m) for m in self._call(slot, "agent_import", handles=list(handles))]

    def unimport(self, slot: int, mem_ids: Any) -> None:
        self._call(slot, "agent_unimport", mem_ids=list(mem_ids))

    def numastat(self, slot: int) -> list[dict[str, int]]:
        return list(self._call(slot, "agent_numastat"))


@dataclass(frozen=True)
class Endpoint:
    addr: str
    port: int


class NodeService:
    """This node's service: `me` is this node; `master` None makes it the master."""

    def __init__(
        self,
        me: Node,
        *,
        master: Endpoint | None,
        socket_path: str = DEFAULT_SOCKET,
        config: rules.Config | None = None,
        local: LocalAgent | None = None,
    ) -> None:
        self.me = me
        #: This node's OBMM steps (the host tests give a fake).
        self.local = local or LocalAgent()
        self.master = master
        self.socket_path = socket_path
        self.config = config or rules.Config()
        self.agents = RemoteAgents(self)
        self.registry = Registry(self.agents, self.config) if master is None else None
        if self.registry is not None:
            self.registry.register(me)
        self._servers: list[socketserver.BaseServer] = []

    def registry_or_fail(self) -> Registry:
        if self.registry is None:
            raise UbseError(codes.INTERNAL, "not the master")
        return self.registry

    # -- requests that go to the master ----------------------------------------------------

    def to_master(self, req: dict[str, Any]) -> dict[str, Any]:
        """A registry request: answered here on the master, forwarded from the others."""
        if self.master is None:
            return self.master_answer(req)
        try:
            return wire.call(self.master.addr, self.master.port, req)
        except wire.WireError as exc:
            return {"code": codes.INTERNAL, "message": f"master unreachable: {exc}"}

    def master_answer(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"code": codes.SUCCESS, "data": self._master_op(req)}
        except UbseError as exc:
            return {"code": exc.code, "message": str(exc), "data": getattr(exc, "data", None)}

    def _master_op(self, req: dict[str, Any]) -> Any:
        reg = self.registry_or_fail()
        op = req["op"]
        if op == "register":
            reg.register(Node.from_dict(req["node"]))
            return None
        if op == "nodes":
            return [n.to_dict() for n in reg.nodes()]
        if op == "numastat":
            return self._numastat(int(req["slot"]))
        who = Identity(**req["who"])
        name = str(req.get("name", ""))
        if op == "create":
            reg.create(
                name, int(req["size"]), who=who, usr_info=bytes.fromhex(req["usr_info"]),
                flag=int(req["flag"]), region=req.get("region"), provider=req.get("provider"),
            )  # fmt: skip
            return None
        if op == "create_lender":
            reg.create_with_lender(
                name, int(req["lender_slot"]), int(req["lender_size"]), who=who,
                usr_info=bytes.fromhex(req["usr_info"]), flag=int(req["flag"]),
                region=req.get("region"),
            )  # fmt: skip
            return None
        if op == "attach":
            code, desc = reg.attach(name, int(req["slot"]), who)
            if code:
                exc = UbseError(code, f"node {req['slot']} has attached {name!r}")
                exc.data = desc  # type: ignore[attr-defined]
                raise exc
            return desc
        if op == "detach":
            reg.detach(name, int(req["slot"]), who)
            return None
        if op == "delete":
            reg.delete(name, who)
            return None
        if op == "get":
            return reg.get(name, who)
        if op == "list":
            return reg.list(who)
        raise UbseError(codes.INTERNAL, f"unknown op {op!r}")

    def _numastat(self, slot: int) -> list[dict[str, int]]:
        reg = self.registry_or_fail()
        reg.node(slot)  # 1027 for an unknown slot
        try:
            stats = self.agents.numastat(slot)
        except AgentError as exc:
            raise UbseError(codes.INTERNAL, str(exc)) from exc
        lent, borrowed = reg.lent_and_borrowed(slot)
        # All of a node's lending and borrowing is shown on its first NUMA node.
        for i, st in enumerate(stats):
            st["lend"], st["borrow"] = (lent, borrowed) if i == 0 else (0, 0)
        return stats

    # -- the client's text requests --------------------------------------------------------

    def client_request(self, line: str, who: Identity) -> bytes:
        tokens = line.split()
        if not tokens:
            return wire.response(codes.INVALID_ARG)
        try:
            code, lines = self._client_op(tokens[0], tokens[1:], who)
        except (ValueError, IndexError, KeyError) as exc:
            log.info("refused %r: %s", line, exc)
            return wire.response(codes.INVALID_ARG)
        return wire.response(code, lines)

    def _nodes(self) -> tuple[int, dict[int, Node]]:
        resp = self.to_master({"op": "nodes"})
        if resp["code"]:
            return int(resp["code"]), {}
        return 0, {n.slot: n for n in (Node.from_dict(d) for d in resp["data"])}

    def _client_op(self, op: str, args: list[str], who: Identity) -> tuple[int, list[str]]:
        if op == "node_local":
            return 0, ["node " + " ".join(wire.node_fields(self.me))]
        if op in ("node_list", "link_list"):
            code, nodes = self._nodes()
            if op == "node_list":
                return code, ["node " + " ".join(wire.node_fields(n)) for n in nodes.values()]
            # Every node has a decoder window onto every other: one link per pair and way.
            return code, [f"link {a} 0 {b} {b} 0 {a}" for a in nodes for b in nodes if a != b]
        if op == "numastat":
            slot = int(args[0])
            resp = self.to_master({"op": "numastat", "slot": slot})
            lines = [
                f"numa {slot} 0 {st['numa']} 100 {st['total']} {st['free']} "
                f"{st['borrow']} {st['lend']}"
                for st in resp.get("data") or ()
            ]
            return int(resp["code"]), lines
        req: dict[str, Any] = {"who": dataclasses.asdict(who), "slot": self.me.slot}
        if op == "shm_create":
            name, size, flag, usr, region, provider = args
            req |= {
                "op": "create", "name": name, "size": int(size), "flag": int(flag),
                "usr_info": "" if usr == "-" else usr, "region": wire.parse_csv(region),
                "provider": wire.parse_csv(provider),
            }  # fmt: skip
        elif op == "shm_create_lender":
            name, flag, usr, region, lsize, lslot = args
            req |= {
                "op": "create_lender", "name": name, "flag": int(flag),
                "usr_info": "" if usr == "-" else usr, "region": wire.parse_csv(region),
                "lender_size": int(lsize), "lender_slot": int(lslot),
            }  # fmt: skip
        elif op in ("shm_attach", "shm_get", "shm_detach", "shm_delete"):
            (name,) = args
            req |= {"op": op.removeprefix("shm_"), "name": name}
        elif op == "shm_list":
            req["op"] = "list"
        else:
            raise ValueError(f"unknown op {op!r}")
        resp = self.to_master(req)
        code = int(resp["code"])
        if code and resp.get("message"):
            log.info("%s %s: %s", op, " ".join(args), resp["message"])
        data = resp.get("data")
        if op not in ("shm_attach", "shm_get", "shm_list") or data is None:
            return code, []
        ncode, nodes = self._nodes()
        if ncode:
            return ncode, []
        descs = data if op == "shm_list" else [data]
        lines = [line for d in descs for line in wire.shm_lines(d, nodes.__getitem__)]
        return code, lines

    # -- serving ---------------------------------------------------------------------------

    def peer_request(self, req: dict[str, Any]) -> dict[str, Any]:
        op = str(req.get("op", ""))
        if op.startswith("agent_"):
            try:
                return {"code": 0, "data": self.local.handle(op, req)}
            except AgentError as exc:
                return {"code": codes.INTERNAL, "errno": exc.errno, "message": str(exc)}
            except UbseError as exc:
                return {"code": exc.code, "message": str(exc)}
        return self.master_answer(req)

    def start(self) -> None:
        """Serve the TCP port and the Unix socket in threads; register with the master."""
        tcp = _TCPServer((self.me.addr, self.me.port), _handler(self._serve_peer))
        self._servers.append(tcp)
        if self.me.port == 0:  # the port the system chose (tests)
            self.me = dataclasses.replace(self.me, port=int(tcp.server_address[1]))
            if self.registry is not None:
                self.registry.register(self.me)
        path = Path(self.socket_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        unix = _UnixServer(str(path), _handler(self._serve_client))
        # Any local user may ask; who they are decides what they may do (SO_PEERCRED).
        os.chmod(path, 0o666)
        self._servers.append(unix)
        for server in self._servers:
            threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
        if self.master is not None:
            resp = wire.call_retrying(
                self.master.addr, self.master.port,
                {"op": "register", "node": self.me.to_dict()}, within=REGISTER_WITHIN_S,
            )  # fmt: skip
            if resp.get("code"):
                raise UbseError(int(resp["code"]), f"register: {resp.get('message')}")

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        with contextlib.suppress(FileNotFoundError):
            Path(self.socket_path).unlink()

    def _serve_peer(self, sock: socket.socket) -> None:
        try:
            req = wire.recv_frame(sock)
        except wire.WireError as exc:
            log.info("peer request dropped: %s", exc)
            return
        try:
            resp = self.peer_request(req)
        except Exception as exc:  # a bug must not kill the service: answer and log it
            log.exception("peer request %r failed", req.get("op"))
            resp = {"code": codes.INTERNAL, "message": f"{type(exc).__name__}: {exc}"}
        wire.send_frame(sock, resp)

    def _serve_client(self, sock: socket.socket) -> None:
        with sock.makefile("rb") as f:
            line = f.readline(1 << 16).decode(errors="replace")
        try:
            out = self.client_request(line, peer_identity(sock))
        except Exception as exc:  # as above
            log.exception("client request %r failed", line.strip())
            out = wire.response(codes.INTERNAL, [f"error {type(exc).__name__}"])
        sock.sendall(out)


def _handler(serve: Callable[[socket.socket], None]) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            serve(self.request)

    return Handler


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
