#!/usr/bin/env bash
# Installs what fleetgate needs from Debian 12's packages (only what is missing) and
# builds it into ./build. Run as root (or with sudo) on a fresh machine; safe to rerun.
#   deploy/setup.sh          build dependencies + build
#   deploy/setup.sh --test   also what the test suites need (pytest, redis, node client...)
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
[ "${1:-}" = "--test" ] && want_tests=1

pkgs=(meson ninja-build pkg-config gcc libuv1-dev libssl-dev libcjson-dev
      libcurl4-openssl-dev libhiredis-dev libsqlite3-dev uthash-dev node-llhttp curl ca-certificates openssl python3
      jq) # jq: the docs' examples read JSON answers with it
if [ "$want_tests" = 1 ]; then
  pkgs+=(libcmocka-dev python3 python3-pytest python3-pytest-xdist python3-requests python3-aiohttp python3-cryptography
         redis-server valgrind chromium chromium-driver python3-selenium prometheus
         clang libfuzzer-14-dev slowhttptest nginx haproxy wrk hey python3-matplotlib
         libgomp1 # libgomp1: OpenMP runtime of the static llama-server (test_llama.py)
         qemu-user-static file # test_arm64.py: the aarch64 phone build, run under qemu-user
         systemd # test_service.py: systemd-analyze verify and security on the unit
         xz-utils # test_planreplay: the recorded plans are kept xz-compressed
         python3-pyflakes iproute2) # test_docs.py: the docs' Python examples' names; the examples' sandbox
  # Node.js may come from elsewhere (a nodesource build bundles npm): only add what is absent.
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v npm >/dev/null || pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # the peers (nginx, haproxy, redis) are run by the tests as plain processes: keep the
  # packages from starting system services while they install
  prc=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    prc=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$prc" >/dev/null
    $SUDO chmod +x "$prc"
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  [ -n "$prc" ] && $SUDO rm -f "$prc"
fi

if [ ! -f build/build.ninja ]; then
  meson setup build >/dev/null
fi
if [ "$want_tests" = 1 ] && [ "$(meson introspect build --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="tests"][0])')" != enabled ]; then
  meson setup --reconfigure build -Dtests=enabled >/dev/null # cmocka may be new
fi
meson compile -C build >/dev/null
echo "setup: built build/gateway/fleetgate and build/agent/fleetgate-agent"

if [ "$want_tests" = 1 ] && [ -f tests/system/node/package.json ]; then
  if [ ! -d tests/system/node/node_modules/openai ]; then
    echo "setup: installing the openai npm client for the client tests"
    (cd tests/system/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
fi
