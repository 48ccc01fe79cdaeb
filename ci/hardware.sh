#!/usr/bin/env bash
# Stage "hardware": the guest suite on each real UB host and the cluster suite across them, over
# SSH, against the hosts' own obmm.ko (nothing is built or loaded there). Same command a
# developer runs: make hw-test HW_HOSTS=user@host1,user@host2 (or HW_CONFIG=file).
# Results, junit XML and each host's kernel log: results/hw/<host>/.
source "$(dirname "$0")/lib.sh"
stage hardware
if [ -z "${HW_HOSTS:-}" ] && [ -z "${HW_CONFIG:-}" ] && [ -z "${HW_QEMU:-}" ]; then
	echo "ci/hardware.sh: set HW_HOSTS=user@host[:port],... or HW_CONFIG=<file>" >&2
	exit 2
fi
make setup-python
make hw-test
