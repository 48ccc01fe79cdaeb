# The debug-kernel stage (included from the Makefile; issue 15).
#
#   make debug-kernel   build (or reuse) the guest kernel with KASAN, KFENCE, lockdep,
#                       DEBUG_ATOMIC_SLEEP, DEBUG_OBJECTS, kmemleak, UBSAN bounds and fault
#                       injection from Debian's linux-source-6.1 (apt-get download), cached in
#                       ~/.cache/obmm-testbed/debug-kernel keyed by source version and config
#                       (pylib/obmm/testbed/builds/debugkernel.py, qemu/debug-kernel/debug.config)
#   make debug-test     the guest suite and the cluster suite (the selections of qemu-test, one
#                       after the other: KASAN guests side by side would starve 2 cores)
#                       with every guest booted on it
#                       (OBMM_TESTBED_KERNEL=debug: obmm_emu built against its build tree),
#                       the fuzzer (make fuzz), then the kmemleak verdict: any report, or
#                       a stage that scanned nothing, fails it
#
# Guests under KASAN are slower: OBMM_TESTBED_TIMEOUT_SCALE stretches the harness's boot and
# per-test timeouts (DEBUG_TIMEOUT_SCALE here).
DEBUG_KERNEL_JOBS ?= 2
DEBUG_TIMEOUT_SCALE ?= 3
# The fuzzer on the debug kernel (`make fuzz`, OBMM_TESTBED_KERNEL=debug exported to it: both
# nodes of its pair fuzz at once, node 1 with seed + 1, then every control-region trust test):
# DEBUG_FUZZ_OPS single-process operations and DEBUG_FUZZ_ROUNDS race rounds per node, so the
# default is 100,000 operations over the two nodes: about an hour under KASAN on 2 TCG cores
# (54 min with the race rounds, 2026-12-01).
DEBUG_FUZZ_SEED ?= 1
DEBUG_FUZZ_OPS ?= 50000
DEBUG_FUZZ_ROUNDS ?= 1000
DEBUG_FUZZ_XROUNDS ?= 12
DEBUG_FUZZ_TIMEOUT ?= 36000
DEBUG_FUZZ_CMD ?= $(MAKE) --no-print-directory fuzz FUZZ_SEED=$(DEBUG_FUZZ_SEED) \
	FUZZ_OPS=$(DEBUG_FUZZ_OPS) FUZZ_ROUNDS=$(DEBUG_FUZZ_ROUNDS) FUZZ_XROUNDS=$(DEBUG_FUZZ_XROUNDS) \
	FUZZ_TIMEOUT=$(DEBUG_FUZZ_TIMEOUT)
.PHONY: debug-kernel debug-test

debug-kernel: setup-python
	$(PY) -m obmm.testbed.builds.debugkernel build -j $(DEBUG_KERNEL_JOBS)

debug-test: setup-python
	@st=0; t0=$$(date +%s); \
	$(MAKE) --no-print-directory debug-kernel image || exit 1; \
	export OBMM_TESTBED_KERNEL=debug OBMM_TESTBED_TIMEOUT_SCALE=$(DEBUG_TIMEOUT_SCALE); \
	$(PY) -m obmm.testbed.vm.kmemleak clear; \
	$(PYTEST) $(GUEST_ALL) $(call JUNIT,debug-qemu) || st=1; \
	$(PYTEST) $(CLUSTER_ALL) $(call JUNIT,debug-cluster) || st=1; \
	{ $(DEBUG_FUZZ_CMD); } || st=1; \
	$(PY) -m obmm.testbed.vm.kmemleak check || st=1; \
	echo "debug-test: $$(( $$(date +%s) - t0 )) s, $$([ $$st = 0 ] && echo PASS || echo FAIL)"; \
	exit $$st
