#!/usr/bin/env bash
# Stage "patch-check": the URMA_SEG_MAPPED series. KSRC=<OLK-6.6 tree> adds git am + arm64 build.
source "$(dirname "$0")/lib.sh"
stage patch-check
make setup
make patch-check ${KSRC:+KSRC="$KSRC"}
