#!/bin/bash
# Slow-client check (issue 6): Debian's slowhttptest attacks the gateway in slowloris
# (headers dribbled in), slow-body (R-U-Dead-Yet) and slow-read modes, one after the
# other, while a normal client keeps sending chat requests. Passes when every normal
# request was answered 200 within MAX_LATENCY_S and slowhttptest's own probe found the
# service available every second. Results go to docs/security.md by hand.
#
#   tests/bench/slowloris.sh [BUILD_DIR] [SECONDS_PER_MODE]     (build, 30)
#
# Env: FLEETGATE_BIN, FLEETGATE_AGENT_BIN (default BUILD_DIR/...), HEADER_TIMEOUT_S (5),
# CONNS (2000), RATE (400 new connections/s), MAX_LATENCY_S (2), OUT (a temp folder).
# Needs slowhttptest (apt-get install slowhttptest), curl, python3. Uses 127.0.0.1 only
# and stops every process it started, by pid.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
secs=${2:-30}
gw_bin=${FLEETGATE_BIN:-$build/gateway/fleetgate}
ag_bin=${FLEETGATE_AGENT_BIN:-$build/agent/fleetgate-agent}
header_timeout=${HEADER_TIMEOUT_S:-5}
conns=${CONNS:-2000}
rate=${RATE:-400}
max_latency=${MAX_LATENCY_S:-2}
out=${OUT:-$(mktemp -d /tmp/fleetgate-slowloris.XXXXXX)}
mkdir -p "$out"
command -v slowhttptest >/dev/null || { echo "slowloris: slowhttptest missing (apt-get install slowhttptest)"; exit 2; }

pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sim_port=$(free_port)
gw_port=$(free_port)
"$ag_bin" --engine sim --listen "127.0.0.1:$sim_port" --model sim-model --slots 4 \
  --prefill-tps 4000 --decode-tps 400 --id slow-sim >"$out/sim.log" 2>&1 &
pids+=($!)
cat >"$out/gateway.json" <<JSON
{
  "listen": [{"address": "127.0.0.1:$gw_port"}],
  "limits": {"header_timeout_s": $header_timeout, "idle_timeout_s": 30, "max_connections": 10000},
  "health": {"interval_s": 1, "timeout_s": 1, "rise": 1, "fall": 2},
  "upstream": {"allow_http": true, "allow_addresses": ["127.0.0.0/8"]},
  "log_level": "warn",
  "replicas": [{"id": "slow-sim", "url": "http://127.0.0.1:$sim_port", "models": ["sim-model"],
                "slots": 4, "prefill_tps": 4000, "decode_tps": 400}]
}
JSON
"$gw_bin" --config "$out/gateway.json" >"$out/gateway.log" 2>&1 &
pids+=($!)
gw_pid=$!
ready=0
for _ in $(seq 1 100); do
  if curl -sf -m 1 "http://127.0.0.1:$gw_port/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" = 1 ] || { echo "slowloris: the gateway did not become ready"; cat "$out/gateway.log"; exit 2; }

chat='{"model":"sim-model","messages":[{"role":"user","content":"are you there?"}],"max_tokens":4}'
# normal client: one chat request every 0.25 s until the stop file appears (bounded)
normal() { # LOGFILE
  for _ in $(seq 1 100000); do
    [ -e "$out/stop" ] && break
    curl -s -o /dev/null -m 10 -w '%{http_code} %{time_total}\n' -H 'Content-Type: application/json' \
      -d "$chat" "http://127.0.0.1:$gw_port/v1/chat/completions" >>"$1" || echo "000 10" >>"$1"
    sleep 0.25
  done
}

url="http://127.0.0.1:$gw_port"
declare -A args=(
  [slowloris]="-H -c $conns -r $rate -i 1 -x 24 -u $url/v1/models"
  [slowbody]="-B -c $conns -r $rate -i 1 -x 24 -s 65536 -t POST -f application/json -u $url/v1/chat/completions"
  [slowread]="-X -c $((conns / 4)) -r $((rate / 4)) -k 10 -n 2 -w 1 -y 32 -z 8 -u $url/v1/models"
)
status=0
summary="$out/summary.txt"
: >"$summary"
for mode in slowloris slowbody slowread; do
  rm -f "$out/stop"
  : >"$out/$mode.normal"
  normal "$out/$mode.normal" &
  npid=$!
  # shellcheck disable=SC2086
  timeout $((secs + 60)) slowhttptest ${args[$mode]} -l "$secs" -p 3 -g -o "$out/$mode" \
    >"$out/$mode.stdout" 2>&1 || true
  touch "$out/stop"
  wait "$npid" || true
  kill -0 "$gw_pid" 2>/dev/null || { echo "slowloris: the gateway died during $mode"; status=1; break; }
  python3 - "$mode" "$out/$mode.normal" "$out/$mode.csv" "$max_latency" >>"$summary" <<'PY' || status=1
import csv, sys
mode, normal, stats, max_lat = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rows = [l.split() for l in open(normal) if l.strip()]
codes = [r[0] for r in rows]
lat = sorted(float(r[1]) for r in rows)
ok = codes.count("200")
try:
    table = list(csv.reader(open(stats)))
    head, data = table[0], table[1:]
    col = {h.strip().lower(): i for i, h in enumerate(head)}
    conn = max(int(float(r[col["connected"]])) for r in data)
    avail = [r[col["service available"]] for r in data]
    down = sum(1 for a in avail if a.strip() in ("0", "NO", "no"))
    closed = max(int(float(r[col["closed"]])) for r in data)
except (OSError, KeyError, IndexError, ValueError) as e:
    conn, down, closed = -1, -1, -1
    print(f"{mode}: no slowhttptest statistics ({e!r})")
p50 = lat[len(lat) // 2] if lat else 0.0
print(f"{mode}: normal client {ok}/{len(rows)} answered 200, latency p50 {p50:.3f} s, "
      f"max {lat[-1] if lat else 0:.3f} s; slowhttptest: most connections open at once "
      f"{conn}, closed by the server {closed}, seconds the probe found the service "
      f"unavailable {down}")
bad = (not rows or ok != len(rows) or (lat and lat[-1] > max_lat) or down != 0)
sys.exit(1 if bad else 0)
PY
done
cat "$summary"
echo "slowloris: details in $out (slowhttptest's *.html and *.csv, gateway.log)"
[ "$status" = 0 ] && echo "slowloris: PASS" || echo "slowloris: FAIL"
exit "$status"
