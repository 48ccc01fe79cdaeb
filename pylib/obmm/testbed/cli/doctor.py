"""`obmm-testbed doctor`: can this host run the testbed, and what to install or change if not.

One line per check, ``OK``, ``WARN`` (works, slower or later) or ``FAIL`` (will not work), with
what to do.  Exit status 0 unless a check failed.  Nothing is booted unless ``--probe`` asks for
the KVM probe (:func:`obmm.testbed.vm.accel.probe_kvm`, the one `up` runs; its verdict is cached).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from obmm.testbed.paths import cache_dir, qemu_dir, repo_root, results_dir, run_root
from obmm.testbed.topology import Topology
from obmm.testbed.vm import accel

OK, WARN, FAIL = "OK", "WARN", "FAIL"
#: What one QEMU process needs beside its guest RAM (code, TCG buffers, page tables).
QEMU_OVERHEAD_MIB = 300
CACHE_FREE_MIB = 3072  # an image build unpacks a Debian system and a kernel-headers package
DEFAULT_NODES = 2
QEMU_BINARY = "qemu-system-x86_64"  # the nodes' QEMU (cluster.py takes another from the env)
APT_QEMU = "apt-get install qemu-system-x86 qemu-utils"


@dataclass(frozen=True)
class Check:
    level: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.level:4} {self.what}: {self.detail}"


def _version(argv: list[str]) -> str | None:
    """First line of `argv --version`-style output, None if the program is missing."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "(no version output)"


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):.0f} MiB"


def check_qemu() -> Iterator[Check]:
    binary = QEMU_BINARY
    version = _version([binary, "--version"])
    if version is None:
        yield Check(FAIL, "qemu", f"{binary} not found; {APT_QEMU}")
    else:
        yield Check(OK, "qemu", f"{shutil.which(binary)}: {version}")
    img = _version(["qemu-img", "--version"])
    yield (
        Check(OK, "qemu-img", img)
        if img
        else Check(FAIL, "qemu-img", f"not found (node overlays need it); {APT_QEMU}")
    )


def cached_images(cache: Path) -> list[Path]:
    return sorted(p.parent for p in (cache / "images").glob("*/manifest.json"))


def check_mmdebstrap(cache: Path) -> Check:
    version = _version(["mmdebstrap", "--version"])
    if version is not None:
        return Check(OK, "mmdebstrap", version)
    images = cached_images(cache)
    if images:
        return Check(
            WARN,
            "mmdebstrap",
            f"not found; only needed to build an image and {len(images)} is cached "
            "(apt-get install mmdebstrap to rebuild)",
        )
    return Check(FAIL, "mmdebstrap", "not found and no image cached; apt-get install mmdebstrap")


def check_compiler() -> Iterator[Check]:
    cc = os.environ.get("CC") or "gcc"
    version = _version([cc, "--version"])
    yield (
        Check(OK, "compiler", f"{cc}: {version}")
        if version
        else Check(
            FAIL,
            "compiler",
            f"{cc} not found (modules are built on the host); apt-get install build-essential",
        )
    )
    make = _version(["make", "--version"])
    yield (
        Check(OK, "make", make)
        if make
        else Check(FAIL, "make", "not found; apt-get install build-essential")
    )


def check_kvm(cache: Path, *, probe: bool) -> Check:
    if not os.path.exists("/dev/kvm"):
        return Check(WARN, "kvm", "no /dev/kvm: nodes run under TCG (about 10x slower boots); "
                     "enable virtualisation (or nested virtualisation) for KVM")  # fmt: skip
    if not accel.kvm_usable():
        return Check(WARN, "kvm", "/dev/kvm is not read-writable by this user: TCG; "
                     "add yourself to group kvm (or run as root)")  # fmt: skip
    if accel.kvm_is_pvm():
        return Check(WARN, "kvm", f"{accel.PVM_REASON}: nodes run under TCG")
    images = cached_images(cache)
    if probe and images:
        ok = accel.probe_kvm(images[-1] / "vmlinuz")
        return Check(OK if ok else WARN, "kvm", "probe booted a guest: KVM" if ok
                     else "probe guest did not boot under KVM: TCG")  # fmt: skip
    try:
        verdict = json.loads((cache / "accel-probe.json").read_text())["accel"]
    except (OSError, ValueError, KeyError):
        return Check(OK, "kvm", "/dev/kvm usable; not probed yet (`up` probes once, or "
                     "doctor --probe)")  # fmt: skip
    if verdict == "kvm":
        return Check(OK, "kvm", "/dev/kvm usable and the last probe booted a guest: KVM")
    return Check(WARN, "kvm", "/dev/kvm exists but the last probe's guest did not boot under "
                 "it (nested virtualisation?): TCG; doctor --probe to try again")  # fmt: skip


def _meminfo(field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def cluster_need(nodes: int) -> tuple[int, int]:
    """(host RAM, run-root space) in bytes an N-node cluster of the pair topology needs."""
    from obmm.testbed.vm import qemu

    topo = Topology.load(qemu_dir() / "topologies" / "pair.json")
    ram_files = nodes * topo.memory_mib + qemu.CONTROL_SIZE_MIB
    return (ram_files + nodes * QEMU_OVERHEAD_MIB) << 20, ram_files << 20


def check_memory(nodes: int, available: Callable[[], int | None] | None = None) -> Check:
    need, _ = cluster_need(nodes)
    have = (available or (lambda: _meminfo("MemAvailable")))()
    if have is None:
        return Check(WARN, "memory", "cannot read /proc/meminfo")
    detail = f"{_mib(have)} available, a {nodes}-node cluster needs about {_mib(need)}"
    if have < need:
        return Check(FAIL, "memory", detail + "; free memory or use --memory with fewer MiB")
    return Check(OK, "memory", detail)


def check_run_root(nodes: int) -> Check:
    _, need = cluster_need(nodes)
    root = run_root()
    probe = root if root.exists() else root.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError as exc:
        return Check(FAIL, "run root", f"{root}: {exc}; set OBMM_TESTBED_RUN_ROOT to a tmpfs")
    detail = f"{root}: {_mib(free)} free, a {nodes}-node cluster's RAM files need {_mib(need)}"
    if free < need:
        return Check(FAIL, "run root", detail + "; enlarge it (mount -o remount,size=...) or "
                     "set OBMM_TESTBED_RUN_ROOT")  # fmt: skip
    return Check(OK, "run root", detail)


def _du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def check_cache() -> Iterator[Check]:
    cache = cache_dir()
    used = _du(cache) if cache.exists() else 0
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    images = cached_images(cache)
    detail = f"{cache}: {_mib(used)} used, {_mib(free)} free, {len(images)} image(s) cached"
    if free < CACHE_FREE_MIB << 20 and not images:
        yield Check(FAIL, "cache", detail + f"; an image build needs about {CACHE_FREE_MIB} MiB "
                    "(set OBMM_TESTBED_CACHE elsewhere)")  # fmt: skip
    else:
        yield Check(OK, "cache", detail)
    yield Check(OK, "results", str(results_dir()))
    root = repo_root()
    sources = all((root / p).exists() for p in ("kmod/obmm_emu", "qemu/topologies", "uapi"))
    yield Check(OK if sources else FAIL, "sources", f"{root}" if sources else
                f"{root} lacks kmod/, qemu/ or uapi/: reinstall the wheel")  # fmt: skip


def check_leftovers() -> Check:
    """What dead owners left (run directories, RAM files, scratch): removed, and said."""
    from obmm.testbed.vm.ownership import reap_scratch
    from obmm.testbed.vm.reaping import reap_dead_owners

    clusters = reap_dead_owners()
    scratch = reap_scratch()
    if not clusters and not scratch:
        return Check(OK, "leftovers", "nothing left behind by a dead owner")
    what = [f"cluster {n}" for n in clusters] + [str(p) for p in scratch]
    return Check(WARN, "leftovers", "removed what dead owners left: " + ", ".join(what))


def run_checks(*, nodes: int = DEFAULT_NODES, probe: bool = False) -> list[Check]:
    cache = cache_dir()
    checks = [check_leftovers(), *check_qemu(), check_mmdebstrap(cache), *check_compiler()]
    checks += [check_kvm(cache, probe=probe), check_memory(nodes), check_run_root(nodes)]
    checks += list(check_cache())
    return checks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="cluster size to size for")
    p.add_argument("--probe", action="store_true", help="boot the KVM probe guest (seconds)")


def command(args: argparse.Namespace) -> int:
    checks = run_checks(nodes=args.nodes, probe=args.probe)
    for c in checks:
        print(c.line())
    failed = [c for c in checks if c.level == FAIL]
    print(f"{len(checks)} checks: {len(failed)} failed" if failed else f"{len(checks)} checks: ok")
    return 1 if failed else 0
