#!/usr/bin/env bash
# Stage "qemu": boot the cluster under QEMU and run the guest and cluster suites, the testbed's
# own VM tests, then the hardware stage in full against QEMU nodes (hw-proof).
source "$(dirname "$0")/lib.sh"
stage qemu
make setup
make qemu-test
make testbed-test
make hw-proof
