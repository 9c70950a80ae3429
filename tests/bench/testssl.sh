#!/usr/bin/env bash
# Runs Debian's testssl.sh against fleetgate's HTTPS listener (a throwaway certificate,
# one simulated phone) and prints the protocol and cipher verdicts. Exit 1 when it finds
# an offered weak protocol (SSLv2/3, TLS 1.0/1.1) or a weak cipher category.
#   tests/bench/testssl.sh [BUILD_DIR]      (needs: apt-get install testssl.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
command -v testssl >/dev/null || { echo "testssl.sh is not installed (apt-get install testssl.sh)"; exit 2; }
work=$(mktemp -d /tmp/fleetgate-testssl.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sp=$(free_port); gp=$(free_port)
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout "$work/key.pem" -out "$work/cert.pem" \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
"$build/agent/fleetgate-agent" --engine sim --listen "127.0.0.1:$sp" --model m >"$work/sim.log" 2>&1 &
pids+=($!)
cat >"$work/gw.json" <<JSON
{"listen": [{"address": "127.0.0.1:$gp", "tls": {"cert": "$work/cert.pem", "key": "$work/key.pem"}}],
 "upstream": {"allow_http": true, "allow_addresses": ["127.0.0.0/8"]},
 "replicas": [{"id": "p", "url": "http://127.0.0.1:$sp", "models": ["m"]}]}
JSON
"$build/gateway/fleetgate" --config "$work/gw.json" >"$work/gw.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$gp") 2>/dev/null && break; sleep 0.1; done
testssl --quiet --color 0 --warnings off --protocols --std --server-defaults --vulnerable \
  --jsonfile "$work/testssl.json" "127.0.0.1:$gp" >"$work/testssl.txt" 2>&1 || true
cat "$work/testssl.txt"
/usr/bin/python3 - "$work/testssl.json" <<'PY'
import json, sys
findings = json.load(open(sys.argv[1]))
bad = []
for f in findings:
    fid, sev, txt = f.get("id", ""), f.get("severity", ""), f.get("finding", "")
    if fid in ("SSLv2", "SSLv3", "TLS1", "TLS1_1") and "not offered" not in txt:
        bad.append(f"{fid}: {txt}")
    if fid.startswith("cipherlist_") and fid in ("cipherlist_NULL", "cipherlist_aNULL",
            "cipherlist_EXPORT", "cipherlist_LOW", "cipherlist_3DES_IDEA") and "not offered" not in txt:
        bad.append(f"{fid}: {txt}")
    # cert_*: the throwaway self-signed certificate, not the TLS setup under test
    if sev in ("HIGH", "CRITICAL") and not fid.startswith("cert_"):
        bad.append(f"{fid} [{sev}]: {txt}")
print()
print("weak findings:", bad if bad else "none")
sys.exit(1 if bad else 0)
PY
