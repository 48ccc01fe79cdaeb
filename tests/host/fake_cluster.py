"""Stand-ins shared by the cluster tests that boot no VM: a run root, a guest image, a QEMU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from obmm.testbed.builds.image import Image
from obmm.testbed.topology import Topology
from obmm.testbed.vm.cluster import Cluster
from obmm.testbed.vm.machine import Machine


def use_run_root(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the testbed's run root and cache below `base`; returns the run root."""
    root = base / "shm"
    monkeypatch.setenv("OBMM_TESTBED_RUN_ROOT", str(root))
    monkeypatch.setenv("OBMM_TESTBED_CACHE", str(base / "cache"))
    return root


def make_image(base: Path) -> Image:
    """A guest image that passes every check of Image.open but never boots."""
    d = base / "image"
    d.mkdir()
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", str(d / "disk.qcow2"), "16M"], check=True
    )
    (d / "vmlinuz").write_bytes(b"k")
    (d / "initrd.img").write_bytes(b"i")
    (d / "initrd-fast.img").write_bytes(b"f")
    manifest = {"kernel_release": "6.1.0-0-amd64", "ssh_key": str(d / "key"), "host_key": ""}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return Image.open(d)


def write_fake_qemu(base: Path) -> Path:
    """A stand-in QEMU binary in `base` that stays up and creates its QMP socket path, like the
    real one (the readiness checks are the tests' to stub), and answers ``--version`` (the
    snapshot key asks it; a stand-in that slept instead cost each start its 10 s bound)."""
    fake = base / "fake-qemu"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "QEMU emulator version 0.0 (stand-in)"; exit 0; }\n'
        'for a in "$@"; do case "$a" in unix:*) p="${a#unix:}"; : > "${p%%,*}";; esac; done\n'
        "exec sleep 600\n"
    )
    fake.chmod(0o755)
    return fake


def start_with(qemu_binary: str, image: Image, topology: Topology, **kwargs: Any) -> Cluster:
    """Cluster.start of `image` and `topology` with a stand-in QEMU binary (`init`, `accel`
    and `extra_args` go to the Machine, the rest to the start)."""
    spec = {k: kwargs.pop(k) for k in ("init", "accel", "extra_args") if k in kwargs}
    return Cluster.start(Machine(image, topology, qemu_binary=qemu_binary, **spec), **kwargs)
