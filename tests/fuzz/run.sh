#!/bin/sh
# Build the libFuzzer targets against the project's sources and run each for a bounded
# time; exits non-zero when a target crashes, leaks, hangs or trips a sanitizer.
#
#   tests/fuzz/run.sh [SECONDS_EACH] [TARGET...]     (default: 20 s, every target)
#
# Needs clang with libFuzzer (Debian: clang, libfuzzer-14-dev), pkg-config for libuv,
# libcjson, libcurl, openssl (and hiredis when present), and llhttp's sources in
# /usr/share/llhttp (node-llhttp). Builds in $FUZZ_BUILD_DIR (default a fresh temporary
# folder); the committed seeds in tests/fuzz/corpus/TARGET are never written to: new
# inputs go to a working copy in the build folder. Every file in
# tests/fuzz/regressions/TARGET (inputs that once crashed) is replayed first.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
secs=${1:-20}
[ $# -gt 0 ] && shift
targets=${*:-"fuzz_oai fuzz_sse fuzz_config fuzz_heartbeat fuzz_http"}
CC=${CC:-clang}
LLHTTP_SRC=${LLHTTP_SRC:-/usr/share/llhttp}
LLHTTP_INC=${LLHTTP_INC:-/usr/share/include/llhttp}
build=${FUZZ_BUILD_DIR:-$(mktemp -d /tmp/fleetgate-fuzz.XXXXXX)}
mkdir -p "$build/obj" "$build/work"

pkgs="libuv libcjson libcurl openssl"
pkg-config --exists hiredis 2>/dev/null && pkgs="$pkgs hiredis"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
version_def=-DFLEETGATE_VERSION=\"fuzz\"
# shellcheck disable=SC2086 # word-split on purpose
cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer $san -D_GNU_SOURCE
  -I$root/proto -I$root/gateway -I$LLHTTP_INC $(pkg-config --cflags $pkgs)"
# shellcheck disable=SC2086
libs="$(pkg-config --libs $pkgs) -lm"

echo "fuzz: building in $build"
objs=""
compile() { # SOURCE OBJECT [EXTRA FLAGS]
  src=$1 obj=$2
  shift 2
  # shellcheck disable=SC2086
  $CC $cflags "$version_def" -fsanitize=fuzzer-no-link -w "$@" -c "$src" -o "$obj"
  objs="$objs $obj"
}
for f in "$LLHTTP_SRC"/llhttp.c "$LLHTTP_SRC"/api.c "$LLHTTP_SRC"/http.c; do
  compile "$f" "$build/obj/llhttp_$(basename "$f" .c).o" -DLLHTTP_STRICT_MODE=1
done
for f in "$root"/proto/*.c; do
  compile "$f" "$build/obj/proto_$(basename "$f" .c).o"
done
for f in "$root"/gateway/*.c; do
  [ "$(basename "$f")" = main.c ] && continue
  compile "$f" "$build/obj/gateway_$(basename "$f" .c).o"
done
if [ -f "$root/gateway/status/embed.py" ]; then
  python3 "$root/gateway/status/embed.py" "$root/gateway/status/index.html" "$build/status_page.c"
  compile "$build/status_page.c" "$build/obj/status_page.o"
fi
rm -f "$build/libfg.a"
# shellcheck disable=SC2086
ar rcs "$build/libfg.a" $objs

for t in $targets; do
  # shellcheck disable=SC2086
  $CC $cflags -fsanitize=fuzzer "$here/$t.c" "$build/libfg.a" $libs -o "$build/$t"
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
failed=""
for t in $targets; do
  reg="$here/regressions/$t"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
    echo "fuzz: $t: replaying $(find "$reg" -type f | wc -l) regression input(s)"
    if ! "$build/$t" -runs=1 "$reg"/* >"$build/$t.regressions.log" 2>&1; then
      tail -40 "$build/$t.regressions.log"
      failed="$failed $t(regression)"
      continue
    fi
  fi
  mkdir -p "$build/work/$t" "$build/crashes"
  echo "fuzz: $t: $secs s"
  if ! "$build/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
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
