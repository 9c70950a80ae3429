#!/bin/sh
# Build the libFuzzer targets with meson (-Dfuzz=enabled, clang, AddressSanitizer and
# UndefinedBehaviorSanitizer) in a build folder of their own, replay the regression
# inputs, and run each target for a bounded time; exits non-zero when a target crashes,
# leaks, hangs or trips a sanitizer.
#
#   tests/fuzz/run.sh [SECONDS_EACH] [TARGET...]     (default: 20 s, every target)
#
# Needs clang with libFuzzer (Debian: clang, libfuzzer-14-dev), meson and what the normal
# build needs. Builds in $FUZZ_BUILD_DIR (default build-fuzz/ in the source tree; set up
# on first use, rebuilt incrementally after); CC (default clang), LLHTTP_SRC and
# LLHTTP_INC go to its meson setup. The committed seeds in tests/fuzz/corpus/TARGET are
# never written to: new inputs go to a working copy in the build folder. Every file in
# tests/fuzz/regressions/TARGET is replayed first (the unit suite replays them too).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
secs=${1:-20}
[ $# -gt 0 ] && shift
targets=${*:-"fuzz_oai fuzz_sse fuzz_config fuzz_heartbeat fuzz_http fuzz_multipart"}
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}

if [ ! -f "$build/build.ninja" ]; then
  echo "fuzz: setting up $build"
  CC=${CC:-clang} meson setup "$build" "$root" -Dfuzz=enabled -Dtests=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
    ${LLHTTP_SRC:+-Dllhttp_src="$LLHTTP_SRC"} ${LLHTTP_INC:+-Dllhttp_include="$LLHTTP_INC"}
fi
echo "fuzz: building in $build"
# shellcheck disable=SC2086 # word-split on purpose
meson compile -C "$build" $targets
mkdir -p "$build/work" "$build/crashes"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
failed=""
for t in $targets; do
  bin="$build/tests/fuzz/$t"
  reg="$here/regressions/$t"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
    echo "fuzz: $t: replaying $(find "$reg" -type f | wc -l) regression input(s)"
    if ! "$bin" -runs=1 "$reg"/* >"$build/$t.regressions.log" 2>&1; then
      tail -40 "$build/$t.regressions.log"
      failed="$failed $t(regression)"
      continue
    fi
  fi
  mkdir -p "$build/work/$t"
  echo "fuzz: $t: $secs s"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
      "$build/work/$t" "$here/corpus/$t" >"$build/$t.log" 2>&1; then
    tail -60 "$build/$t.log"
    failed="$failed $t"
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/$t.log" | tail -2
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: FAILED:$failed (inputs in $build/crashes)"
  exit 1
fi
echo "fuzz: all targets ran $secs s each without a finding"
