#!/usr/bin/env bash
# Stage "debug": the guest kernel with KASAN, lockdep, kmemleak... (make debug-kernel, cached),
# then the guest and cluster suites booted on it and the kmemleak verdict (make debug-test).
source "$(dirname "$0")/lib.sh"
stage debug
make setup
make debug-test DEBUG_KERNEL_JOBS="$(nproc)"
