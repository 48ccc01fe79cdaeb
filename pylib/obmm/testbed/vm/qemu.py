"""Topology of an emulated UB fabric and the QEMU command line of one node.

Everything here is pure: the argv builder takes paths and ports and returns a list, so it has
golden tests and the exact command can be logged and pasted by hand.

The fabric convention (the emulated driver's obmm.ko depends on it; see docs/testbed.md,
'The emulated fabric'):
node i's RAM is the shared file `<rundir>/node<i>.ram`; every node maps every node's RAM file
(its own included) as an ivshmem-plain BAR at PCI slot 0x10+j, and the 2 MiB control region
`<rundir>/control` at slot 0x0f.  The top `pool_mib` of each node's RAM is hidden from the guest
kernel with `mem=` and is the pool exports are carved from.  A cluster of 2+ nodes also gets an
inter-node guest NIC (slot 0x04) whose frames go over unix datagram sockets to the host-side hub
(`obmm.testbed.vm.hub`); node i's guest address is the link-local 169.254.100.(10+i)/16.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from obmm.testbed.arch import X86_64, Arch
from obmm.testbed.topology import FAST_INIT_MODULES, TCG_CPU, Topology, TopologyError
from obmm.testbed.vm import numa

CONTROL_SIZE_MIB = 2
CONTROL_SLOT = 0x0F
WINDOW_SLOT_BASE = 0x10
NET_SLOT = 0x02
DISK_SLOT = 0x03
# The inter-node guest network: a second NIC at this slot (multi-node clusters only).
EXTRA_NIC_SLOT = 0x04
RNG_SLOT = 0x05
# Inter-node guest network: node i is FABRIC_NET_PREFIX.(FABRIC_NET_HOST_BASE + i)/16 on the NIC
# with MAC FABRIC_MAC_PREFIX:<i>; link-local, so nothing outside the cluster is ever addressed.
FABRIC_NET_PREFIX = "169.254.100"
FABRIC_NET_HOST_BASE = 10
FABRIC_NET_PREFIXLEN = 16
FABRIC_MAC_PREFIX = "52:54:00:4f:00"
# sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_PATH = 107
# How a node's userland starts.  "fast": tini as PID 1 runs our own small init
# (qemu/debian/obmm-init: mounts, both NICs from the command line, sshd); "systemd": the
# distribution's boot, for runs that want a real-host-like userland.
INIT_FAST = "fast"
INIT_SYSTEMD = "systemd"
INIT_MODES = (INIT_FAST, INIT_SYSTEMD)
FAST_INIT_ARGV = ("/usr/bin/tini", "/usr/local/sbin/obmm-init")
# User-mode networking's fixed guest address (QEMU's default net 10.0.2.0/24, host 10.0.2.2).
SSH_NIC_ADDR = "10.0.2.15/24"
# The fast boot's firmware on x86 (obmm.testbed.arch): qboot initialises PCI and jumps to the
# kernel in a fraction of SeaBIOS's time under TCG; the systemd boot keeps SeaBIOS.
QBOOT = X86_64.fast_firmware


@dataclass(frozen=True)
class NodeLaunch:
    """Everything that differs between the nodes of one cluster."""

    index: int
    ssh_port: int
    rundir: Path
    overlay: Path
    console_log: Path
    qmp_socket: Path
    pidfile: Path
    kernel: Path
    initrd: Path
    accel: str = "tcg"
    qemu_binary: str = "qemu-system-x86_64"
    init: str = INIT_FAST
    # Firmware image for -bios (None: QEMU's default, SeaBIOS).
    firmware: str | None = None
    # Hook for debugging and experiments: appended verbatim.
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    extra_cmdline: tuple[str, ...] = field(default_factory=tuple)
    # -cpu under TCG (under KVM: host)
    tcg_cpu: str = TCG_CPU
    # What the fast init loads before sshd: none for a kernel with them built in.
    fast_init_modules: tuple[str, ...] = FAST_INIT_MODULES
    # The guest architecture (machine, console, NUMA tables): the image's.
    arch: Arch = X86_64


def fabric_ip(index: int) -> str:
    """Node `index`'s address on the inter-node guest network (link-local)."""
    return f"{FABRIC_NET_PREFIX}.{FABRIC_NET_HOST_BASE + index}"


def fabric_mac(index: int) -> str:
    return f"{FABRIC_MAC_PREFIX}:{index:02x}"


def fabric_net_command(index: int) -> str:
    """Guest shell command that brings up node `index`'s inter-node NIC (found by its MAC)."""
    mac = fabric_mac(index)
    addr = f"{fabric_ip(index)}/{FABRIC_NET_PREFIXLEN}"
    return (
        "IF=; for d in /sys/class/net/*; do "
        f'[ "$(cat "$d/address" 2>/dev/null)" = {mac} ] && IF="${{d##*/}}"; done; '
        f'[ -n "$IF" ] || {{ echo "no NIC with MAC {mac}" >&2; exit 1; }}; '
        f'ip link set dev "$IF" up && ip addr replace {addr} dev "$IF" && echo "$IF"'
    )


def hub_socket(rundir: Path) -> Path:
    return rundir / "hub.sock"


def net_socket(rundir: Path, index: int) -> Path:
    return rundir / f"node{index}.net"


def ram_file(rundir: Path, index: int) -> Path:
    return rundir / f"node{index}.ram"


def control_file(rundir: Path) -> Path:
    return rundir / "control"


BOOT_HUGEPAGES = 4  # 2 MiB each


def kernel_cmdline(
    topology: Topology,
    index: int,
    extra: Sequence[str] = (),
    init: str = INIT_FAST,
    modules: Sequence[str] = FAST_INIT_MODULES,
    arch: Arch = X86_64,
) -> str:
    """The guest kernel command line.

    `panic=-1` reboots at once on panic, and with QEMU's `-no-reboot` that makes QEMU exit, so a
    dead kernel is seen by the host within a second.  Oops and WARN do not panic: they are
    reported per test by the guest log scanner.  With the fast init, the `obmm.*` parameters
    tell qemu/debian/obmm-init the host name and both NICs' addresses, so no SSH round trip
    configures them.
    """
    if init not in INIT_MODES:
        raise TopologyError(f"init must be one of {', '.join(INIT_MODES)}, got {init!r}")
    parts = [
        f"console={arch.console}",
        "root=/dev/vda",
        "rw",
        "panic=-1",
        f"mem={topology.kernel_mem_mib}M",
        # Borrowed (NUMA_REMOTE) memory is onlined by the kernel as it is hot-added, into
        # ZONE_MOVABLE so that no kernel allocation can keep UNIMPORT from removing it.
        "memhp_default_state=online_movable",
        # EXPORT_PID tests pin hugetlbfs pages; reserved at boot, before memory fragments.
        f"hugepages={BOOT_HUGEPAGES}",
        "loglevel=7",
        "printk.devkmsg=on",
        # The guest has no use for these and they cost seconds of TCG boot time.
        "nokaslr",
        "mitigations=off",
        "audit=0",
        # The crypto API's self-tests of every algorithm it registers (crypto_algapi_init):
        # the longest initcall of a TCG boot; they check the kernel's own implementations.
        "cryptomgr.notests",
        # The architecture's own (x86: no TSC watchdog; obmm.testbed.arch).
        *arch.cmdline,
        "net.ifnames=0",
        "systemd.show_status=0",
        # A stalled CPU or hung task is a kernel death too: end the VM instead of hanging.
        "softlockup_panic=1",
        "hung_task_panic=1",
    ]
    if init == INIT_SYSTEMD:
        parts.append(f"systemd.hostname=node{index}")
    else:
        parts += [
            f"init={FAST_INIT_ARGV[0]}",
            f"obmm_testbed.hostname=node{index}",
            f"obmm_testbed.net=0000:00:{NET_SLOT:02x}.0,{SSH_NIC_ADDR}",
        ]
        if modules:
            parts.append("obmm_testbed.modules=" + ",".join(modules))
        if topology.nodes > 1:
            parts.append(
                f"obmm_testbed.fabric={fabric_mac(index)},{fabric_ip(index)}/{FABRIC_NET_PREFIXLEN}"
            )
    parts.extend(extra)
    if init == INIT_FAST:
        # Everything after "--" is init's argv: tini runs our init as its child.
        parts += ["--", *FAST_INIT_ARGV[1:]]
    return " ".join(parts)


#: TCG translates a guest's atomic instructions (lock-prefixed RMW, cmpxchg) into host atomics
#: only for a vCPU it runs "parallel": multi-threaded TCG in a machine with more than one
#: possible CPU (QEMU's tcg_cpu_init_cflags(cpu, max_cpus > 1)).  Otherwise they are plain
#: read-modify-writes, safe inside one QEMU but not against another node's QEMU sharing the
#: RAM file: fetch-and-adds from two 1-vCPU nodes lost increments.  So every node may have a
#: second CPU (never plugged) and TCG runs multi-threaded.
TCG_ACCEL = "tcg,thread=multi"
TCG_PARALLEL_MAXCPUS = 2
#: The accelerator name of TCG as the testbed ran it before (QEMU's default threading, no
#: second possible CPU: not parallel, cross-node atomics not atomic).  Only `make bench` uses it,
#: to measure what parallel TCG costs.
ACCEL_TCG_SERIAL = "tcg-serial"


def _accel_args(accel: str, cpus: int) -> tuple[str, str, str]:
    """(-accel, -cpu kind, -smp) for an accelerator name."""
    if accel == "tcg":
        return TCG_ACCEL, "tcg", f"{cpus},maxcpus={max(cpus, TCG_PARALLEL_MAXCPUS)}"
    if accel == ACCEL_TCG_SERIAL:
        return "tcg", "tcg", str(cpus)
    return accel, "host", str(cpus)


def _machine_args(topology: Topology, node: NodeLaunch, machine: str) -> tuple[list[str], str, str]:
    """The argv head build_argv and dtb_dump_argv share (-machine, -accel, -cpu, -smp, -m), and
    the -m and -smp values the rest of each needs: the dumped tree must be the booted one's."""
    mem = f"{topology.memory_mib}M"
    accel, cpu, smp = _accel_args(node.accel, topology.cpus)
    cpu_model = node.tcg_cpu if cpu == "tcg" else cpu
    head = ["-machine", machine, "-accel", accel, "-cpu", cpu_model, "-smp", smp, "-m", mem]
    return head, mem, smp


def build_argv(topology: Topology, node: NodeLaunch) -> list[str]:
    """QEMU argv for node `node.index` of a cluster shaped like `topology`."""
    if not 0 <= node.index < topology.nodes:
        raise TopologyError(f"node index {node.index} outside 0..{topology.nodes - 1}")
    machine, mem, smp = _machine_args(topology, node, numa.machine_arg(node.arch))
    argv = [
        node.qemu_binary,
        "-name",
        f"obmm-node{node.index},debug-threads=on",
        *machine,
        "-object",
        f"memory-backend-file,id=ram,size={mem},mem-path={ram_file(node.rundir, node.index)},"
        "share=on",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        # The spare remote NUMA nodes borrowing hot-adds to (obmm.testbed.vm.numa).
        *numa.qemu_args(node.arch, node.rundir, smp),
        *(["-bios", node.firmware] if node.firmware else []),
        "-kernel",
        str(node.kernel),
        "-initrd",
        str(node.initrd),
        "-append",
        kernel_cmdline(
            topology,
            node.index,
            node.extra_cmdline,
            node.init,
            node.fast_init_modules,
            node.arch,
        ),
        "-chardev",
        f"file,id=console,path={node.console_log}",
        "-serial",
        "chardev:console",
        "-qmp",
        f"unix:{node.qmp_socket},server=on,wait=off",
        "-pidfile",
        str(node.pidfile),
        "-drive",
        f"file={node.overlay},if=none,id=disk,format=qcow2,cache=unsafe,discard=unmap",
        "-device",
        f"virtio-blk-pci,drive=disk,bus=pcie.0,addr={DISK_SLOT:#04x}",
        # restrict=on: the guest reaches nothing but the host forward on loopback.
        "-netdev",
        f"user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:{node.ssh_port}-:22",
        "-device",
        f"virtio-net-pci,netdev=net0,bus=pcie.0,addr={NET_SLOT:#04x}",
        "-device",
        f"virtio-rng-pci,bus=pcie.0,addr={RNG_SLOT:#04x}",
        "-object",
        f"memory-backend-file,id=ctl,size={CONTROL_SIZE_MIB}M,"
        f"mem-path={control_file(node.rundir)},share=on",
        "-device",
        # master=on: without it ivshmem blocks migration, and snapshots are migrations.
        f"ivshmem-plain,memdev=ctl,master=on,bus=pcie.0,addr={CONTROL_SLOT:#04x}",
    ]
    for j in range(topology.nodes):
        argv += [
            "-object",
            f"memory-backend-file,id=win{j},size={mem},mem-path={ram_file(node.rundir, j)},"
            "share=on",
            "-device",
            f"ivshmem-plain,memdev=win{j},master=on,bus=pcie.0,addr={WINDOW_SLOT_BASE + j:#04x}",
        ]
    if topology.nodes > 1:
        # Frames go to the host-side hub (obmm.testbed.vm.hub) over unix datagram sockets.
        argv += [
            "-netdev",
            f"dgram,id=fabric,local.type=unix,local.path={net_socket(node.rundir, node.index)},"
            f"remote.type=unix,remote.path={hub_socket(node.rundir)}",
            "-device",
            f"virtio-net-pci,netdev=fabric,mac={fabric_mac(node.index)},bus=pcie.0,"
            f"addr={EXTRA_NIC_SLOT:#04x}",
        ]
    argv += list(node.extra_args)
    return argv


def dtb_dump_argv(topology: Topology, node: NodeLaunch, out: Path) -> list[str]:
    """The QEMU command that writes node `node`'s machine device tree to `out` and exits
    (obmm.testbed.vm.numa adds the remote NUMA nodes to it): the machine, CPU model, CPUs, RAM
    and NUMA options of build_argv, none of its files or devices (the tree of `virt` does
    not depend on them)."""
    machine, mem, smp = _machine_args(
        topology, node, f"{numa.machine_arg(node.arch)},dumpdtb={out}"
    )
    numa_args = numa.qemu_args(node.arch, node.rundir, smp)[:2]  # -numa, without -dtb
    return [
        node.qemu_binary,
        *machine,
        "-object",
        f"memory-backend-ram,id=ram,size={mem}",
        *numa_args,
        "-nodefaults",
        "-display",
        "none",
    ]
