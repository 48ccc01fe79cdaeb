"""The hardware stage: the guest and cluster suites on real UB hosts over SSH.

``config`` (hosts, keys, policies), ``preflight`` (can each host run the suite), ``stage`` (the
run: sessions, the ``hw-test`` command) and ``pytest_plugin`` (a host standing where a QEMU node
would).  A hardware host offers the same interface as a QEMU node: :mod:`obmm.testbed.node`.
"""
