#!/usr/bin/env bash
# Stage "kmod": build every module W=1 against the guest kernel's headers, then the ELF pre-flight.
source "$(dirname "$0")/lib.sh"
stage kmod
make setup
make kmod
