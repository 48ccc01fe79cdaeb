"""Cluster snapshots: a booted, idle cluster saved once and restored in about a second.

After the first cold boot of a cluster shape, before any module is loaded, every node is
paused and migrated to a file with QEMU's ``x-ignore-shared`` capability: the guest RAM (a
shared file on tmpfs, see :mod:`obmm.testbed.vm.qemu`) is not streamed but copied by the host,
sparsely, and only the device state (about 1 MiB a node) goes through the migration stream.
``ivshmem-plain`` runs with ``master=on`` so the windows do not block migration.  A later
cluster of the same shape copies the RAM files, control region and disk overlays back into a
fresh run directory, starts each QEMU with ``-incoming defer`` (new SSH ports, new sockets)
and loads the stream; the host then sets each guest's clock and mixes host randomness into
its pool.

A snapshot lives in ``<cache>/snapshots/<key>/`` and is keyed by everything that shapes the
machine: the image's fingerprint, the QEMU binary and its version, the topology, the init,
the accelerator and each node's command line with run-specific paths and ports blanked.  It is
written into a temporary directory and renamed into place, so a killed save leaves none.  On
restore every file's size and checksum is checked against the manifest; a snapshot that does
not verify, or that QEMU refuses to load, is reported and the cluster boots cold instead.

``$OBMM_TESTBED_SNAPSHOT``: ``auto`` (default: restore when one fits, else boot cold and save
one) or ``off`` (always boot cold, save nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obmm.testbed import paths
from obmm.testbed.errors import TestbedError
from obmm.testbed.parallel import on_each
from obmm.testbed.topology import Topology
from obmm.tools import interrupts

log = logging.getLogger(__name__)

MODE_AUTO = "auto"
MODE_OFF = "off"
MODES = (MODE_AUTO, MODE_OFF)
# Bump when what a snapshot holds or how it is restored changes.
FORMAT = 1
MANIFEST = "manifest.json"
BARS_FILE = "bars.json"
QMP_TIMEOUT_S = 20.0
COPY_CHUNK = 4 << 20
# Placeholders that make two runs' command lines comparable.
RUN_MARK = "<run>"
LOG_MARK = "<log>"
PORT_MARK = "<port>"


class SnapshotError(TestbedError):
    """A snapshot cannot be saved, or does not fit or verify; the message says why."""


def snapshots_dir() -> Path:
    return paths.cache_dir() / "snapshots"


# -- keys --------------------------------------------------------------------------------------


def qemu_identity(binary: str) -> dict[str, Any]:
    """The QEMU binary as a key part: its resolved path, version line, size and mtime."""
    path = shutil.which(binary) or binary
    try:
        real = Path(path).resolve()
        st = real.stat()
        version = subprocess.run(
            [str(real), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        raise SnapshotError(f"cannot identify QEMU {binary!r}: {exc}") from exc
    return {
        "path": str(real),
        "version": version[0] if version else "",
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def blank_argv(argv: Sequence[str], rundir: Path, logdir: Path, port: int) -> list[str]:
    """`argv` with this run's directories and SSH port replaced by placeholders."""
    out = []
    for arg in argv:
        arg = arg.replace(str(rundir), RUN_MARK).replace(str(logdir), LOG_MARK)
        out.append(arg.replace(f"127.0.0.1:{port}-", f"127.0.0.1:{PORT_MARK}-"))
    return out


@dataclass(frozen=True)
class Key:
    """Everything a snapshot depends on; `digest` names its directory."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        blob = json.dumps(self.parts, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    @classmethod
    def make(
        cls,
        *,
        image_fingerprint: str,
        qemu: dict[str, Any],
        topology: Topology,
        init: str,
        accel: str,
        argvs: Sequence[Sequence[str]],
    ) -> Key:
        shape = {k: v for k, v in topology.to_dict().items() if k != "description"}
        return cls(
            {
                "format": FORMAT,
                "image": image_fingerprint,
                "qemu": qemu,
                "topology": shape,
                "init": init,
                "accel": accel,
                "argv": [list(a) for a in argvs],
            }
        )


# -- files -------------------------------------------------------------------------------------


def copy_sparse(src: Path, dst: Path) -> tuple[int, int]:
    """Copy `src` to `dst` keeping holes; returns (size, crc32 over offsets and data)."""
    crc = 0
    size = src.stat().st_size
    with src.open("rb") as fin, dst.open("wb") as fout:
        fd_in, fd_out = fin.fileno(), fout.fileno()
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fd_in, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd_in, start, os.SEEK_HOLE)
            pos = start
            while pos < end:
                data = os.pread(fd_in, min(COPY_CHUNK, end - pos), pos)
                if not data:
                    break
                crc = zlib.crc32(pos.to_bytes(8, "little"), crc)
                crc = zlib.crc32(data, crc)
                os.pwrite(fd_out, data, pos)
                pos += len(data)
            offset = end
        fout.truncate(size)
    return size, crc


def _file_names(nodes: int) -> list[str]:
    names = ["control", BARS_FILE]
    for i in range(nodes):
        names += [f"node{i}.ram", f"node{i}.qcow2", f"node{i}.state"]
    return names


@dataclass(frozen=True)
class Snapshot:
    directory: Path
    manifest: dict[str, Any]

    @property
    def digest(self) -> str:
        return self.directory.name

    def state_file(self, index: int) -> Path:
        return self.directory / f"node{index}.state"

    @property
    def nodes(self) -> int:
        return int(self.manifest["key"]["topology"]["nodes"])

    @property
    def size(self) -> int:
        """Bytes on disk (the RAM copies are sparse)."""
        return sum(p.stat().st_blocks * 512 for p in self.directory.iterdir() if p.is_file())

    @classmethod
    def open(cls, directory: Path) -> Snapshot:
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"snapshot {directory}: unreadable manifest: {exc}") from exc
        if not isinstance(manifest, dict) or "files" not in manifest or "key" not in manifest:
            raise SnapshotError(f"snapshot {directory}: manifest lacks files or key")
        return cls(directory, manifest)

    def restore_into(self, rundir: Path) -> None:
        """Copy the RAM files, control region and overlays into `rundir`, verifying each (the
        files at once: the copy and its checksum run without the GIL)."""
        names = [
            name
            for name in self.manifest["files"]
            if name.endswith((".ram", ".qcow2")) or name == "control"
        ]
        on_each(names, lambda name: self._restore_file(name, rundir))

    def _restore_file(self, name: str, rundir: Path) -> None:
        want = self.manifest["files"][name]
        src = self.directory / name
        if not src.is_file():
            raise SnapshotError(f"snapshot {self.digest}: {name} is missing")
        if src.stat().st_size != want["size"]:
            raise SnapshotError(
                f"snapshot {self.digest}: {name} is {src.stat().st_size} bytes, "
                f"the manifest says {want['size']} (truncated?)"
            )
        _size, crc = copy_sparse(src, rundir / name)
        if crc != want["crc32"]:
            raise SnapshotError(f"snapshot {self.digest}: {name} does not match its checksum")

    def verify_states(self) -> None:
        """The migration streams are small: check them whole before any QEMU reads one."""
        for i in range(self.nodes):
            name = f"node{i}.state"
            want = self.manifest["files"].get(name)
            path = self.directory / name
            if want is None or not path.is_file():
                raise SnapshotError(f"snapshot {self.digest}: {name} is missing")
            data = path.read_bytes()
            if len(data) != want["size"]:
                raise SnapshotError(
                    f"snapshot {self.digest}: {name} is {len(data)} bytes, "
                    f"the manifest says {want['size']} (truncated?)"
                )
            if zlib.crc32(data) != want["crc32"]:
                raise SnapshotError(f"snapshot {self.digest}: {name} does not match its checksum")


def find(key: Key) -> Snapshot | None:
    """The snapshot saved under `key`, if any (not yet verified)."""
    directory = snapshots_dir() / key.digest
    if not directory.is_dir():
        return None
    snap = Snapshot.open(directory)
    if snap.manifest["key"] != json.loads(json.dumps(key.parts)):
        raise SnapshotError(f"snapshot {key.digest}: its manifest names another key")
    return snap


def list_all() -> list[Snapshot]:
    out = []
    root = snapshots_dir()
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                with contextlib.suppress(SnapshotError):
                    out.append(Snapshot.open(d))
    return out


def clear() -> int:
    """Remove every snapshot (and leftovers of killed saves); how many were removed."""
    root = snapshots_dir()
    if not root.is_dir():
        return 0
    count = 0
    for d in root.iterdir():
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
            count += not d.name.startswith(".")
    return count


def discard(snap: Snapshot) -> None:
    shutil.rmtree(snap.directory, ignore_errors=True)


# -- QMP ---------------------------------------------------------------------------------------


async def _qmp(sockets: Sequence[Path], action: Callable[..., Any]) -> None:
    from qemu.qmp import QMPClient

    logging.getLogger("qemu.qmp").setLevel(logging.WARNING)
    clients = []
    try:
        for i, sock in enumerate(sockets):
            c = QMPClient(f"node{i}")
            await c.connect(str(sock))
            clients.append(c)
        await action(clients)
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.disconnect()


def _run_qmp(sockets: Sequence[Path], action: Callable[..., Any]) -> None:
    # A KeyboardInterrupt raised by a signal handler inside the event loop escapes its task:
    # asyncio logs "Task exception was never retrieved" with a traceback.  The exchange is
    # bounded, so SIGINT/SIGTERM wait for it and then take effect.
    try:
        with interrupts.signals_deferred(
            f"talking to the QEMU monitors (at most {QMP_TIMEOUT_S:.0f} s)"
        ):
            asyncio.run(asyncio.wait_for(_qmp(sockets, action), QMP_TIMEOUT_S))
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError(f"QMP: {type(exc).__name__}: {exc}") from exc


_IGNORE_SHARED = {"capabilities": [{"capability": "x-ignore-shared", "state": True}]}
IVSHMEM_DEVICE_ID = 0x1110
PCI_CONFIG_ADDRESS = 0xCF8
PCI_CONFIG_DATA = 0xCFC
PCI_COMMAND = 0x04
PCI_COMMAND_MEMORY = 0x2
PCI_BAR0 = 0x10


async def _ivshmem_bars(client: Any) -> list[dict[str, Any]]:
    """The guest-programmed memory BARs of the node's ivshmem devices (windows, control)."""
    bars = []
    for bus in await client.execute("query-pci"):
        for dev in bus["devices"]:
            if dev["id"]["device"] != IVSHMEM_DEVICE_ID:
                continue
            for region in dev["regions"]:
                if region.get("type") == "memory" and region["address"] > 0:
                    bars.append(
                        {
                            "bus": bus["bus"],
                            "slot": dev["slot"],
                            "function": dev["function"],
                            "bar": region["bar"],
                            "address": region["address"],
                            "is64": bool(region.get("mem_type_64")),
                        }
                    )
    return bars


def _config_write(bar: dict[str, Any], reg: int, value: int, width: str) -> list[str]:
    addr = 0x80000000 | bar["bus"] << 16 | bar["slot"] << 11 | bar["function"] << 8 | (reg & 0xFC)
    return [
        f"o /w {PCI_CONFIG_ADDRESS:#x} {addr:#x}",
        f"o /{width} {PCI_CONFIG_DATA + (reg & 3):#x} {value:#x}",
    ]


def map_bars_commands(bars: Sequence[dict[str, Any]]) -> list[str]:
    """HMP port writes that map each BAR where the saved guest had it.

    x-ignore-shared checks that a skipped RAM block sits at the same guest address on both
    sides before any device state is loaded; an ivshmem BAR is only mapped once the guest's
    PCI configuration is, so the destination maps it first (the device state then overwrites
    the same configuration with the same values).
    """
    cmds = []
    for bar in bars:
        reg = PCI_BAR0 + 4 * bar["bar"]
        # HMP sizes: w is 32 bits, h is 16.
        cmds += _config_write(bar, reg, bar["address"] & 0xFFFFFFFF, "w")
        if bar["is64"]:
            cmds += _config_write(bar, reg + 4, bar["address"] >> 32, "w")
        cmds += _config_write(bar, PCI_COMMAND, PCI_COMMAND_MEMORY, "h")
    return cmds


# The ECAM window's region in `info mtree` (QEMU's hw/pci-host/gpex.c names it so).
ECAM_REGION = "pcie-mmcfg-mmio"


def ecam_base(mtree: str) -> int:
    """Guest-physical address of the PCIe ECAM window, from HMP `info mtree -f`'s text."""
    for line in mtree.splitlines():
        fields = line.split()
        if fields and fields[-1] == ECAM_REGION and "-" in fields[0]:
            return int(fields[0].split("-")[0], 16)
    raise SnapshotError(f"no {ECAM_REGION} region in the machine's memory map")


def map_bars_ecam_commands(bars: Sequence[dict[str, Any]], base: int) -> list[str]:
    """qtest writes (memory-mapped, to the ECAM window at `base`) that map each BAR where the
    saved guest had it: :func:`map_bars_commands` for a machine without configuration ports."""
    cmds = []
    for bar in bars:
        dev = base | bar["bus"] << 20 | bar["slot"] << 15 | bar["function"] << 12
        reg = PCI_BAR0 + 4 * bar["bar"]
        cmds.append(f"writel {dev + reg:#x} {bar['address'] & 0xFFFFFFFF:#x}")
        if bar["is64"]:
            cmds.append(f"writel {dev + reg + 4:#x} {bar['address'] >> 32:#x}")
        cmds.append(f"writew {dev + PCI_COMMAND:#x} {PCI_COMMAND_MEMORY:#x}")
    return cmds


def qtest_argv(sock: Path) -> list[str]:
    """QEMU options of a restoring node whose BARs are mapped through qtest (arch "ecam"):
    the socket, and no qtest log (its default is every command on stderr)."""
    return ["-qtest", f"unix:{sock},server=on,wait=off", "-qtest-log", "none"]


async def _qtest(sock: Path, cmds: Sequence[str], name: str) -> None:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    try:
        for cmd in cmds:
            writer.write(cmd.encode() + b"\n")
            await writer.drain()
            reply = (await reader.readline()).decode().strip()
            if reply != "OK":
                raise SnapshotError(f"{name}: qtest {cmd}: {reply or 'no reply'}")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _map_bars(
    client: Any, bars: Sequence[dict[str, Any]], qtest: Path | None, name: str
) -> None:
    """Map the BARs of a QEMU waiting for its state: port writes, or ECAM ones over qtest."""
    if qtest is None:
        for cmd in map_bars_commands(bars):
            reply = await client.execute("human-monitor-command", {"command-line": cmd})
            if reply:
                raise SnapshotError(f"{name}: {cmd}: {reply.strip()}")
        return
    mtree = await client.execute("human-monitor-command", {"command-line": "info mtree -f"})
    await _qtest(qtest, map_bars_ecam_commands(bars, ecam_base(mtree)), name)


async def _wait_migration(client: Any, name: str) -> None:
    while True:
        st = await client.execute("query-migrate")
        status = st.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise SnapshotError(f"{name}: migration {status}: {st.get('error-desc', '')}")
        await asyncio.sleep(0.02)


def save_states(sockets: Sequence[Path], out: Path) -> None:
    """Pause every node, then write each one's device state to `out/node<i>.state`.

    The nodes stay paused (QEMU's post-migrate state): the caller copies their RAM files and
    disks and then resumes them with :func:`resume`.
    """

    async def action(clients: list[Any]) -> None:
        for c in clients:
            await c.execute("stop")
        bars = [await _ivshmem_bars(c) for c in clients]
        (out / BARS_FILE).write_text(json.dumps(bars) + "\n")
        for i, c in enumerate(clients):
            with (out / f"node{i}.state").open("wb") as f:
                c.send_fd_scm(f.fileno())
                await c.execute("getfd", {"fdname": "snapshot"})
            await c.execute("migrate-set-capabilities", _IGNORE_SHARED)
            await c.execute("migrate", {"uri": "fd:snapshot"})
        for i, c in enumerate(clients):
            await _wait_migration(c, f"node{i}")

    _run_qmp(sockets, action)


def resume(sockets: Sequence[Path]) -> None:
    async def action(clients: list[Any]) -> None:
        for c in clients:
            await c.execute("cont")

    _run_qmp(sockets, action)


def load_states(
    sockets: Sequence[Path], snap: Snapshot, qtest: Sequence[Path] | None = None
) -> None:
    """Feed each QEMU started with ``-incoming defer`` its state, then resume them all.

    `qtest`: each node's qtest socket (:func:`qtest_argv`) where the machine's PCI
    configuration is ECAM only; None: through the configuration ports.
    """

    bars = json.loads((snap.directory / BARS_FILE).read_text())

    async def action(clients: list[Any]) -> None:
        for i, c in enumerate(clients):
            await _map_bars(c, bars[i], qtest[i] if qtest else None, f"node{i}")
            with snap.state_file(i).open("rb") as f:
                c.send_fd_scm(f.fileno())
                await c.execute("getfd", {"fdname": "snapshot"})
            await c.execute("migrate-set-capabilities", _IGNORE_SHARED)
            await c.execute("migrate-incoming", {"uri": "fd:snapshot"})
        # The snapshot was taken paused, so each node stays paused once loaded; all resume
        # together, after every node's state is in (one node's RAM is another's window).
        for i, c in enumerate(clients):
            await _wait_migration(c, f"node{i}")
        for c in clients:
            await c.execute("cont")

    _run_qmp(sockets, action)


# -- saving ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _staging(key: Key) -> Iterator[Path]:
    root = snapshots_dir()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{key.digest}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save(key: Key, rundir: Path, sockets: Sequence[Path], nodes: int) -> Snapshot:
    """Save the cluster in `rundir` (idle, nothing loaded) under `key`; the nodes run on."""
    start = time.monotonic()
    final = snapshots_dir() / key.digest
    with _staging(key) as tmp:
        try:
            save_states(sockets, tmp)
            files: dict[str, dict[str, int]] = {}
            for name in _file_names(nodes):
                if name.endswith(".state") or name == BARS_FILE:
                    data = (tmp / name).read_bytes()
                    files[name] = {"size": len(data), "crc32": zlib.crc32(data)}
                else:
                    size, crc = copy_sparse(rundir / name, tmp / name)
                    files[name] = {"size": size, "crc32": crc}
        finally:
            resume(sockets)
        manifest = {
            "key": key.parts,
            "files": files,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "save_seconds": round(time.monotonic() - start, 3),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            tmp.rename(final)
        except OSError:
            # Another process saved the same key first: keep theirs.
            log.info("snapshot %s: already saved by another run", key.digest)
    log.info("snapshot %s saved in %.1f s", key.digest, time.monotonic() - start)
    return Snapshot.open(final)


def refusal(qmp_error: str, exited: Sequence[tuple[int, int | None, str]], lines: int = 4) -> str:
    """Why a restore failed, in QEMU's own words where a node's QEMU gave up.

    A QEMU that refuses an incoming stream prints why on stderr and exits, so the QMP client
    sees only a disconnect.  `exited` holds (node index, exit status, its log's text) of each
    node whose QEMU has exited; the log starts with the command line (not QEMU's words).
    Without any such words: `qmp_error` as it was.
    """
    said = []
    for index, status, text in exited:
        words = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
        if words:
            said.append(f"node{index}: QEMU exited ({status}): " + " | ".join(words[-lines:]))
    return "; ".join(said) if said else qmp_error


def guest_fixup_command(now: float, seed: bytes) -> str:
    """Shell command run in a restored guest: the host's clock, host randomness in the pool."""
    escaped = "".join(f"\\x{b:02x}" for b in seed)
    return f"date -s @{now:.3f} >/dev/null && printf '{escaped}' > /dev/urandom"
