"""The cluster suite's harness: run commands and Python snippets on node i over SSH.

Kept out of conftest.py under a unique module name so test modules can import it whatever other
conftest modules the same interpreter has loaded.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import Any

from obmm.testbed.node import SshNode
from obmm.testbed.remote import GUEST_ROOT
from obmm.testbed.settings import scaled
from obmm.testbed.ssh import (
    CommandFailed,
    CommandTimeout,
    Connection,
    GuestGone,
    Result,
    SshError,
)
from obmm.testbed.vm.kguard import MARKER, KernelLogGuard

AGENT_START_S = 120.0


class Agent:
    """A long-lived `python3 -m xnode agent` on one node, fed snippets over one SSH channel.

    Importing obmm takes seconds under TCG; the agent imports it once.  A snippet that overruns
    its deadline kills the agent (the next call starts a new one).
    """

    def __init__(self, conn: Connection, alive: Callable[[], bool], command: str) -> None:
        self.conn = conn
        self.alive = alive
        self.lock = threading.Lock()
        self.buf = b""
        self.chan = conn._transport().open_session(timeout=30)
        self.chan.exec_command(f"cd /tmp && {command} 2>>/tmp/xnode-agent.log")
        self.pid = int(json.loads(self._readline(time.monotonic() + AGENT_START_S))["ready"])

    def _readline(self, deadline: float) -> bytes:
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"{self.conn.name}: snippet overran its deadline")
            self.chan.settimeout(min(remaining, 1.0))
            try:
                data = self.chan.recv(1 << 16)
            except socket.timeout:
                if not self.alive():
                    raise GuestGone(f"{self.conn.name}: QEMU exited") from None
                continue
            if not data:
                raise GuestGone(f"{self.conn.name}: the snippet agent ended")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def run(self, code: str, timeout: float) -> Result:
        start = time.monotonic()
        with self.lock:
            self.chan.sendall(json.dumps({"code": code}).encode() + b"\n")
            resp = json.loads(self._readline(start + timeout))
        return Result(
            command=f"<snippet>\n{code}",
            exit_status=0 if resp["ok"] else 1,
            stdout=resp["out"].encode(),
            stderr=resp["error"].encode(),
            duration=time.monotonic() - start,
        )

    def close(self) -> None:
        # The node may be dead (a test killed its QEMU): closing then cannot reach it.
        with contextlib.suppress(EOFError, OSError):
            self.chan.close()


class ClusterHarness:
    """Commands and Python snippets on the nodes of the booted cluster (or hardware hosts).

    Each node has its own SSH connection whose liveness check looks at that node only, so the
    survivors stay usable after a test kills a node.  ``root`` is where the package, the helpers
    (``root/cluster``) and ``examples/`` are on every node; on hardware ``extra_env`` gives each
    node its number and the decoder hook.
    """

    def __init__(
        self,
        nodes: Sequence[SshNode],
        *,
        root: PurePosixPath = GUEST_ROOT,
        python: str = "python3",
        hardware: bool = False,
        extra_env: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        self.node_list = list(nodes)
        self.root = root
        self.python = python
        self.hardware = hardware
        self._extra_env = extra_env
        self._conns: dict[int, Connection] = {}
        self._guard: KernelLogGuard | None = None
        self._agents: dict[int, Agent] = {}

    @property
    def nodes(self) -> int:
        return len(self.node_list)

    def node(self, index: int) -> SshNode:
        return self.node_list[index]

    @property
    def helpers(self) -> PurePosixPath:
        return self.root / "cluster"

    @property
    def examples(self) -> PurePosixPath:
        return self.root / "examples"

    def env(self, node: int) -> str:
        """`VAR=value ...` for commands on `node`: the package and helpers importable."""
        env = {
            "PYTHONPATH": f"{self.root / 'pylib'}:{self.helpers}",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **(self._extra_env(node) if self._extra_env else {}),
        }
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())

    def ip(self, node: int) -> str:
        """The node's address on the inter-node network (where it serves handles)."""
        return self.node_list[node].addr

    def alive(self, node: int) -> bool:
        return self.node_list[node].alive()

    def conn(self, node: int) -> Connection:
        conn = self._conns.get(node)
        if conn is not None:
            return conn
        # a debug kernel's sshd answers late under load: its scale, as the boot's
        timeout = scaled(60)
        conn = self.node_list[node].connect(timeout=timeout, node_only=True)
        self._conns[node] = conn
        return conn

    def run(self, node: int, command: str, *, timeout: float = 120, check: bool = True,
            stdin: bytes | None = None) -> Result:  # fmt: skip
        try:
            return self.conn(node).run(command, timeout=timeout, check=check, stdin=stdin)
        except GuestGone:
            self.drop(node)
            raise

    def py(self, node: int, code: str, *, timeout: float = 120, check: bool = True) -> Result:
        """Run a Python snippet in the node's agent process (obmm and xnode importable)."""
        agent = self._agents.get(node)
        try:
            if agent is None:
                command = f"env {self.env(node)} {self.python} -m xnode agent"
                alive = self.node_list[node].alive
                agent = self._agents[node] = Agent(self.conn(node), alive, command)
            result = agent.run(code, timeout)
        except (SshError, OSError, EOFError) as exc:
            # A dead or stuck agent is replaced on the next call.
            self._drop_agent(node)
            if isinstance(exc, SshError):
                raise
            raise GuestGone(f"node{node}: snippet agent lost: {exc}") from exc
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    def new_agent(self, node: int) -> None:
        """The next snippet on `node` runs in a new agent process, one that holds nothing of the
        driver open whatever earlier snippets left (before a module reload, say)."""
        self._drop_agent(node)

    def _drop_agent(self, node: int) -> None:
        agent = self._agents.pop(node, None)
        if agent is not None:
            agent.close()
            if self.alive(node):
                self.run(node, f"kill -9 {agent.pid} 2>/dev/null; true", check=False)

    def py_json(self, node: int, code: str, *, timeout: float = 120) -> Any:
        """Run a snippet whose last stdout line is JSON; return it parsed."""
        out = self.py(node, code, timeout=timeout).out.strip().splitlines()
        assert out, f"node{node}: snippet printed nothing"
        return json.loads(out[-1])

    def spawn(self, node: int, command: str, *, name: str) -> int:
        """Start `command` in the background on `node`; its output goes to /tmp/<name>.log."""
        log = f"/tmp/{name}.log"
        res = self.run(
            node,
            # The whole background job has its fds redirected, so the SSH channel can close.
            f"(cd /tmp && exec env {self.env(node)} setsid sh -c {shlex.quote(command)}) "
            f"</dev/null >{log} 2>&1 & echo $!",
        )
        return int(res.out.strip())

    def spawn_xnode(self, node: int, argv: list[str], *, name: str) -> int:
        """`xnode ARGV` in the background on `node`, forked from the node's agent (obmm already
        imported); its output goes to /tmp/<name>.log.  Its pid."""
        log = f"/tmp/{name}.log"
        return int(
            self.py_json(
                node, f"import json, xnode\nprint(json.dumps(xnode.detach({argv!r}, {log!r})))\n"
            )
        )

    def wait_file(self, node: int, path: str, *, timeout: float = 90, log: str = "") -> str:
        """Wait until `path` exists in the guest; return its content.  The wait is for work of
        the machine's pace, so `timeout` is scaled (settings.scaled) and counted by the
        guest's clock, not by its loop's turns."""
        bound = scaled(timeout)
        poll = f"while [ ! -e {shlex.quote(path)} ]; do sleep 0.2; done"
        script = f"timeout {bound:.0f} sh -c {shlex.quote(poll)} && cat {shlex.quote(path)}"
        res = self.run(node, script, timeout=bound + scaled(30), check=False)
        if not res.ok:
            extra = self.run(node, f"cat {log}", check=False).out if log else ""
            raise AssertionError(f"node{node}: {path} did not appear in {bound:.0f} s\n{extra}")
        return res.out

    def kill(self, node: int, pid: int, sig: str = "TERM") -> None:
        if self.alive(node):
            self.run(node, f"kill -{sig} {pid} 2>/dev/null; true", check=False)

    def drop(self, node: int) -> None:
        agent = self._agents.pop(node, None)
        if agent is not None:
            agent.close()
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for node in list(self._conns):
            self.drop(node)

    # -- kernel log guard (obmm.testbed.vm.kguard) -------------------------------------------------

    @property
    def guard(self) -> KernelLogGuard:
        if self._guard is None:
            self._guard = KernelLogGuard(self.node_list, marker=MARKER)
        return self._guard

    def mark(self, tag: str) -> dict[int, int]:
        """Write a marker into every live node's kernel log; their taint masks."""
        return self.guard.mark(tag)

    def new_kernel_log(self, node: int, tag: str) -> str:
        return self.guard.new_kernel_log(node, tag)

    def taint(self, node: int) -> int:
        return self.guard.taint(node)

    def guard_start(self, name: str) -> None:
        """Start watching every node's kernel log (the guard calls this before each test)."""
        self.guard.start(name)

    def guard_failures(self, *, allow_dead: bool = False) -> list[str]:
        """Kernel reports, new taint and dead nodes since guard_start(), one text per node."""
        return self.guard.failures(allow_dead=allow_dead)

    def take_kernel_log(self) -> list[str]:
        """guard_failures() so far; the test owns them and the guard starts over."""
        return self.guard.restart()
