"""The guest architecture table and what reads it: the arm64 node's command line, its NUMA
device tree, the image's key (pure, but for one test that has QEMU dump a device tree)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from qemu_launch import RUN, pairs
from qemu_launch import launch as node_launch

from obmm.testbed import arch
from obmm.testbed.builds import image
from obmm.testbed.settings import Settings, SettingsError
from obmm.testbed.topology import Topology
from obmm.testbed.vm import numa, qemu


def test_the_table_is_found_by_every_spelling_and_refuses_others() -> None:
    assert arch.get(None) is arch.X86_64
    assert arch.get("arm64") is arch.get("aarch64") is arch.ARM64
    assert arch.get("amd64") is arch.get("x86_64") is arch.X86_64
    with pytest.raises(arch.ArchError, match="expected one of x86_64, arm64"):
        arch.get("riscv64")


def test_the_setting_defaults_to_x86_and_picks_the_architectures_qemu() -> None:
    assert Settings().arch == "x86_64"
    assert Settings().qemu_binary == "qemu-system-x86_64"
    assert Settings(arch="arm64").qemu_binary == "qemu-system-aarch64"
    assert Settings(arch="arm64", qemu="/opt/q").qemu_binary == "/opt/q"
    assert Settings.from_env({"OBMM_TESTBED_ARCH": "arm64"}).arch == "arm64"
    with pytest.raises(SettingsError, match="--arch"):
        Settings(arch="mips")


def test_an_arm64_node_is_a_virt_machine_with_a_kunpeng_like_cpu_and_a_numa_tree() -> None:
    launch = node_launch(
        1, arch=arch.ARM64, qemu_binary="qemu-system-aarch64", tcg_cpu="neoverse-n1"
    )
    argv = qemu.build_argv(Topology(nodes=2), launch)
    assert argv[0] == "qemu-system-aarch64"
    assert pairs(argv, "-machine") == ["virt,gic-version=3"]
    assert pairs(argv, "-cpu") == ["neoverse-n1"]
    # RAM and CPUs in NUMA node 0 (numa-node-id in the tree), the remote nodes in our tree.
    assert pairs(argv, "-numa") == ["node,nodeid=0,cpus=0-1,memdev=ram"]
    assert pairs(argv, "-dtb") == [str(RUN / "numa-v1.dtb")]
    assert "-acpitable" not in argv and "-bios" not in argv
    cmdline = pairs(argv, "-append")[0].split()
    assert cmdline[0] == "console=ttyAMA0" and "tsc=reliable" not in cmdline
    # The fabric is the same: windows and control region on the PCIe root bus.
    devices = pairs(argv, "-device")
    assert "ivshmem-plain,memdev=win0,master=on,bus=pcie.0,addr=0x10" in devices
    assert "ivshmem-plain,memdev=ctl,master=on,bus=pcie.0,addr=0x0f" in devices


def test_an_x86_node_keeps_its_command_line() -> None:
    argv = qemu.build_argv(Topology(nodes=2), node_launch(0))
    assert pairs(argv, "-machine") == ["q35,memory-backend=ram"]
    assert "-numa" not in argv and "-dtb" not in argv
    cmdline = pairs(argv, "-append")[0].split()
    assert cmdline[0] == "console=ttyS0,115200" and "tsc=reliable" in cmdline


def test_the_dtb_dump_has_the_nodes_machine_and_numa_but_no_files() -> None:
    launch = node_launch(
        0, arch=arch.ARM64, qemu_binary="qemu-system-aarch64", tcg_cpu="neoverse-n1"
    )
    argv = qemu.dtb_dump_argv(Topology(nodes=2), launch, Path("/t/m.dtb"))
    assert pairs(argv, "-machine") == ["virt,gic-version=3,dumpdtb=/t/m.dtb"]
    assert pairs(argv, "-numa") == ["node,nodeid=0,cpus=0-1,memdev=ram"]
    assert "-dtb" not in argv and "-kernel" not in argv and "-device" not in argv


def test_the_tree_declares_each_remote_node_empty_with_the_slit_distances() -> None:
    text = numa.dts_additions(2)
    assert text.count('device_type = "memory";') == 2
    assert "reg = <0x0 0x2 0x0 0x0>;" in text and "numa-node-id = <0x2>;" in text
    assert "<0 0 10>, <0 1 100>, <0 2 100>, <1 0 100>, <1 1 10>, <1 2 255>" in text
    dts = "/ {\n\tchosen {\n\t\trng-seed = <0x1>;\n\t\tkaslr-seed = <0x2>;\n\t};\n};\n"
    patched = numa.patch_dts(dts, 1)
    assert "seed" not in patched and "obmm-remote-numa@1" in patched


@pytest.mark.skipif(
    not (shutil.which("qemu-system-aarch64") and shutil.which("dtc")),
    reason="qemu-system-arm or device-tree-compiler not installed (make setup)",
)
def test_qemus_tree_takes_the_remote_nodes(tmp_path: Path) -> None:
    topo = Topology(nodes=2)
    launch = node_launch(
        0,
        rundir=tmp_path,
        arch=arch.ARM64,
        qemu_binary="qemu-system-aarch64",
        tcg_cpu="neoverse-n1",
    )
    numa.write_tables(
        tmp_path, arch.ARM64, topo, dump_argv=lambda out: qemu.dtb_dump_argv(topo, launch, out)
    )
    dts = subprocess.run(
        ["dtc", "-q", "-I", "dtb", "-O", "dts", str(numa.dtb_path(tmp_path))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert dts.count("numa-node-id") == 2 + 4  # RAM, CPU 0; remote nodes 1..4
    assert 'compatible = "numa-distance-map-v1";' in dts
    assert "seed" not in dts
    assert [p.name for p in tmp_path.iterdir()] == ["numa-v1.dtb"]


def test_an_arm64_image_has_its_own_key_and_an_x86_one_keeps_its(tmp_path: Path) -> None:
    recipe = image.find_recipe()
    x86 = recipe.fingerprint(kernel_release="6.1.0-1-amd64", authorized_key="k")
    assert (
        recipe.fingerprint(kernel_release="6.1.0-1-amd64", authorized_key="k", arch="x86_64") == x86
    )
    assert (
        recipe.fingerprint(kernel_release="6.1.0-1-amd64", authorized_key="k", arch="arm64") != x86
    )
    d = image.image_dir_for(recipe, tmp_path, "6.1.0-1-arm64", "k", arch.ARM64)
    assert d.name.startswith("debian-bookworm-arm64-")


def test_an_arm64_image_is_bootstrapped_foreign() -> None:
    recipe = image.find_recipe()
    argv = image.mmdebstrap_argv(recipe, Path("/r"), "6.1.0-1-arm64", arch.ARM64)
    assert "--architectures=arm64" in argv
    assert "--include=linux-image-6.1.0-1-arm64," in " ".join(argv)
    assert not any(
        a.startswith("--architectures") for a in image.mmdebstrap_argv(recipe, Path("/r"), "r")
    )


def test_a_missing_binfmt_entry_is_named(tmp_path: Path) -> None:
    assert not image.binfmt_enabled("qemu-aarch64", tmp_path)
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /x\n")
    assert image.binfmt_enabled("qemu-aarch64", tmp_path)
    (tmp_path / "qemu-aarch64").write_text("disabled\n")
    assert not image.binfmt_enabled("qemu-aarch64", tmp_path)


def test_an_arm64_pool_sits_above_the_machines_ram_base() -> None:
    x86 = Topology(nodes=2)
    arm = Topology(nodes=2, ram_base=arch.ARM64.ram_base)
    assert arm.pool_base == x86.pool_base + 0x4000_0000
    assert "ram_base" not in x86.to_dict()  # x86 states and snapshot keys as they were
    assert Topology.from_mapping(arm.to_dict()) == arm
    assert arm.with_nodes(3).ram_base == arm.ram_base


def test_the_decoder_takes_the_exporters_ram_base_from_sysfs(tmp_path: Path) -> None:
    from obmm.decoder import EmulatorDecoder, emulator_uba_split

    w = tmp_path / "windows" / "1"
    w.mkdir(parents=True)
    (w / "node").write_text("1\n")
    (w / "base").write_text("0x8000000000\n")
    (w / "size").write_text("0x40000000\n")
    (w / "remote_base").write_text("0x40000000\n")
    uba = (1 << 48) | (1 << 40) | 0x7000_0000
    assert emulator_uba_split(uba) == (1, 0x7000_0000)
    assert EmulatorDecoder(str(tmp_path)).resolve(1, uba, 0x1000) == 0x80_3000_0000
    (w / "remote_base").unlink()  # an older module: offset == PA
    assert EmulatorDecoder(str(tmp_path)).resolve(1, 0x1 << 48 | 1 << 40 | 0x1000, 8) == (
        0x80_0000_1000
    )


def test_a_restore_writes_pci_configuration_by_ports_on_x86_and_by_ecam_on_arm64() -> None:
    assert arch.X86_64.pci_config == "port"
    assert arch.ARM64.pci_config == "ecam"
