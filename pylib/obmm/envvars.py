"""Every environment variable the project reads or sets, defined once: name, type, default, help.

Groups:

* ``testbed``: the knobs of a QEMU cluster (:class:`obmm.testbed.settings.Settings` reads them,
  and the same knobs come from CLI flags and pytest options);
* ``paths``: where the testbed finds sources and keeps what it makes (:mod:`obmm.testbed.paths`);
* ``suite``: the host-side suites (which guest tests, per-test timeout, attaching);
* ``image``: where image builds fetch packages;
* ``hardware``: the hardware stage (``make hw-test``; :mod:`obmm.testbed.hw.config`);
* ``node``: what the testbed gives every process on a node (node id, addresses, driver, ...);
  programs under test read these;
* ``internal``: set by the testbed for its own child processes; not for users.

Standard library only: the runtime (``obmm.identity``, ``obmm.decoder``), the guests' pytest
plugin and the testbed all import it.  The variable table of docs/settings.md is generated from
:data:`ALL` (``ci/sync_docs.py``); ``tests/host/repo/test_layers.py`` checks that no other module
spells a variable's name as an environment read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GROUPS = ("testbed", "paths", "suite", "image", "hardware", "node", "internal")


def as_text(text: str) -> str:
    return text


def as_int(text: str) -> int:
    return int(text, 0)


def as_float(text: str) -> float:
    return float(text)


def as_words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


#: The guest kernels by name (obmm.testbed.builds.kernels); an absolute path names a built tree.
KERNEL_NAMES = ("debian", "debug")


def as_kernel(text: str) -> str:
    if text in KERNEL_NAMES or os.path.isabs(text):
        return text
    raise ValueError(text)


@dataclass(frozen=True)
class Var:
    """One environment variable."""

    name: str
    group: str
    help: str
    #: The value when unset, typed (None: no value; the reader decides).
    default: Any = None
    parse: Callable[[str], Any] = as_text
    choices: tuple[str, ...] = ()
    #: How the default reads in the generated table when it is not simply ``default``.
    default_text: str = ""

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, or None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name)
        return value if value else None

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value, else the default; a bad value raises ValueError naming it."""
        text = self.raw(environ)
        if text is None:
            return self.default
        if self.choices and text not in self.choices:
            raise ValueError(f"{self.name}={text!r}: must be one of {', '.join(self.choices)}")
        try:
            return self.parse(text)
        except ValueError:
            kind = self.parse.__name__.removeprefix("as_")
            raise ValueError(f"{self.name}={text!r}: not a valid {kind}") from None

    @property
    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None or self.default == ():
            return ""
        return str(self.default)


# -- testbed knobs (obmm.testbed.settings.Settings) ---------------------------------------------

TOPOLOGY = Var(
    "OBMM_TESTBED_TOPOLOGY",
    "testbed",
    "cluster shape: a name under qemu/topologies/ or a JSON file",
    default_text="the front end's: `single` for the guest suite and one node, `pair` otherwise",
)
NODES = Var(
    "OBMM_TESTBED_NODES",
    "testbed",
    "number of nodes, 1..8 (overrides the topology's)",
    parse=as_int,
)
MEMORY_MIB = Var(
    "OBMM_TESTBED_MEMORY_MIB",
    "testbed",
    "RAM per node in MiB (power of two)",
    parse=as_int,
    default_text="the topology's",
)
POOL_MIB = Var(
    "OBMM_TESTBED_POOL_MIB",
    "testbed",
    "export pool at the top of each node's RAM, MiB",
    parse=as_int,
    default_text="the topology's",
)
RECIPE = Var(
    "OBMM_TESTBED_RECIPE",
    "testbed",
    "guest image recipe (qemu/<distro>/<name>.json)",
    default="debian-bookworm",
)
KERNEL = Var(
    "OBMM_TESTBED_KERNEL",
    "testbed",
    "guest kernel: the image's own, the debug build (KASAN, lockdep, kmemleak; "
    "`make debug-kernel`), or the absolute path of a built kernel tree of yours",
    default="debian",
    parse=as_kernel,
    default_text="`debian` (`debian` \\| `debug` \\| an absolute path)",
)
INIT = Var(
    "OBMM_TESTBED_INIT",
    "testbed",
    "node userland: our small init (seconds) or systemd (real-host-like)",
    default="fast",
    choices=("fast", "systemd"),
)
ACCEL = Var(
    "OBMM_TESTBED_ACCEL",
    "testbed",
    "accelerator: KVM when a probe boots a guest under it (auto), or forced; `tcg-serial` is "
    "one TCG thread per node, where cross-node atomics are not atomic (the bench's baseline "
    "for what parallel TCG costs)",
    default="auto",
    choices=("auto", "kvm", "tcg", "tcg-serial"),
)
SNAPSHOT = Var(
    "OBMM_TESTBED_SNAPSHOT",
    "testbed",
    "restore a saved snapshot of the cluster shape instead of booting, and save one after a "
    "cold boot (auto), or always boot cold (off)",
    default="auto",
    choices=("auto", "off"),
)
NAME = Var(
    "OBMM_TESTBED_NAME",
    "testbed",
    "cluster name (its run directory is <run root>/obmm-testbed-NAME)",
    default_text="the front end's: `default` for up/ssh/down, `<front end>-<pid>` for the rest",
)
BOOT_TIMEOUT = Var(
    "OBMM_TESTBED_BOOT_TIMEOUT",
    "testbed",
    "seconds to wait for every node's sshd",
    parse=as_float,
    default_text="scaled with nodes and cores",
)
TIMEOUT_SCALE = Var(
    "OBMM_TESTBED_TIMEOUT_SCALE",
    "testbed",
    "factor (>= 1) on the boot and per-test timeouts and the suites' waits for work of variable "
    "length (slower debug kernels); the machine's load stretches the waits further on its own "
    "(runnable tasks per core, at most 8 times)",
    default=1.0,
    parse=as_float,
)
DRIVER = Var(
    "OBMM_TESTBED_DRIVER",
    "testbed",
    "the OBMM driver loaded on the nodes: `emu`, the emulator (kmod/obmm_emu); `real`, "
    "upstream's obmm.ko from $OBMM_UB_UPSTREAM over the compat layer (kmod/ub_compat)",
    default="emu",
    choices=("emu", "real"),
)
PARAMS = Var(
    "OBMM_TESTBED_PARAMS",
    "testbed",
    "extra module parameters for the driver, NAME=VALUE separated by spaces "
    "(e.g. `ubc_index=1 ubc_dev=00002`)",
    default=(),
    parse=as_words,
)
ARCH = Var(
    "OBMM_TESTBED_ARCH",
    "testbed",
    "the nodes' architecture: x86_64, or arm64 (QEMU's virt machine with a Kunpeng-like "
    "neoverse-n1 CPU; obmm.testbed.arch)",
    default="x86_64",
    choices=("x86_64", "arm64"),
)
QEMU = Var(
    "OBMM_TESTBED_QEMU",
    "testbed",
    "the QEMU binary",
    default="",
    default_text="the architecture's: qemu-system-x86_64 or qemu-system-aarch64",
)
UBS_MEM = Var(
    "OBMM_TESTBED_UBS_MEM",
    "testbed",
    "a ubs-mem build (installed as /usr/local/ubs_mem on every node, with our UBSE and ubsmd "
    "started; docs/ubs-mem.md); needs the driver loaded",
    default_text="none",
)
COHERENCE = Var(
    "OBMM_TESTBED_COHERENCE",
    "testbed",
    "the emulator's coherence model: `coherent`, every node sees every store at once; `strict`, "
    "each node caches what its cacheable mappings touch until the driver's maintenance "
    "(docs/coherence.md; the driver parameter `coherence`)",
    default="coherent",
    choices=("coherent", "strict"),
)

# -- paths (obmm.testbed.paths) -----------------------------------------------------------------

ROOT = Var(
    "OBMM_TESTBED_ROOT",
    "paths",
    "source tree: recipes in qemu/, module sources in kmod/, guest tests",
    default_text="the checkout, else the installed package data",
)
CACHE = Var(
    "OBMM_TESTBED_CACHE",
    "paths",
    "images, kernel headers, snapshots, console logs: kept between runs",
    default_text="$XDG_CACHE_HOME/obmm-testbed, else ~/.cache/obmm-testbed",
)
RESULTS = Var(
    "OBMM_TESTBED_RESULTS",
    "paths",
    "built modules, junit files, reports of one run",
    default_text="<root>/results in a checkout, else ~/.local/share/obmm-testbed/results",
)
UB_UPSTREAM = Var(
    "OBMM_UB_UPSTREAM",
    "paths",
    "an upstream UB driver tree (kunpengcompute/ub-os-component-dkms layout or an OLK checkout) "
    "the real-driver and patch-check stages build from; not given: those stages skip, saying so",
    default_text="not given",
)
LIBOBMM_SOURCE = Var(
    "OBMM_LIBOBMM_SOURCE",
    "paths",
    "a libobmm source tree (libobmm.h, libobmm.c, vendor_adaptor.c) the cluster suite's libobmm "
    "test builds in the nodes; not given: that test skips, saying so",
    default_text="not given",
)
RUN_ROOT = Var(
    "OBMM_TESTBED_RUN_ROOT",
    "paths",
    "parent of the per-cluster run directories (RAM files, sockets; tmpfs)",
    default="/dev/shm",
)

# -- the host-side suites -----------------------------------------------------------------------

GUEST_PATHS = Var(
    "OBMM_GUEST_PATHS",
    "suite",
    "guest tests to run instead of a suite's own (files or node ids, space separated)",
    default=(),
    parse=as_words,
)
GUEST_TEST_TIMEOUT = Var(
    "OBMM_GUEST_TEST_TIMEOUT",
    "suite",
    "seconds one guest test may take (times the timeout scale)",
    default=900.0,
    parse=as_float,
)
GUEST_SHARDS = Var(
    "OBMM_GUEST_SHARDS",
    "suite",
    "single-node clusters the guest suite's files are shared out over, run at once (its "
    "TCG guests then use more than one core); 1: one node runs them all",
    default=1,
    parse=as_int,
)
CLUSTER_SHARD = Var(
    "OBMM_CLUSTER_SHARD",
    "suite",
    "I/N: run the I-th of N parts of the cluster suite (its files shared out by the seconds "
    "each test took last time), on a cluster of its own; N such runs at once take every test "
    "once; empty: the whole suite",
    default="",
)
ATTACH = Var(
    "OBMM_TESTBED_ATTACH",
    "suite",
    "run a suite on the running cluster NAME (`obmm-testbed up --kmod --name NAME`) instead of "
    "booting one; it is left running",
)

# -- image builds -------------------------------------------------------------------------------

DEBIAN_MIRROR = Var(
    "OBMM_DEBIAN_MIRROR", "image", "Debian mirror for image builds", default_text="deb.debian.org"
)
DEBIAN_SECURITY_MIRROR = Var(
    "OBMM_DEBIAN_SECURITY_MIRROR",
    "image",
    "Debian security mirror for the module build matrix",
    default_text="security.debian.org",
)
OPENEULER_REPO = Var(
    "OBMM_OPENEULER_REPO", "image", "openEuler 24.03 repository for the openEuler recipe"
)
CHECKPATCH = Var(
    "OBMM_CHECKPATCH", "image", "checkpatch.pl to use instead of Debian's linux-source copy"
)
DEBUG_KERNEL_JOBS = Var(
    "DEBUG_KERNEL_JOBS", "image", "parallel jobs of the debug kernel build", default=2, parse=as_int
)

# -- the hardware stage (obmm.testbed.hw.config; also keys of its config file) ------------------

HW_CONFIG = Var("HW_CONFIG", "hardware", "the stage's config file (TOML-like keys)")
HW_HOSTS = Var("HW_HOSTS", "hardware", "UB hosts, user@host[:port] separated by commas")
HW_SSH_KEY = Var("HW_SSH_KEY", "hardware", "private key (default: the ssh agent and ~/.ssh)")
HW_KNOWN_HOSTS = Var(
    "HW_KNOWN_HOSTS", "hardware", "known_hosts file", default_text="~/.ssh/known_hosts"
)
HW_HOST_KEY_POLICY = Var(
    "HW_HOST_KEY_POLICY",
    "hardware",
    "unknown host keys",
    default="strict",
    choices=("strict", "accept-new", "off"),
)
HW_PYTHON = Var("HW_PYTHON", "hardware", "python on the hosts", default="python3")
HW_REMOTE_TMP = Var(
    "HW_REMOTE_TMP", "hardware", "where the run's directory goes on the hosts", default="/tmp"
)
HW_CONNECT_TIMEOUT = Var(
    "HW_CONNECT_TIMEOUT", "hardware", "seconds for one SSH login", default=10.0, parse=as_float
)
HW_DEVICE = Var("HW_DEVICE", "hardware", "the OBMM device on the hosts", default="/dev/obmm")
HW_SHIP_DEPS = Var(
    "HW_SHIP_DEPS",
    "hardware",
    "copy pytest to hosts that lack it",
    default="auto",
    choices=("auto", "always", "never"),
)
HW_CLUSTER = Var(
    "HW_CLUSTER",
    "hardware",
    "the cluster suite across the hosts",
    default="auto",
    choices=("auto", "off"),
)
HW_FABRIC_ADDRS = Var(
    "HW_FABRIC_ADDRS",
    "hardware",
    "addresses the hosts reach each other at (handle exchange), by host order",
    default_text="the hosts' SSH addresses",
)
HW_KEEP = Var("HW_KEEP", "hardware", "1: leave the run's directory on the hosts")
HW_QEMU = Var(
    "HW_QEMU",
    "hardware",
    "a running QEMU cluster (`up --kmod --name NAME`) standing in for the hosts",
)

# -- what every process on a node gets ----------------------------------------------------------

NODE_ID = Var("OBMM_NODE_ID", "node", "this node's index (what handles carry and decoders resolve)")
NODE_COUNT = Var("OBMM_NODES", "node", "number of nodes in the cluster")
NODE_CNA = Var("OBMM_NODE_CNA", "node", "this node's primary CNA (as its UB controller shows it)")
NODE_EID = Var("OBMM_NODE_EID", "node", "this node's EID (as its UB controller shows it)")
NODE_ADDRS = Var(
    "OBMM_NODE_ADDRS", "node", "every node's inter-node address, space separated, in node order"
)
NODE_ADDR = Var("OBMM_NODE_ADDR", "node", "this node's inter-node address (to serve handles on)")
CFLAGS = Var("OBMM_CFLAGS", "node", "-I flags for ub/obmm.h and the C handle helpers")
TARGET = Var(
    "OBMM_TARGET", "node", "where the suite runs", default="qemu", choices=("qemu", "hardware")
)
NODE_DRIVER = Var(
    "OBMM_DRIVER",
    "node",
    "the driver under test; tests marked emulator_only run only on `emu`",
    default="emu",
    choices=("emu", "real"),
)
POOL_BASE = Var(
    "OBMM_POOL_BASE", "node", "physical base of the emulator's export pool", parse=as_int
)
POOL_SIZE = Var("OBMM_POOL_SIZE", "node", "bytes in the emulator's export pool", parse=as_int)
DECODER = Var(
    "OBMM_DECODER",
    "node",
    "how an importer turns (exporter node, UBA) into a local address: `emulator`, "
    "`cmd:PROGRAM` or `file:TABLE` (obmm.decoder)",
    default="emulator",
)
UBSE_SOCKET = Var(
    "OBMM_UBSE_SOCKET",
    "node",
    "our UBSE: the Unix socket of the node's service (libubse-client.so.1 and "
    "`python -m obmm.ubse serve`)",
    default="/run/obmm-ubse.sock",
)
UBSE_PORT = Var(
    "OBMM_UBSE_PORT",
    "node",
    "our UBSE: the TCP port of every node's service on the inter-node network",
    default=13858,
    parse=as_int,
)
UBSE_BLOCK_MIB = Var(
    "OBMM_UBSE_BLOCK_MIB",
    "node",
    "our UBSE: obmm.memory.block.size, MiB (an even value in 4..4096; else 128): one memid "
    "per block",
    parse=as_int,
    default_text="128",
)
UBSE_LENDERS = Var(
    "OBMM_UBSE_LENDERS",
    "node",
    "our UBSE: the slot ids of the nodes that may lend, space separated (UBSE's isLender); "
    "unset: every node",
    parse=as_words,
)
KMSG_GUARD = Var(
    "OBMM_KMSG_GUARD",
    "node",
    "`off`: the guest suite does not fail tests on kernel reports",
    default="on",
)
KMSG_PATH = Var(
    "OBMM_KMSG_PATH", "node", "the kernel log the guest suite watches", default="/dev/kmsg"
)
TAINTED_PATH = Var(
    "OBMM_TAINTED_PATH",
    "node",
    "the taint mask the guest suite compares",
    default="/proc/sys/kernel/tainted",
)
EXPORTER_NODE = Var("OBMM_EXPORTER_NODE", "node", "given to a `cmd:` decoder: the exporting node")
UBA = Var("OBMM_UBA", "node", "given to a `cmd:` decoder: the export's UBA")
LENGTH = Var("OBMM_LENGTH", "node", "given to a `cmd:` decoder: the length to map")

# -- internal: the testbed's own child processes ------------------------------------------------

EVENT_FD = Var(
    "OBMM_EVENT_FD", "internal", "the guest pytest's result stream (file descriptor)", parse=as_int
)
HW_CONFIG_JSON = Var(
    "OBMM_HW_CONFIG_JSON",
    "internal",
    "the hardware stage's config, for the cluster suite it starts",
)
HW_HOST_INDEX = Var(
    "OBMM_HW_HOST_INDEX", "internal", "the host a stage's guest suite runs on", parse=as_int
)
HW_SHIP_DEPS_TAR = Var(
    "OBMM_HW_SHIP_DEPS_TAR", "internal", "the pytest archive for hosts without pytest"
)
HW_RESULTS = Var("OBMM_HW_RESULTS", "internal", "where the stage's suite writes its results")
HW_RUN_ID = Var("OBMM_HW_RUN_ID", "internal", "the stage run's id (kernel-log marker)")
AUTHORIZED_KEY = Var(
    "OBMM_AUTHORIZED_KEY", "internal", "image build hooks: the testbed's public key"
)
KERNEL_RELEASE = Var(
    "OBMM_KERNEL_RELEASE", "internal", "image build hooks: the kernel release installed"
)

ALL: tuple[Var, ...] = tuple(v for v in globals().values() if isinstance(v, Var))
BY_NAME: Mapping[str, Var] = {v.name: v for v in ALL}


def in_group(group: str) -> tuple[Var, ...]:
    return tuple(v for v in ALL if v.group == group)


def render_markdown(groups: tuple[str, ...] = GROUPS) -> str:
    """The table of variables of docs/settings.md."""
    rows = ["| variable | group | default | meaning |", "|---|---|---|---|"]
    for group in groups:
        for var in in_group(group):
            default = var.shown_default
            if var.choices:
                default = (
                    (f"`{default}` " if default else "")
                    + "("
                    + " \\| ".join(f"`{c}`" for c in var.choices)
                    + ")"
                )
            elif default and not var.default_text:
                default = f"`{default}`"
            meaning = var.help.replace("|", "\\|")
            rows.append(f"| `{var.name}` | {group} | {default} | {meaning} |")
    return "\n".join(rows) + "\n"
