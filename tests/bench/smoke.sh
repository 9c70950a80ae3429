#!/usr/bin/env bash
# A short smoke run of every benchmark (about 1.5 minutes), so they keep working: CI runs
# this, not the benchmarks themselves. Skips what is not installed (fails instead under
# CI=true), fails on any error.
set -euo pipefail
cd "$(dirname "$0")"
PY=/usr/bin/python3
rc=0
run() { echo "--- $*"; if ! timeout 300 "$PY" "$@"; then echo "FAILED: $*"; rc=1; fi; }
if command -v wrk >/dev/null && command -v hey >/dev/null && command -v nginx >/dev/null; then
  run b1_overhead.py --smoke
elif [ "${CI:-}" = true ]; then
  echo "FAILED: b1 needs wrk, hey and nginx (deploy/setup.sh --test installs them)"; rc=1
else
  echo "--- b1 skipped: wrk, hey or nginx not installed"
fi
run b2_goodput.py --smoke
run b3_streams.py --smoke
run b4_footprint.py --smoke
run b5_batch.py --smoke
run health_scale.py --smoke
run b6_scale.py --smoke
run b7_shapes.py --self-test
run b7_shapes.py --smoke
run b8_capacity.py --smoke
run b9_placement.py --smoke
exit $rc
