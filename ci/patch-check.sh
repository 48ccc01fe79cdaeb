#!/usr/bin/env bash
# Stage "patch-check": the URMA_SEG_MAPPED series; with an upstream UB tree (UPSTREAM=DIR or
# $OBMM_UB_UPSTREAM) also git am, the build against the guest kernel and the KUnit cases in a guest.
source "$(dirname "$0")/lib.sh"
stage patch-check
make setup
make patch-check ${UPSTREAM:+UPSTREAM="$UPSTREAM"} ${NO_GUEST:+NO_GUEST=1}
