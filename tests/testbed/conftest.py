"""The testbed's own tests against real QEMU nodes (``make testbed-test``): how the runner meets
guests that WARN, hang or panic, snapshots and their fallbacks, and ``obmm-testbed run`` from an
installed wheel.  They test the testbed, not OBMM code, so ``make qemu-test`` (the guest and
cluster suites a user's edit-run cycle needs) leaves them out; ``make test`` and CI run them.

The same plugin as tests/qemu: ``guest_session`` is a node of this run's own (restored or booted).
"""

pytest_plugins = ["obmm.testbed.suite.pytest_qemu"]
