"""``python -m obmm.ubse serve``: run this node's UBSE service until killed.

Every option defaults from the node's environment ($OBMM_UBSE_*, $OBMM_NODE_ADDR); the slot id
is this node's fabric index plus one (UBSE numbers nodes by slot, from 1).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from obmm import envvars, identity
from obmm.ubse import agent, rules
from obmm.ubse.registry import Node
from obmm.ubse.service import Endpoint, NodeService


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m obmm.ubse", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("serve", help="run this node's service")
    s.add_argument(
        "--listen",
        default=envvars.NODE_ADDR.get(),
        help="address on the inter-node network ($OBMM_NODE_ADDR)",
    )
    s.add_argument("--port", type=int, default=envvars.UBSE_PORT.get())
    s.add_argument(
        "--master", default=None, help="the master's address (omitted: this node is the master)"
    )
    s.add_argument("--socket", default=envvars.UBSE_SOCKET.get())
    s.add_argument(
        "--slot",
        type=int,
        default=None,
        help="this node's slot id (default: its fabric node id + 1)",
    )
    s.add_argument("--hostname", default=None)
    s.add_argument("--block-mib", type=int, default=envvars.UBSE_BLOCK_MIB.get())
    s.add_argument(
        "--lenders",
        default=None,
        help="comma-separated slots that may lend ($OBMM_UBSE_LENDERS; all if unset)",
    )
    s.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help="written once the service answers (for scripts that wait on it)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="ubse: %(message)s", stream=sys.stderr)
    if not args.listen:
        print("ubse: no --listen address and $OBMM_NODE_ADDR is unset", file=sys.stderr)
        return 2
    lenders = (
        tuple(int(s) for s in args.lenders.split(","))
        if args.lenders
        else tuple(int(s) for s in envvars.UBSE_LENDERS.get() or ())
    )
    config = rules.Config(block_mib=args.block_mib, lenders=lenders)
    slot = args.slot if args.slot is not None else identity.local_node_id() + 1
    me = Node(
        slot=slot,
        hostname=args.hostname or agent.hostname(),
        addr=args.listen,
        port=args.port,
        numa=tuple(agent.numa_nodes()),
    )
    master = Endpoint(args.master, args.port) if args.master else None
    service = NodeService(me, master=master, socket_path=args.socket, config=config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service.start()
    role = "master" if master is None else f"master {args.master}"
    logging.info(
        "slot %d (%s) serving %s and %s:%d, %s, block %d MiB",
        slot, me.hostname, args.socket, args.listen, args.port, role, config.block >> 20,
    )  # fmt: skip
    if args.ready_file:
        args.ready_file.write_text(f"{slot}\n")
    stop.wait()
    service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
