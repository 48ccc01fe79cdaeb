"""A node's QEMU launch with placeholder paths, for the host tests that read its argv."""

from __future__ import annotations

from pathlib import Path

from obmm.testbed.vm import qemu

RUN = Path("/dev/shm/obmm-testbed-t")


def launch(index: int = 0, **kw: object) -> qemu.NodeLaunch:
    args: dict[str, object] = {
        "index": index,
        "ssh_port": 40022,
        "rundir": RUN,
        "overlay": RUN / f"node{index}.qcow2",
        "console_log": Path(f"/logs/node{index}.console.log"),
        "qmp_socket": RUN / f"node{index}.qmp",
        "pidfile": RUN / f"node{index}.pid",
        "kernel": Path("/img/vmlinuz"),
        "initrd": Path("/img/initrd.img"),
    }
    args.update(kw)
    return qemu.NodeLaunch(**args)  # type: ignore[arg-type]


def pairs(argv: list[str], flag: str) -> list[str]:
    """Every value given to `flag` in `argv`, in order."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]
