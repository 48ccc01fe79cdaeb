"""The QEMU command line and topology (pure functions: no QEMU is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.testbed.paths import qemu_dir
from obmm.testbed.topology import Topology, TopologyError
from obmm.testbed.vm import qemu

RUN = Path("/dev/shm/obmm-testbed-t")


def _launch(index: int = 0, **kw: object) -> qemu.NodeLaunch:
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


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_node_ram_is_its_shared_file_on_the_run_dir() -> None:
    argv = qemu.build_argv(Topology(nodes=2), _launch(1))
    assert _pairs(argv, "-machine") == ["q35,memory-backend=ram"]
    # Cross-node atomics: multi-threaded TCG and a second possible CPU (parallel TCG).
    assert _pairs(argv, "-accel") == ["tcg,thread=multi"]
    assert _pairs(argv, "-smp") == ["1,maxcpus=2"]
    assert _pairs(argv, "-m") == ["1024M"]
    objects = _pairs(argv, "-object")
    assert f"memory-backend-file,id=ram,size=1024M,mem-path={RUN}/node1.ram,share=on" in objects


def test_every_node_maps_every_nodes_ram_as_a_window_plus_the_control_region() -> None:
    topo = Topology(nodes=3)
    argv = qemu.build_argv(topo, _launch(2))
    objects = _pairs(argv, "-object")
    devices = _pairs(argv, "-device")
    for j in range(3):
        assert (
            f"memory-backend-file,id=win{j},size=1024M,mem-path={RUN}/node{j}.ram,share=on"
            in objects
        )
        assert f"ivshmem-plain,memdev=win{j},master=on,bus=pcie.0,addr={0x10 + j:#04x}" in devices
    assert f"memory-backend-file,id=ctl,size=2M,mem-path={RUN}/control,share=on" in objects
    assert "ivshmem-plain,memdev=ctl,master=on,bus=pcie.0,addr=0x0f" in devices


def test_explicit_pci_slots_never_collide() -> None:
    argv = qemu.build_argv(Topology(nodes=8), _launch(0))
    slots = [d.split("addr=")[1] for d in _pairs(argv, "-device") if "addr=" in d]
    assert len(slots) == len(set(slots))
    assert "0x17" in slots  # window of node 7


def test_crash_handling_and_network_confinement() -> None:
    argv = qemu.build_argv(Topology(), _launch(0, ssh_port=41234))
    assert "-no-reboot" in argv
    cmdline = _pairs(argv, "-append")[0].split()
    assert "panic=-1" in cmdline
    # A WARN or oops is reported per test by the log scanner, not turned into a panic.
    assert not any(p.startswith(("oops=", "panic_on_warn")) for p in cmdline)
    netdev = _pairs(argv, "-netdev")[0]
    assert "restrict=on" in netdev
    assert "hostfwd=tcp:127.0.0.1:41234-:22" in netdev
    assert _pairs(argv, "-qmp") == [f"unix:{RUN}/node0.qmp,server=on,wait=off"]
    assert _pairs(argv, "-chardev") == ["file,id=console,path=/logs/node0.console.log"]


def test_mem_hides_the_pool_at_the_top_of_ram() -> None:
    topo = Topology(nodes=1, memory_mib=1024, pool_mib=256)
    assert "mem=768M" in qemu.kernel_cmdline(topo, 0).split()
    assert "hugepages=4" in qemu.kernel_cmdline(topo, 0).split()
    assert "cryptomgr.notests" in qemu.kernel_cmdline(topo, 0).split()  # boot time under TCG
    assert topo.pool_base == 768 << 20
    assert topo.pool_size == 256 << 20


def test_overlay_is_the_disk_and_kernel_is_booted_directly() -> None:
    argv = qemu.build_argv(Topology(), _launch(0))
    assert _pairs(argv, "-kernel") == ["/img/vmlinuz"]
    assert _pairs(argv, "-initrd") == ["/img/initrd.img"]
    assert any(f"file={RUN}/node0.qcow2," in d for d in _pairs(argv, "-drive"))


def test_extra_args_hook_is_appended_for_the_guest_network() -> None:
    extra = ("-netdev", "socket,id=fab,listen=127.0.0.1:5000")
    argv = qemu.build_argv(Topology(), _launch(0, extra_args=extra))
    assert argv[-2:] == list(extra)


def test_serial_tcg_is_the_former_argv_for_the_bench() -> None:
    argv = qemu.build_argv(Topology(cpus=2), _launch(0, accel=qemu.ACCEL_TCG_SERIAL))
    assert _pairs(argv, "-accel") == ["tcg"]
    assert _pairs(argv, "-smp") == ["2"]
    assert _pairs(argv, "-cpu") == [qemu.TCG_CPU]
    parallel = qemu.build_argv(Topology(cpus=2), _launch(0))
    assert _pairs(parallel, "-smp") == ["2,maxcpus=2"]


def test_kvm_uses_host_cpu() -> None:
    argv = qemu.build_argv(Topology(), _launch(0, accel="kvm"))
    assert _pairs(argv, "-machine") == ["q35,memory-backend=ram"]
    assert _pairs(argv, "-accel") == ["kvm"]
    assert _pairs(argv, "-cpu") == ["host"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "nodes must be 1..8"),
        ({"nodes": 9}, "nodes must be 1..8"),
        ({"memory_mib": 1536}, "power of two"),
        ({"memory_mib": 4096}, "memory_mib must be"),
        ({"pool_mib": 3}, "multiple of 2"),
        ({"memory_mib": 256, "pool_mib": 192}, "leaves the guest kernel"),
        ({"memory_mib": 2048, "pool_mib": 1026}, "RAM at 1022 MiB; memory_mib - pool_mib must"),
        ({"cpus": 0}, "cpus"),
    ],
)
def test_topology_rejects_what_the_fabric_cannot_express(
    kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(TopologyError, match=message):
        Topology(**kwargs)  # type: ignore[arg-type]


def test_node_index_outside_topology_is_refused() -> None:
    with pytest.raises(TopologyError):
        qemu.build_argv(Topology(nodes=2), _launch(2))


def test_shipped_topology_files_load() -> None:
    files = sorted((qemu_dir() / "topologies").glob("*.json"))
    assert {f.stem for f in files} >= {"single", "pair"}
    loaded = {f.stem: Topology.load(f) for f in files}
    assert loaded["single"].nodes == 1
    assert loaded["pair"].nodes == 2


def test_topology_file_with_unknown_key_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 2, "memroy_mib": 512}')
    with pytest.raises(TopologyError, match="memroy_mib"):
        Topology.load(bad)


def test_fast_init_is_tini_running_our_init_with_both_nics_on_the_command_line() -> None:
    topo = Topology(nodes=2)
    words = qemu.kernel_cmdline(topo, 1, ("extra=1",)).split()
    assert "init=/usr/bin/tini" in words
    # Everything after "--" is init's argv; the caller's extra words stay kernel parameters.
    assert words[-2:] == ["--", "/usr/local/sbin/obmm-init"]
    assert words.index("extra=1") < words.index("--")
    assert "obmm_testbed.hostname=node1" in words
    assert "obmm_testbed.net=0000:00:02.0,10.0.2.15/24" in words
    assert "obmm_testbed.fabric=52:54:00:4f:00:01,169.254.100.11/16" in words
    assert "obmm_testbed.modules=virtio_net,virtio_rng" in words
    assert not any(w.startswith("systemd.") and w != "systemd.show_status=0" for w in words)


def test_single_node_fast_init_has_no_fabric_nic() -> None:
    words = qemu.kernel_cmdline(Topology(nodes=1), 0).split()
    assert not any(w.startswith("obmm_testbed.fabric=") for w in words)


def test_systemd_init_boots_the_distribution_userland() -> None:
    words = qemu.kernel_cmdline(Topology(nodes=2), 0, init=qemu.INIT_SYSTEMD).split()
    assert "systemd.hostname=node0" in words
    assert "--" not in words
    assert not any(w.startswith(("init=", "obmm_testbed.", "obmm.")) for w in words)
    argv = qemu.build_argv(Topology(), _launch(0, init=qemu.INIT_SYSTEMD))
    assert "systemd.hostname=node0" in _pairs(argv, "-append")[0].split()


def test_unknown_init_mode_is_refused() -> None:
    with pytest.raises(TopologyError, match="init must be one of fast, systemd"):
        qemu.kernel_cmdline(Topology(), 0, init="upstart")


def test_firmware_is_passed_as_bios_only_when_set() -> None:
    argv = qemu.build_argv(Topology(), _launch(0, firmware="/usr/share/qemu/qboot.rom"))
    assert _pairs(argv, "-bios") == ["/usr/share/qemu/qboot.rom"]
    assert "-bios" not in qemu.build_argv(Topology(), _launch(0))
