# The debug-kernel stage (included from the Makefile; issue 15).
#
#   make debug-kernel   build (or reuse) the guest kernel with KASAN, KFENCE, lockdep,
#                       DEBUG_ATOMIC_SLEEP, DEBUG_OBJECTS, kmemleak, UBSAN bounds and fault
#                       injection from Debian's linux-source-6.1 (apt-get download), cached in
#                       ~/.cache/obmm-testbed/debug-kernel keyed by source version and config
#                       (pylib/obmm/testbed/debugkernel.py, qemu/debug-kernel/debug.config)
#   make debug-test     the guest suite and the cluster suite (the selections of qemu-test, one
#                       after the other: KASAN guests side by side would starve 2 cores)
#                       with every guest booted on it
#                       (OBMM_TESTBED_KERNEL=debug: obmm_emu built against its build tree),
#                       the fuzzer when it exists, then the kmemleak verdict: any report, or
#                       a stage that scanned nothing, fails it
#
# Guests under KASAN are slower: OBMM_TESTBED_TIMEOUT_SCALE stretches the harness's boot and
# per-test timeouts (DEBUG_TIMEOUT_SCALE here).
DEBUG_KERNEL_JOBS ?= 2
DEBUG_TIMEOUT_SCALE ?= 3
# The fuzzer's hook (branch fuzz, `python3 -m obmm.fuzz --seed S --ops N --mode M` in a node):
# run on the debug kernel (OBMM_TESTBED_KERNEL=debug is exported to it) before the kmemleak
# verdict, as soon as the Makefile has a `fuzz` target taking FUZZ_ARGS.  Until then the stage
# says the fuzzer did not run.  Override the budgets, seeds or the whole command here.
DEBUG_FUZZ_SINGLE ?= --seed 1 --ops 100000 --mode single
DEBUG_FUZZ_CONCURRENT ?= --seed 2 --ops 1000 --mode concurrent
DEBUG_FUZZ_CMD ?= $(MAKE) --no-print-directory fuzz FUZZ_ARGS="$(DEBUG_FUZZ_SINGLE)" && \
	$(MAKE) --no-print-directory fuzz FUZZ_ARGS="$(DEBUG_FUZZ_CONCURRENT)"
.PHONY: debug-kernel debug-test

debug-kernel: setup-python
	$(PY) -m obmm.testbed.debugkernel build -j $(DEBUG_KERNEL_JOBS)

debug-test: setup-python
	@st=0; t0=$$(date +%s); \
	$(MAKE) --no-print-directory debug-kernel image || exit 1; \
	export OBMM_TESTBED_KERNEL=debug OBMM_TESTBED_TIMEOUT_SCALE=$(DEBUG_TIMEOUT_SCALE); \
	$(PY) -m obmm.testbed.kmemleak clear; \
	$(PYTEST) tests/qemu -m "not hw_proof" --junitxml=results/debug-qemu-junit.xml -o junit_logging=all || st=1; \
	$(PYTEST) tests/cluster -m "not hw_proof and not slow" --junitxml=results/debug-cluster-junit.xml -o junit_logging=all || st=1; \
	if $(MAKE) -pq _no_such_target_ 2>/dev/null | grep -q '^fuzz:'; then { $(DEBUG_FUZZ_CMD); } || st=1; \
	else echo "debug-test: no fuzz target yet (branch fuzz): the fuzzer did not run"; fi; \
	$(PY) -m obmm.testbed.kmemleak check || st=1; \
	echo "debug-test: $$(( $$(date +%s) - t0 )) s, $$([ $$st = 0 ] && echo PASS || echo FAIL)"; \
	exit $$st
