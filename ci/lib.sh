# shellcheck shell=bash
# Shared by the stage scripts: run from the repository root, collect artifacts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ARTIFACTS=${ARTIFACTS:-results}
mkdir -p "$ARTIFACTS"

stage() { echo "== ci: $* ($(date -u +%H:%M:%S))"; }
