#!/usr/bin/env bash
# Stage "host": linters and the host suite (no VM). Same commands a developer runs.
source "$(dirname "$0")/lib.sh"
stage host
make setup
make lint host-test
