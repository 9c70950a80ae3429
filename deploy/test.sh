#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite:
#   1. unit (cmocka) and system (pytest over the real binaries) on the normal build;
#   2. the same suites on an AddressSanitizer + UndefinedBehaviorSanitizer build;
#   3. each libFuzzer target for a short, bounded time (tests/fuzz/run.sh);
#   4. a smoke run of each benchmark (tests/bench/smoke.sh), so they keep working.
# Prints one closing line "N passed, N failed" and exits non-zero when anything failed.
#   deploy/test.sh            everything
#   deploy/test.sh --quick    the normal build only (no sanitizer pass)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

deploy/setup.sh --test || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
run_suites() { # build-dir label
  local dir=$1 label=$2 log
  log=$(mktemp)
  echo "== $label: meson test -C $dir"
  meson test -C "$dir" --print-errorlogs --num-processes 2 2>&1 | tee "$log" | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Expected Fail|Unexpected Pass|Skipped|Timeout):'
  local ok fail to
  ok=$(awk '/^Ok:/ {print $2}' "$log"); fail=$(awk '/^Fail:/ {print $2}' "$log")
  to=$(awk '/^Timeout:/ {print $2}' "$log")
  if [ -z "$ok" ]; then
    tail -40 "$log"
    failed=$((failed + 1))
  else
    passed=$((passed + ok)); failed=$((failed + ${fail:-0} + ${to:-0}))
  fi
  # pytest's own summary lines, for the reader
  grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$dir/meson-logs/testlog.txt" | sed "s/^/   [$label] /" || true
  # and which tests failed, so a CI log that shows only this script's output says which
  grep -E '^(FAILED|ERROR) ' "$dir/meson-logs/testlog.txt" | head -20 | sed "s/^/   [$label] /" || true
  rm -f "$log"
}

# The aarch64 phone build that tests/system/test_arm64.py runs under qemu-user (under
# CI=true the test fails without it). A build folder already there is reused: from
# scratch this takes about a minute (cross toolchain, Debian's curl for arm64), then ~1 s.
echo "== deploy/build-agent-phone.sh --arch arm64"
if ! deploy/build-agent-phone.sh --arch arm64 > /tmp/fleetgate-arm64-build.log 2>&1; then
  failed=$((failed + 1))
  tail -40 /tmp/fleetgate-arm64-build.log
fi

run_suites build "build"

if [ "$quick" = 0 ]; then
  if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
  fi
  if meson compile -C build-asan >/dev/null; then
    # tests marked `once` (the tree's scripts and documents) ran in the normal pass
    export FLEETGATE_SANITIZER_PASS=1
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    run_suites build-asan "asan+ubsan"
  else
    echo "sanitizer build failed"; failed=$((failed + 1))
  fi
fi

if [ "$quick" = 0 ]; then
  echo "== fuzzing: tests/fuzz/run.sh ${FLEETGATE_FUZZ_SECONDS:-10}"
  if tests/fuzz/run.sh "${FLEETGATE_FUZZ_SECONDS:-10}" > /tmp/fleetgate-fuzz.log 2>&1; then
    passed=$((passed + 1))
    grep -E "^(fuzz_|==|#[0-9]+ *DONE)" /tmp/fleetgate-fuzz.log | tail -10 || true
  else
    failed=$((failed + 1))
    tail -40 /tmp/fleetgate-fuzz.log
  fi
fi

if [ "$quick" = 0 ]; then
  echo "== benchmarks, smoke mode: tests/bench/smoke.sh"
  if tests/bench/smoke.sh > /tmp/fleetgate-bench-smoke.log 2>&1; then
    passed=$((passed + 1))
    grep -E "^--- " /tmp/fleetgate-bench-smoke.log || true
  else
    failed=$((failed + 1))
    tail -40 /tmp/fleetgate-bench-smoke.log
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
