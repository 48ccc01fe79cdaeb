"""The shape of a cluster (:class:`Topology`: nodes, memory, pool, CPUs) and the limits of the
fabric convention it must fit (:mod:`obmm.testbed.vm.qemu` turns it into command lines).

A leaf of the spine: the settings, the builds, the machines and the bring-up all read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obmm.testbed.errors import TestbedError

# The fabric's node numbers (and the inter-node network's addresses) go up to this.
MAX_NODES = 8
# q35 keeps guest RAM below 4 GiB contiguous only up to 2 GiB (above that QEMU splits it
# around the PCI hole), and the pool must sit at a fixed physical offset.
MAX_MEMORY_MIB = 2048
MIN_MEMORY_MIB = 256
GRANULE_MIB = 2
RAM_END_ALIGN_MIB = 64
# Loaded by the fast init before sshd: the NICs and the entropy source sshd draws from.  An
# image may ask for others (Image.fast_init_modules).
FAST_INIT_MODULES = ("virtio_net", "virtio_rng")
# QEMU's CPU model under TCG (an image may ask for another: Image.tcg_cpu).
TCG_CPU = "max"


class TopologyError(TestbedError, ValueError):
    """A topology that the fabric convention cannot express."""


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class Topology:
    """Shape of a cluster: how many nodes, and how each node's memory is split."""

    nodes: int = 1
    memory_mib: int = 1024
    pool_mib: int = 256
    cpus: int = 1
    description: str = ""
    #: Guest-physical address of the node's RAM (obmm.testbed.arch: 0 on x86, arm64's virt
    #: machine puts it at 1 GiB); offset 0 of the RAM file and of every window onto it.
    ram_base: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise TopologyError(f"nodes must be 1..{MAX_NODES}, got {self.nodes}")
        if not _is_power_of_two(self.memory_mib):
            # The RAM file doubles as an ivshmem BAR, and BAR sizes are powers of two.
            raise TopologyError(f"memory_mib must be a power of two, got {self.memory_mib}")
        if not MIN_MEMORY_MIB <= self.memory_mib <= MAX_MEMORY_MIB:
            raise TopologyError(
                f"memory_mib must be {MIN_MEMORY_MIB}..{MAX_MEMORY_MIB}, got {self.memory_mib}"
            )
        if self.pool_mib <= 0 or self.pool_mib % GRANULE_MIB:
            raise TopologyError(
                f"pool_mib must be a positive multiple of {GRANULE_MIB}, got {self.pool_mib}"
            )
        if self.memory_mib - self.pool_mib < MIN_MEMORY_MIB // 2:
            raise TopologyError(
                f"pool_mib {self.pool_mib} leaves the guest kernel under "
                f"{MIN_MEMORY_MIB // 2} MiB of {self.memory_mib} MiB"
            )
        if self.kernel_mem_mib % RAM_END_ALIGN_MIB:
            # x86 marks the rest of RAM's last 64 MiB as "RAM buffer" in /proc/iomem, and
            # obmm_emu cannot claim a pool that starts inside it.
            raise TopologyError(
                f"pool_mib {self.pool_mib} ends the guest kernel's RAM at "
                f"{self.kernel_mem_mib} MiB; memory_mib - pool_mib must be a multiple of "
                f"{RAM_END_ALIGN_MIB} MiB"
            )
        if self.cpus < 1:
            raise TopologyError(f"cpus must be >= 1, got {self.cpus}")

    @property
    def kernel_mem_mib(self) -> int:
        """RAM the guest kernel may use (`mem=`); the pool starts right above it."""
        return self.memory_mib - self.pool_mib

    @property
    def pool_base(self) -> int:
        """Guest-physical byte address of the export pool."""
        return self.ram_base + (self.kernel_mem_mib << 20)

    @property
    def pool_size(self) -> int:
        return self.pool_mib << 20

    def with_nodes(self, nodes: int) -> Topology:
        return Topology(
            nodes=nodes,
            memory_mib=self.memory_mib,
            pool_mib=self.pool_mib,
            cpus=self.cpus,
            description=self.description,
            ram_base=self.ram_base,
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Topology:
        known = {"nodes", "memory_mib", "pool_mib", "cpus", "description", "ram_base"}
        unknown = set(data) - known
        if unknown:
            raise TopologyError(f"unknown topology keys: {sorted(unknown)}")
        return cls(**dict(data))

    @classmethod
    def load(cls, path: Path) -> Topology:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TopologyError(f"cannot read topology {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise TopologyError(f"topology {path} is not a JSON object")
        return cls.from_mapping(data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "memory_mib": self.memory_mib,
            "pool_mib": self.pool_mib,
            "cpus": self.cpus,
            "description": self.description,
            # Only where it is not 0: an x86 cluster's state and snapshot keys stay as they were.
            **({"ram_base": self.ram_base} if self.ram_base else {}),
        }
