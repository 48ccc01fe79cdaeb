"""Tests that misbehave on purpose: tests/cluster/test_pytest_project.py copies this file into
a copy of examples/pytest-project and asserts the plugin fails each with the right text."""

from __future__ import annotations

from test_pair import DEST, built  # noqa: F401  (the project's build fixture)

from obmm.testbed.node import Node
from obmm.testbed.usercluster import UserCluster


def test_a_kernel_warn_fails_this_test(obmm_nodes: list[Node]) -> None:
    # A bad module call: obmm_testhook.ko WARNs on node 1.
    obmm_nodes[1].run("echo warn > /dev/obmm_testhook", check=True)


def test_a_leaked_export_fails_the_leak_check(built: UserCluster) -> None:  # noqa: F811
    # The exporter killed with SIGKILL cannot unexport: its region stays.
    res = built.nodes[0].run(
        "./exporter 7002 >/tmp/leaky.log 2>&1 & pid=$!; "
        "until grep -q serving /tmp/leaky.log; do sleep 0.1; done; kill -KILL $pid; wait $pid",
        cwd=DEST,
        timeout=60,
    )
    assert res.exit_status == 137


def test_the_next_test_starts_clean(obmm_nodes: list[Node]) -> None:
    for node in obmm_nodes:
        regions = node.run("ls /sys/devices/obmm | grep -c obmm_shmdev", check=False).out
        assert regions.strip() == "0", f"{node.name}: {regions}"
