"""What every node of a cluster is: the one machine-spec object :meth:`Cluster.start` takes.

The image (and through it the guest architecture and kernel), the cluster's shape, the
accelerator, the init, the QEMU binary and any per-node QEMU arguments: everything that decides
what boots, as opposed to how a start goes (name, log directory, waiting, snapshots), which are
the start's own arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from obmm import envvars
from obmm.testbed.builds.image import Image
from obmm.testbed.topology import Topology
from obmm.testbed.vm import qemu


@dataclass(frozen=True)
class Machine:
    image: Image
    topology: Topology
    accel: str = "tcg"
    init: str = qemu.INIT_FAST
    #: "" (the default): the image's architecture's QEMU (obmm.testbed.arch).
    qemu_binary: str = envvars.QEMU.default
    #: Further QEMU arguments of node i (part of the snapshot key).
    extra_args: Callable[[int], Sequence[str]] | None = None

    @property
    def binary(self) -> str:
        return self.qemu_binary or self.image.arch.qemu_binary
