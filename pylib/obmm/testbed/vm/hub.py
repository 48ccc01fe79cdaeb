"""The inter-node guest network: an Ethernet hub on unix datagram sockets, host side only.

Every node of a multi-node cluster has a second NIC (virtio-net at PCI slot 0x04) whose QEMU
backend is ``-netdev dgram`` between two unix sockets in the cluster's run directory:
``node<i>.net`` (bound by QEMU, where the node receives) and ``hub.sock`` (bound by this process,
where every node sends).  The hub forwards each frame it gets from node *i* to the node that
owns the destination MAC (learned from source MACs), or to every other node for broadcast,
multicast and unknown destinations.  Nothing here touches an IP socket: the guests' link-local
traffic (169.254.0.0/16) never leaves the run directory.

Frames that cannot be delivered at once (a node not started yet or dead, its queue full) are
dropped, as a real hub would under load; TCP in the guests retransmits.

Life cycle: the cluster starts the hub before any QEMU and records its pid in ``state.json``;
``Cluster.stop()`` ends it with the nodes.  It also ends by itself when its run directory
disappears, on SIGTERM/SIGINT, and (when started by a non-detached owner) with its parent.

    python -m obmm.testbed.vm.hub RUNDIR NODES
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import select
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType

from obmm.testbed.vm import qemu

log = logging.getLogger(__name__)

MAX_FRAME = 65536
# How often the hub checks that its run directory still exists.
WATCH_INTERVAL_S = 1.0
# A node's receive queue holds only net.unix.max_dgram_qlen (often 10) frames: on a full queue
# wait up to SEND_RETRIES * SEND_RETRY_S for QEMU to drain it before dropping the frame.
SEND_RETRIES = 20
SEND_RETRY_S = 0.001
BROADCAST_BIT = 0x01


def hub_socket(rundir: Path) -> Path:
    return qemu.hub_socket(rundir)


def node_socket(rundir: Path, index: int) -> Path:
    return qemu.net_socket(rundir, index)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


class Hub:
    """Forwards Ethernet frames between the nodes' dgram sockets (see the module docstring)."""

    def __init__(self, rundir: Path, nodes: int) -> None:
        self.rundir = rundir
        self.nodes = nodes
        self.peers = {str(node_socket(rundir, i)): i for i in range(nodes)}
        self.macs: dict[bytes, int] = {}
        self.forwarded = 0
        self.dropped = 0
        path = hub_socket(rundir)
        if len(str(path)) > qemu.MAX_UNIX_PATH:
            raise ValueError(f"unix socket path too long ({len(str(path))} bytes): {path}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            hub_socket(self.rundir).unlink()

    def destinations(self, sender: int, frame: bytes) -> list[int]:
        """Nodes a frame from `sender` goes to; learns the sender's MAC on the way."""
        if len(frame) < 12:
            return []
        dst, src = frame[0:6], frame[6:12]
        if not src[0] & BROADCAST_BIT:
            self.macs[src] = sender
        owner = self.macs.get(dst)
        if dst[0] & BROADCAST_BIT or owner is None:
            return [i for i in range(self.nodes) if i != sender]
        return [] if owner == sender else [owner]

    def forward_one(self) -> bool:
        """Forward one pending frame; False if none was waiting."""
        try:
            frame, sender_path = self.sock.recvfrom(MAX_FRAME)
        except BlockingIOError:
            return False
        sender = self.peers.get(sender_path if isinstance(sender_path, str) else "")
        if sender is None:
            log.debug("frame from unknown socket %r dropped", sender_path)
            self.dropped += 1
            return True
        for dest in self.destinations(sender, frame):
            try:
                self._send(frame, str(node_socket(self.rundir, dest)))
                self.forwarded += 1
            except OSError as exc:
                # ENOENT/ECONNREFUSED: node not up (or gone); EAGAIN: its queue is full.
                if exc.errno not in (
                    errno.ENOENT,
                    errno.ECONNREFUSED,
                    errno.EAGAIN,
                    errno.ENOBUFS,
                ):
                    log.warning("node%d: %s", dest, exc)
                self.dropped += 1
        return True

    def _send(self, frame: bytes, path: str) -> None:
        """Send, waiting briefly while the node's queue is full (a TCP burst), then give up."""
        for _ in range(SEND_RETRIES):
            try:
                self.sock.sendto(frame, path)
                return
            except BlockingIOError:
                time.sleep(SEND_RETRY_S)
        self.sock.sendto(frame, path)

    def run(self) -> None:
        while self.rundir.is_dir():
            ready, _, _ = select.select([self.sock], [], [], WATCH_INTERVAL_S)
            if ready:
                while self.forward_one():
                    pass
        log.info("run directory %s is gone; hub exits", self.rundir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m obmm.testbed.vm.hub", description=__doc__)
    parser.add_argument("rundir", type=Path)
    parser.add_argument("nodes", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="hub: %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    hub = Hub(args.rundir, args.nodes)
    try:
        hub.run()
    except _Stop:
        pass
    finally:
        hub.close()
        log.info("forwarded %d frame(s), dropped %d", hub.forwarded, hub.dropped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
