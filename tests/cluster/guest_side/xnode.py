"""Guest-side helpers of the cluster suite (copied into every node; not a host test module).

The host tests (tests/cluster/test_*.py) drive these over SSH, either as
``python3 -m xnode COMMAND ...`` (long-running services) or by importing them in short
snippets.  Everything prints JSON on its last stdout line so the host can parse results.

Runs with the node's Python (Debian 12: 3.11) and the obmm package the harness copied there
(/opt/obmm-testbed/pylib in a QEMU guest, a per-run directory on a hardware host).  The decoder
is $OBMM_DECODER's (the emulator's windows by default).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import obmm
from obmm import decoder, exchange
from obmm.handle import Handle
from obmm.identity import NodeIdentity, local_cna, local_eid

SZ_2M = 2 << 20


def pattern(seed: int, size: int, offset: int = 0) -> bytes:
    """Deterministic test data: the same bytes on every node for the same seed."""
    return random.Random(seed).randbytes(offset + size)[offset:]


def handle_for(exp: obmm.Export) -> Handle:
    # This node's identity as handles carry it (obmm.identity: the UB controller's sysfs, as
    # libobmm reads it, and obmm_emu's node_id or $OBMM_NODE_ID).
    return Handle.from_export(exp, NodeIdentity.local())


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


# -- exporter side ---------------------------------------------------------------------------


def export_fill(size: int, seed: int) -> Handle:
    """Export `size` bytes, fill them with pattern(seed), return the handle (export persists)."""
    with obmm.Obmm() as dev:
        exp = dev.export(size)
    with obmm.ShmDev(exp.mem_id) as shm, shm.mmap(size) as m:
        m.write(0, pattern(seed, size))
    return handle_for(exp)


def unexport(mem_id: int) -> None:
    with obmm.Obmm() as dev:
        dev.unexport(mem_id)


def read_local(mem_id: int, offset: int, size: int, *, sync: bool = False) -> bytes:
    with obmm.ShmDev(mem_id, sync=sync) as shm, shm.mmap() as m:
        return m.read(offset, size)


def write_local(mem_id: int, offset: int, data: bytes, *, sync: bool = False) -> None:
    with obmm.ShmDev(mem_id, sync=sync) as shm, shm.mmap() as m:
        m.write(offset, data)


def serve(args: argparse.Namespace) -> int:
    """Export, fill, publish the handle on the inter-node network until SIGTERM, then unexport.

    SIGUSR1 unexports at once and keeps the process (and the server) running.
    """
    handle = export_fill(args.size, args.seed)
    server = exchange.HandleServer(args.bind, args.port).start()
    server.publish(args.name, handle)
    state = {"exported": True}

    def on_usr1(signum: int, frame: object) -> None:
        if state["exported"]:
            try:
                unexport(handle.mem_id)
            except obmm.ObmmError as exc:
                Path(args.ready + ".unexported").write_text(f"error: {exc}")
                return
            state["exported"] = False
            Path(args.ready + ".unexported").write_text("ok")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    doc = {"handle": handle.to_dict(), "address": list(server.address), "pid": os.getpid()}
    tmp = args.ready + ".tmp"
    Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, args.ready)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if state["exported"]:
            unexport(handle.mem_id)
    return 0


# -- importer side ---------------------------------------------------------------------------


def fetch(host: str, port: int, name: str) -> Handle:
    return exchange.fetch(host, port, name, connect_timeout=10, read_timeout=20)


def import_handle(
    handle: Handle, *, tokenid: int | None = None, flags: int = obmm.abi.OBMM_IMPORT_FLAG_ALLOW_MMAP
) -> obmm.Import:
    """Resolve the decoder address of `handle` and import it (the region persists).

    `flags` NUMA_REMOTE borrows it: the result's numa_id is the node it was hot-added to.
    """
    addr = decoder.default_decoder().resolve(handle.node_id, handle.uba, handle.length)
    with obmm.Obmm() as dev:
        return dev.import_(
            addr,
            handle.length,
            flags=flags,
            scna=local_cna(),
            dcna=handle.scna,
            tokenid=handle.tokenid if tokenid is None else tokenid,
            seid=local_eid(),
            deid=handle.seid,
        )


# -- borrowing (NUMA_REMOTE) -------------------------------------------------------------------

PAGE = 4096
# mbind(2) and move_pages(2) numbers (glibc has no wrappers; libnuma is not installed).
SYS_MBIND = {"x86_64": 237, "aarch64": 235}
SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239}
MPOL_BIND = 2


def page_marker(marker: bytes, index: int) -> bytes:
    """What `fill` writes at the start of page `index`: the marker, then the index."""
    return marker + index.to_bytes(8, "little")


def page_nodes(address: int, pages: int) -> list[int]:
    """The NUMA node of each of the `pages` pages at `address` (-errno for a page not there),
    asked of the kernel: move_pages(2) with no target nodes only reports where pages are."""
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    addrs = (ctypes.c_void_p * pages)(*[address + i * PAGE for i in range(pages)])
    status = (ctypes.c_int * pages)()
    rc = libc.syscall(SYS_MOVE_PAGES[platform.machine()], 0, ctypes.c_ulong(pages), addrs,
                      None, status, 0)  # fmt: skip
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"move_pages (query): {os.strerror(err)}")
    return list(status)


def vma_policy(address: int) -> str:
    """The memory policy of the mapping that starts at `address` (numa_maps' second field)."""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        fields = line.split()
        if int(fields[0], 16) == address:
            return fields[1]
    return ""


def runs_off(nodes: list[int], node: int, limit: int = 6) -> list[list[int]]:
    """The first `limit` runs [first, last] of page indices not on `node`."""
    runs: list[list[int]] = []
    for i, n in enumerate(nodes):
        if n == node:
            continue
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        elif len(runs) == limit:
            break
        else:
            runs.append([i, i])
    return runs


def mbind(address: int, size: int, node: int) -> None:
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << node)
    rc = libc.syscall(SYS_MBIND[platform.machine()], ctypes.c_void_p(address),
                      ctypes.c_ulong(size), MPOL_BIND, ctypes.byref(mask),
                      ctypes.c_ulong(node + 2), 0)  # fmt: skip
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mbind to node {node}: {os.strerror(err)}")


def fill(args: argparse.Namespace) -> int:
    """Fill `--size` bytes of fresh anonymous memory with page markers; report where they are.

    Run under `numactl --membind=N`, or with `--mbind N` (only this buffer bound to N).  Writes
    `ready` (JSON: pid, pages, pages per node).  With `--hold` it then waits: SIGUSR1 checks
    every marker again and writes `<ready>.verified` (JSON: ok, pages per node); SIGTERM ends it.
    `--pin` keeps the first page in a pipe (unmovable) until SIGUSR2 (then `<ready>.unpinned`).
    """
    import ctypes
    import mmap as mmap_mod

    marker = bytes.fromhex(args.marker)
    buf = mmap_mod.mmap(-1, args.size, flags=mmap_mod.MAP_PRIVATE | mmap_mod.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if args.mbind is not None:
        mbind(address, args.size, args.mbind)
    pages = args.size // PAGE
    for i in range(pages):
        buf[i * PAGE : i * PAGE + len(marker) + 8] = page_marker(marker, i)
    pinned: list[int] = []
    if args.pin:
        # A page held by a pipe (vmsplice) cannot be migrated: memory offlining must wait.
        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        libc = ctypes.CDLL(None, use_errno=True)
        pinned = list(os.pipe())
        iov = IoVec(address, PAGE)
        if libc.vmsplice(pinned[1], ctypes.byref(iov), 1, 0) != PAGE:
            raise OSError(ctypes.get_errno(), "vmsplice")
    tmp = args.ready + ".tmp"
    where = page_nodes(address, pages)
    doc = {"pid": os.getpid(), "pages": pages, "nodes": dict(Counter(where))}
    if args.mbind is not None:
        doc["off_node_runs"] = runs_off(where, args.mbind)  # where a bind was not honoured
        doc["policy"] = vma_policy(address)  # the buffer's policy now, as numa_maps shows it
    Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, args.ready)
    if not args.hold:
        return 0

    def on_usr1(signum: int, frame: object) -> None:
        ok = all(buf[i * PAGE : i * PAGE + len(marker) + 8] == page_marker(marker, i)
                 for i in range(pages))  # fmt: skip
        Path(args.ready + ".verified").write_text(
            json.dumps({"ok": ok, "nodes": dict(Counter(page_nodes(address, pages)))})
        )

    def on_usr2(signum: int, frame: object) -> None:
        for fd in pinned:
            os.close(fd)  # the pipe's reference to the page goes with it
        pinned.clear()
        Path(args.ready + ".unpinned").write_text("ok")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGUSR2, on_usr2)
    signal.signal(signal.SIGTERM, on_term)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    return 0


def find_markers(mem_id: int, marker: bytes) -> list[int]:
    """The page indices whose markers this node finds in its region `mem_id` (sorted, unique)."""
    found = set()
    with obmm.ShmDev(mem_id) as shm, shm.mmap() as m:
        data = m.read(0, m.length)
    pos = data.find(marker)
    while pos >= 0:
        if pos % PAGE == 0:
            found.add(int.from_bytes(data[pos + len(marker) : pos + len(marker) + 8], "little"))
        pos = data.find(marker, pos + 1)
    return sorted(found)


def node_memory(node: int) -> int:
    """MemTotal of NUMA node `node` in bytes (0 when the node is gone)."""
    path = Path(f"/sys/devices/system/node/node{node}/meminfo")
    if not path.exists():
        return 0
    for line in path.read_text().splitlines():
        if "MemTotal:" in line:
            return int(line.split()[-2]) * 1024
    return 0


MODULE_KO = "/opt/obmm-testbed/kmod/obmm.ko"
#: The load parameters a reload keeps (the fabric's: this node's id and pool).
RELOAD_PARAMS = ("node_id", "pool_base", "pool_size")


def reload_obmm(extra: tuple[str, ...] = ()) -> None:
    """rmmod obmm and insmod it again with its fabric parameters and `extra`: a new boot of
    the driver.  A process that just let the driver go may still be exiting: rmmod is retried
    for up to 10 s, then SystemExit names who holds the driver (a file or a mapping)."""
    import subprocess

    params = Path("/sys/module/obmm/parameters")
    args = [f"{n}=" + (params / n).read_text().strip() for n in RELOAD_PARAMS]
    for _ in range(100):
        if subprocess.run(["rmmod", "obmm"], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        holders = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fd_dir = f"/proc/{pid}/fd"
                fds = [os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)]
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            if any(f.startswith("/dev/obmm") for f in fds) or "obmm_shmdev" in maps:
                cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
                holders.append(f"{pid}: {cmdline}")
        raise SystemExit(f"rmmod obmm: still in use, by {holders}")
    subprocess.run(["insmod", MODULE_KO, *args, *extra], check=True)


def unimport(mem_id: int) -> None:
    with obmm.Obmm() as dev:
        dev.unimport(mem_id)


def touch_loop(args: argparse.Namespace) -> int:
    """Map an import and read it in a loop until killed by a signal (SIGBUS expected).

    Writes `ready` once the mapping has been read successfully; exits 3 after `--limit` s.
    """
    with obmm.ShmDev(args.mem_id, sync=args.sync) as shm:
        m = shm.mmap(args.size)
        first = m.read(0, 64)
        Path(args.ready).write_text(first.hex())
        deadline = time.monotonic() + args.limit
        step = 4096
        total = 0
        while time.monotonic() < deadline:
            for off in range(0, args.size, step):
                total += m.buf[off]  # a load from the imported memory on every page
            time.sleep(0.01)
        m.close()
    print(total)
    return 3


def blocking(args: argparse.Namespace) -> int:
    """One call that may block: ``unimport MEM_ID`` (of a borrow with a pinned page, which
    retries until a signal) or ``import-numa ADDR LENGTH TOKENID`` (a NUMA_REMOTE loopback
    IMPORT, which may wait for the hot-plug lock).  SIGUSR1 and SIGUSR2 are handled (counted;
    no SA_RESTART: an interruptible wait returns EINTR).  Writes ``--out`` at the end:
    ``{"errno": 0 or the errno, "signals": received, "mem_id": ..., "numa_id": ...}``."""
    got = {"signals": 0}

    def count(signum: int, frame: object) -> None:
        got["signals"] += 1

    signal.signal(signal.SIGUSR1, count)
    signal.signal(signal.SIGUSR2, count)
    doc: dict[str, Any] = {"errno": 0}
    with obmm.Obmm() as dev:
        Path(args.out + ".started").write_text(str(os.getpid()))
        try:
            if args.op == "unimport":
                dev.unimport(int(args.values[0], 0))
            else:
                addr, length, tokenid = (int(v, 0) for v in args.values)
                imp = dev.import_(addr, length, scna=local_cna(), tokenid=tokenid,
                                  flags=obmm.abi.OBMM_IMPORT_FLAG_NUMA_REMOTE)  # fmt: skip
                doc.update(mem_id=imp.mem_id, numa_id=imp.numa_id)
        except OSError as exc:
            doc["errno"] = exc.errno or 0
    doc["signals"] = got["signals"]
    Path(args.out).write_text(json.dumps(doc))
    return 0


# -- Engram-style rows -------------------------------------------------------------------------


def engram_rows(mem_id: int, tables: int, rows: int, row_size: int, picks: list[list[int]]
                ) -> str:  # fmt: skip
    """sha256 over the picked rows (table t, row r) read from region `mem_id` of this node."""
    table_size = rows * row_size
    h = hashlib.sha256()
    with obmm.ShmDev(mem_id) as shm, shm.mmap() as m:
        for t, r in picks:
            h.update(m.read(t * table_size + r * row_size, row_size))
    return h.hexdigest()


def engram_expected(seed: int, size: int, rows: int, row_size: int, picks: list[list[int]]
                    ) -> str:  # fmt: skip
    data = pattern(seed, size)
    table_size = rows * row_size
    h = hashlib.sha256()
    for t, r in picks:
        off = t * table_size + r * row_size
        h.update(data[off : off + row_size])
    return h.hexdigest()


def detach(argv: list[str], log: str) -> int:
    """Run ``xnode ARGV`` in a new session, detached from the agent; its pid.

    For the agent: the child starts with obmm already imported (a fresh interpreter takes
    seconds under TCG).  Forked twice so the service is nobody's child here: PID 1 reaps it,
    and `kill -0 PID` turns false as soon as it has exited.  Output goes to `log`.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked processes
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own fds
            sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            os.chdir("/tmp")
            status = main(argv)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as pipe:
        pid = pipe.read()
    if not pid:
        raise RuntimeError(f"xnode {argv[0]}: the detached process did not start")
    return int(pid)


#: What a snippet must not leave behind in the agent: open files and mappings of the driver.
DRIVER_FILES = "/dev/obmm"


def _held(prefix: str) -> tuple[dict[int, str], set[tuple[int, int, str]]]:
    """This process's open fds and mappings of files whose path starts with ``prefix``."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the fd listdir itself used, gone already
            continue
        if path.startswith(prefix):
            fds[int(name)] = path
    maps = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            maps.add((start, end, fields[5]))
    return fds, maps


def run_snippet(code: str, watch: str = DRIVER_FILES) -> dict[str, Any]:
    """Run one snippet in a scope of its own: ``{"ok", "out", "error"}``.  What it leaves open
    or mapped of ``watch`` (an ``obmm.Obmm()`` never closed: its fd is a bare int) is closed
    here and fails the snippet, naming it: left behind, it would hold the driver for every
    later snippet of this agent, and a later test's rmmod would find the module in use."""
    import contextlib
    import ctypes
    import gc
    import io
    import traceback

    fds_before, maps_before = _held(watch)
    buf = io.StringIO()
    scope: dict[str, Any] = {"__name__": "__snippet__"}
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, "<snippet>", "exec"), scope)
        resp = {"ok": True, "out": buf.getvalue(), "error": ""}
    except BaseException:
        resp = {"ok": False, "out": buf.getvalue(), "error": traceback.format_exc()}
    del scope
    fds, maps = _held(watch)
    if fds.keys() - fds_before.keys() or maps - maps_before:
        gc.collect()  # a file object only a reference cycle kept closes when collected
        fds, maps = _held(watch)
    left = [f"fd {fd} on {path}" for fd, path in sorted(fds.items()) if fd not in fds_before]
    left += [f"mapping {a:#x}-{b:#x} of {path}" for a, b, path in sorted(maps - maps_before)]
    if left:
        munmap = ctypes.CDLL(None, use_errno=True).munmap
        munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        for a, b, _ in maps - maps_before:
            munmap(a, b - a)
        for fd in fds.keys() - fds_before.keys():
            os.close(fd)
        resp["ok"] = False
        resp["error"] += (f"the snippet left {'; '.join(left)} (the agent closed them: close "
                          f"what a snippet opens, or use it as a context manager)\n")  # fmt: skip
    return resp


def agent(args: argparse.Namespace) -> int:
    """Run snippets sent by the host, one JSON line each, in this one process.

    Importing obmm costs seconds under TCG; the agent pays it once per node.  Request:
    ``{"code": "..."}``; response: ``{"ok": bool, "out": stdout, "error": traceback}``
    (:func:`run_snippet`).
    """
    out = sys.stdout
    sys.stdout = sys.stderr  # stray output never corrupts the response stream
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run_snippet(json.loads(line)["code"])), file=out, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xnode")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--size", type=int, default=SZ_2M)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", default="region")
    p.add_argument("--bind", required=True)
    p.add_argument("--port", type=int, default=exchange.DEFAULT_PORT)
    p.add_argument("--ready", required=True)
    p.set_defaults(func=serve)
    p = sub.add_parser("touch")
    p.add_argument("--mem-id", type=int, required=True)
    p.add_argument("--size", type=int, default=SZ_2M)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--ready", required=True)
    p.add_argument("--limit", type=float, default=120.0)
    p.set_defaults(func=touch_loop)
    p = sub.add_parser("fill")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--marker", required=True, help="hex bytes written at every page start")
    p.add_argument("--mbind", type=int, default=None)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--pin", action="store_true", help="hold one page in a pipe until SIGUSR2")
    p.add_argument("--ready", required=True)
    p.set_defaults(func=fill)
    p = sub.add_parser("blocking")
    p.add_argument("op", choices=("unimport", "import-numa"))
    p.add_argument("values", nargs="+")
    p.add_argument("--out", required=True)
    p.set_defaults(func=blocking)
    p = sub.add_parser("agent")
    p.set_defaults(func=agent)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
