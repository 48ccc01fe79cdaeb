# The hardware stage and the kernel build matrix (included from the Makefile).

# Hardware stage: the guest suite on each UB host, the cluster suite across them, over SSH.
#   make hw-test HW_HOSTS=root@ub1,root@ub2:2222 [HW_SSH_KEY=~/.ssh/ub] [HW_CONFIG=hw.toml]
#   make hw-test HW_QEMU=<cluster>   # a running `obmm-testbed up --kmod` cluster stands in
# Other settings from the environment: HW_KNOWN_HOSTS, HW_HOST_KEY_POLICY, HW_PYTHON,
# HW_SHIP_DEPS, HW_REMOTE_TMP, HW_CLUSTER, OBMM_DECODER (see pylib/obmm/testbed/hw/config.py).
HW_HOSTS ?=
HW_CONFIG ?=
HW_SSH_KEY ?=
HW_QEMU ?=
HW_ARGS ?=
.PHONY: hw-test hw-preflight hw-bench kmod-matrix

HW_OPTS = $(if $(HW_HOSTS),--hosts "$(HW_HOSTS)") $(if $(HW_CONFIG),--config "$(HW_CONFIG)") \
	$(if $(HW_SSH_KEY),--key "$(HW_SSH_KEY)") $(if $(HW_QEMU),--qemu "$(HW_QEMU)")
# bench has --qemu for the QEMU binary: its stand-in flag is --hw-qemu
HW_BENCH_OPTS = $(subst --qemu ,--hw-qemu ,$(HW_OPTS))

hw-test: setup-python
	$(VENV)/bin/obmm-testbed hw-test $(HW_OPTS) $(HW_ARGS)

hw-preflight: setup-python
	$(VENV)/bin/obmm-testbed hw-preflight $(HW_OPTS)

# The seed's scheme-7 client benchmark (Bench 1-3 over the Python API) on the first two hosts:
# results/hw/bench/ (results.json, summary.md).  The same on the QEMU pair:
# `make bench BENCH_ARGS=--scheme7`; both in one table:
#   obmm-testbed bench-compare bench-results/<run> results/hw/bench --side-by-side --prefix scheme7.
hw-bench: setup-python
	$(VENV)/bin/obmm-testbed bench --scheme7 --hw $(HW_BENCH_OPTS) --out results/hw --name bench \
		--print-summary $(BENCH_ARGS)

# Kernel build matrix: kmod/* W=1 against Debian 12 amd64, Debian 13 amd64, Debian 12 arm64
# (cross). CELL=<name> for one cell; results/kmod-matrix/matrix.json has every cell's result.
CELL ?=
kmod-matrix: setup-python
	$(VENV)/bin/obmm-testbed kmod-matrix --json results/kmod-matrix/matrix.json $(if $(CELL),--cell $(CELL))
