#!/usr/bin/env bash
# Stage "host": linters and the host suite (no VM). Same commands a developer runs.
source "$(dirname "$0")/lib.sh"
stage host
make setup
# make lint runs actionlint over .github/ when it is installed (its binary comes from github.com).
.venv/bin/python -m pip install -q -e ".[actionlint]"
make lint host-test
