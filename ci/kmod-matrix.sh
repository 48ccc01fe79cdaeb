#!/usr/bin/env bash
# Stage "kmod-matrix": build kmod/* W=1 (warnings fail) against Debian 12 amd64, Debian 13 amd64
# and Debian 12 arm64 (cross) kernel headers, unpacked into ~/.cache/obmm-testbed (never over
# the host's /usr/src). CELL=<name> builds one cell; one PASS/FAIL line per cell.
source "$(dirname "$0")/lib.sh"
stage kmod-matrix "${CELL:-all cells}"
make setup
make kmod-matrix ${CELL:+CELL="$CELL"}
