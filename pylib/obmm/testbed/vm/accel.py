"""Choose the QEMU accelerator: KVM only when a guest is proven to boot under it, else TCG.

`/dev/kvm` existing is not enough: under nested virtualisation a guest can stall right after the
kernel decompressor.  And a /dev/kvm served by PVM (the `kvm_pvm` module: KVM without VMX/SVM,
guest and host switched through page tables) runs only kernels built as PVM guests
(CONFIG_PVM_GUEST, an out-of-tree series, github.com/virt-pvm/linux); Debian's kernel stops in
its real-mode setup there, so such a host is TCG without a probe.

The probe boots the image's kernel with no root device; a working accelerator gets it to
"Kernel panic - not syncing: VFS" and (with `panic=-1 -no-reboot`) QEMU exits in a second or two.
The verdict is cached per host boot and QEMU binary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: tcg-serial (one TCG thread, obmm.testbed.vm.qemu.ACCEL_TCG_SERIAL) only for the bench's cost of
#: parallel TCG; not a setting's choice.
ACCELS = ("auto", "kvm", "tcg", "tcg-serial")
PROBE_TIMEOUT_S = 20.0


#: Where the loaded KVM backends show (a module built in shows there too).
SYS_MODULE = Path("/sys/module")
PVM_REASON = (
    "/dev/kvm is PVM (module kvm_pvm), which boots only kernels built as PVM guests "
    "(CONFIG_PVM_GUEST); the image's Debian kernel is not one"
)


def kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def kvm_is_pvm(sys_module: Path | None = None) -> bool:
    """True when /dev/kvm is served by PVM alone (no kvm_intel / kvm_amd beside it)."""
    sys_module = SYS_MODULE if sys_module is None else sys_module
    if not (sys_module / "kvm_pvm").exists():
        return False
    return not any((sys_module / hw).exists() for hw in ("kvm_intel", "kvm_amd"))


def probe_argv(qemu: str, kernel: Path, console: Path) -> list[str]:
    return [
        qemu,
        "-machine",
        "q35,accel=kvm",
        "-cpu",
        "host",
        "-m",
        "256M",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-append",
        "console=ttyS0 panic=-1 root=/dev/obmm-probe-none",
        "-serial",
        f"file:{console}",
    ]


def probe_kvm(
    kernel: Path, qemu: str = "qemu-system-x86_64", timeout: float = PROBE_TIMEOUT_S
) -> bool:
    """Boot `kernel` under KVM; True only if it reached a kernel panic and QEMU exited."""
    with tempfile.TemporaryDirectory(prefix="obmm-kvm-probe-") as tmp:
        console = Path(tmp) / "console"
        proc = subprocess.Popen(
            probe_argv(qemu, kernel, console),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.info("KVM probe: guest did not finish booting in %.0f s; KVM unusable", timeout)
            return False
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = console.read_text(errors="replace") if console.exists() else ""
        ok = "Kernel panic" in text and "Linux version" in text
        log.info(
            "KVM probe: QEMU exit %s, kernel %s",
            proc.returncode,
            "booted" if ok else "did not boot",
        )
        return ok


def _cache_key(kernel: Path, qemu: str) -> str:
    boot_id = ""
    with contextlib.suppress(OSError):
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    qemu_path = subprocess.run(
        ["sh", "-c", f"command -v {qemu}"], capture_output=True, text=True
    ).stdout.strip()
    mtime = 0.0
    with contextlib.suppress(OSError):
        mtime = os.stat(qemu_path).st_mtime
    return f"{boot_id}|{qemu_path}|{mtime}|{kernel.resolve()}"


def choose(
    requested: str | None, kernel: Path, cache: Path, qemu: str = "qemu-system-x86_64"
) -> str:
    """The accelerator to use: `requested` unless it is 'auto' (the settings' accel)."""
    want = requested or "auto"
    if want not in ACCELS:
        raise ValueError(f"accelerator must be one of {ACCELS}, got {want!r}")
    if want == "kvm" and kvm_is_pvm():
        log.warning("accelerator: kvm as asked, but %s: the guest will likely hang", PVM_REASON)
    if want != "auto":
        return want
    if not kvm_usable():
        log.info("accelerator: tcg (/dev/kvm not usable)")
        return "tcg"
    if kvm_is_pvm():
        log.info("accelerator: tcg (%s)", PVM_REASON)
        return "tcg"
    verdict_file = cache / "accel-probe.json"
    key = _cache_key(kernel, qemu)
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(verdict_file.read_text())
        if cached.get("key") == key:
            accel = str(cached["accel"])
            log.info("accelerator: %s (cached probe verdict)", accel)
            return accel
    start = time.monotonic()
    accel = "kvm" if probe_kvm(kernel, qemu) else "tcg"
    log.info("accelerator: %s (probe took %.1f s)", accel, time.monotonic() - start)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = verdict_file.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "accel": accel}) + "\n")
    os.replace(tmp, verdict_file)
    return accel
