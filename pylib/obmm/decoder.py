"""Decoder resolution: (exporter, UBA, length) -> the importer's local physical address.

On real UB hardware, management software programs the importer's UB memory
decoder so that a window of local physical addresses reaches the exporter's
memory; OBMM_CMD_IMPORT then takes that local address.  This module does that
step:

* `EmulatorDecoder` reads the testbed fabric's windows from
  `<fabric sysfs>/windows/<node>/{base,size}` and decodes the testbed's UBA (bit 48 set,
  exporter node in bits 40..47, exporter PA in bits 0..39; kmod/common/testbed_fabric.h).  The
  fabric sysfs is the emulated driver's `/sys/kernel/obmm_emu` or, under the real obmm.ko, its
  compat layer's `/sys/kernel/ub_compat` (`FABRIC_SYSFS`, first present).
* `CommandDecoder` runs a program the site provides (hardware): it gets the
  request in its environment and prints the local address.
* `TableDecoder` reads a JSON file of decoder windows the site provides.

`decoder_from_spec("emulator" | "cmd:PROGRAM ARGS" | "file:PATH")` picks one;
`default_decoder()` reads the spec from $OBMM_DECODER, else the emulator.  This node's own
identity (node number, CNA, EID) is :mod:`obmm.identity`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from obmm import envvars

EMU_SYSFS = "/sys/kernel/obmm_emu"
#: The real driver's compat layer (kmod/ub_compat) publishes the same fabric files here.
COMPAT_SYSFS = "/sys/kernel/ub_compat"
#: Where a testbed node finds its fabric (node id, CNA, EID, windows): the first present.
FABRIC_SYSFS = (EMU_SYSFS, COMPAT_SYSFS)

# The testbed's UBA encoding (kmod/common/testbed_fabric.h).
EMU_UBA_VALID = 1 << 48
#: Memory that is not one physical run on the exporter: no window reaches it in one piece.
EMU_UBA_SCATTERED = 1 << 49
EMU_UBA_NODE_SHIFT = 40
EMU_UBA_NODE_MASK = 0xFF << EMU_UBA_NODE_SHIFT
EMU_UBA_PA_MASK = (1 << 40) - 1


class DecoderError(Exception):
    """The decoder cannot reach the requested exporter memory from this node."""


class Decoder(Protocol):
    def resolve(self, exporter_node: int, uba: int, length: int) -> int:
        """Local physical address at which this node reaches [uba, uba + length)."""
        ...


@dataclass(frozen=True)
class Window:
    """`size` bytes of node `node`'s memory, starting at its address `remote_base`,
    appear at local physical address `base`."""

    node: int
    base: int
    size: int
    remote_base: int = 0

    def translate(self, remote: int, length: int) -> int | None:
        if self.remote_base <= remote and remote + length <= self.remote_base + self.size:
            return self.base + (remote - self.remote_base)
        return None


def read_sysfs_int(path: Path) -> int:
    """A sysfs attribute as an integer (decimal or 0x-hex); DecoderError naming the file."""
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError) as exc:
        raise DecoderError(f"cannot read {path}: {exc}") from exc


def fabric_sysfs() -> str:
    """The first of FABRIC_SYSFS that exists (the emulator's when none does, for messages)."""
    for root in FABRIC_SYSFS:
        if Path(root).is_dir():
            return root
    return EMU_SYSFS


def emulator_uba_split(uba: int) -> tuple[int, int]:
    """(exporter node, exporter PA) of a testbed UBA."""
    if uba & EMU_UBA_VALID and uba >> 49 == 1:
        raise DecoderError(
            f"UBA {uba:#x} is of memory that is not one physical run on the exporter "
            "(the testbed's UMMU maps exporter addresses 1:1, so no window reaches it in "
            "one piece): export it again, or on hardware"
        )
    if not uba & EMU_UBA_VALID or uba >> 49:
        raise DecoderError(f"UBA {uba:#x} is not an obmm_emu UBA (bit 48 set, bits 49+ clear)")
    return (uba & EMU_UBA_NODE_MASK) >> EMU_UBA_NODE_SHIFT, uba & EMU_UBA_PA_MASK


class EmulatorDecoder:
    """Windows of the testbed fabric, as the emulated obmm.ko (or ub_compat.ko) publishes them."""

    def __init__(self, sysfs: str | None = None) -> None:
        self.root = Path(sysfs or fabric_sysfs())

    def windows(self) -> list[Window]:
        wdir = self.root / "windows"
        if not wdir.is_dir():
            raise DecoderError(
                f"{wdir} does not exist: neither the emulated obmm.ko nor ub_compat.ko is loaded "
                f"(on real hardware set {envvars.DECODER.name}=cmd:... or file:...)"
            )
        found = []
        for entry in sorted(wdir.iterdir()):
            if (entry / "base").exists():
                # remote_base: the exporter's RAM base (arm64; absent before it was published).
                remote = entry / "remote_base"
                found.append(
                    Window(
                        node=read_sysfs_int(entry / "node"),
                        base=read_sysfs_int(entry / "base"),
                        size=read_sysfs_int(entry / "size"),
                        remote_base=read_sysfs_int(remote) if remote.exists() else 0,
                    )
                )
        return found

    def resolve(self, exporter_node: int, uba: int, length: int) -> int:
        node, pa = emulator_uba_split(uba)
        if node != exporter_node:
            raise DecoderError(f"UBA {uba:#x} belongs to node {node}, not node {exporter_node}")
        for window in self.windows():
            if window.node == node:
                local = window.translate(pa, length)
                if local is None:
                    raise DecoderError(
                        f"[{pa:#x}, {pa + length:#x}) of node {node} is outside its "
                        f"{window.size:#x}-byte window"
                    )
                return local
        raise DecoderError(f"this node has no decoder window onto node {node}")


class TableDecoder:
    """Windows from a JSON file: {"windows": [{"node", "base", "size", "remote_base"}]}.

    `remote_base` is the UBA the window starts at on the exporter; integers may be
    written as numbers or as strings such as "0x100000000".
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def windows(self) -> list[Window]:
        try:
            doc = json.loads(self.path.read_text())
            return [
                Window(
                    node=int(str(w["node"]), 0),
                    base=int(str(w["base"]), 0),
                    size=int(str(w["size"]), 0),
                    remote_base=int(str(w.get("remote_base", 0)), 0),
                )
                for w in doc["windows"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DecoderError(f"bad decoder table {self.path}: {exc!r}") from exc

    def resolve(self, exporter_node: int, uba: int, length: int) -> int:
        for window in self.windows():
            if window.node == exporter_node:
                local = window.translate(uba, length)
                if local is not None:
                    return local
        raise DecoderError(
            f"no window in {self.path} covers node {exporter_node} [{uba:#x}, {uba + length:#x})"
        )


class CommandDecoder:
    """Asks a site program: it gets OBMM_EXPORTER_NODE, OBMM_UBA and OBMM_LENGTH in its
    environment and prints the local physical address (decimal or 0x-hex) on stdout."""

    def __init__(self, command: str, timeout: float = 30.0) -> None:
        self.argv = shlex.split(command)
        self.timeout = timeout
        if not self.argv:
            raise DecoderError("empty decoder command")

    def resolve(self, exporter_node: int, uba: int, length: int) -> int:
        env: Mapping[str, str] = {
            **os.environ,
            envvars.EXPORTER_NODE.name: str(exporter_node),
            envvars.UBA.name: hex(uba),
            envvars.LENGTH.name: str(length),
        }
        try:
            out = subprocess.run(
                self.argv, env=env, capture_output=True, text=True, timeout=self.timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DecoderError(f"decoder command {self.argv[0]} failed: {exc}") from exc
        if out.returncode != 0:
            raise DecoderError(
                f"decoder command {self.argv[0]} exited {out.returncode}: {out.stderr.strip()}"
            )
        try:
            return int(out.stdout.strip(), 0)
        except ValueError as exc:
            raise DecoderError(
                f"decoder command {self.argv[0]} printed {out.stdout.strip()!r}, not an address"
            ) from exc


def decoder_from_spec(spec: str) -> Decoder:
    """`emulator[:SYSFS]`, `cmd:PROGRAM ARGS...` or `file:PATH`."""
    kind, _, arg = spec.partition(":")
    if kind == "emulator":
        return EmulatorDecoder(arg or None)
    if kind == "cmd":
        return CommandDecoder(arg)
    if kind == "file":
        return TableDecoder(arg)
    raise DecoderError(f"unknown decoder {spec!r}: use emulator, cmd:PROGRAM or file:PATH")


def default_decoder() -> Decoder:
    return decoder_from_spec(envvars.DECODER.get())
