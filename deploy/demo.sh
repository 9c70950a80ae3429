#!/usr/bin/env bash
# The main job in one command: install what is missing, build, start a simulated fleet
# of three phones (classes from tests/bench/fleet-profiles.json), put the gateway in
# front of it, and send it a real chat request (whole, then streamed).
# The admin listener serves the status page on http://127.0.0.1:9090/ with a token made
# for the demo (config/demo-admin-token); the demo prints both.
#   deploy/demo.sh           run the demo and stop everything afterwards
#   deploy/demo.sh --serve   keep the fleet, the gateway and the status page up until Ctrl-C
# For tests: FLEETGATE_DEMO_DIR (where the generated files go, default config/),
# FLEETGATE_DEMO_PORTS ("HTTPS HTTP ADMIN PHONE1 PHONE2 PHONE3"), FLEETGATE_BIN and
# FLEETGATE_AGENT_BIN (the binaries), FLEETGATE_DEMO_NO_SETUP=1 (skip deploy/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
serve=0
[ "${1:-}" = "--serve" ] && serve=1

[ "${FLEETGATE_DEMO_NO_SETUP:-}" = 1 ] || deploy/setup.sh
gateway=${FLEETGATE_BIN:-build/gateway/fleetgate}
agent=${FLEETGATE_AGENT_BIN:-build/agent/fleetgate-agent}
dir=${FLEETGATE_DEMO_DIR:-config}
read -r https http admin p1 p2 p3 <<<"${FLEETGATE_DEMO_PORTS:-8443 8080 9090 18101 18102 18103}"
conf=config/demo.json
if [ "$dir" != config ] || [ -n "${FLEETGATE_DEMO_PORTS:-}" ]; then
  # the same configuration on other ports, beside its generated files
  mkdir -p "$dir"
  conf="$dir/demo.json"
  python3 - "$conf" "$https" "$http" "$admin" "$p1" "$p2" "$p3" <<'PY'
import json, sys
out, https, http, admin, *phones = sys.argv[1:]
c = json.load(open("config/demo.json"))
c["listen"][0]["address"] = f"127.0.0.1:{https}"
c["listen"][1]["address"] = f"127.0.0.1:{http}"
c["admin"]["listen"] = f"127.0.0.1:{admin}"
for r, p in zip(c["replicas"], phones):
    r["url"] = f"http://127.0.0.1:{p}"
json.dump(c, open(out, "w"), indent=1)
PY
fi

work=$(mktemp -d /tmp/fleetgate-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped; logs were in $work"
}
# once, at the exit: a signal only ends the script (a trap on it as well ran cleanup twice)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# a self-signed certificate for the HTTPS listener (config/demo.json points at it)
if [ ! -f "$dir/demo-tls/cert.pem" ]; then
  mkdir -p "$dir/demo-tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -keyout "$dir/demo-tls/key.pem" -out "$dir/demo-tls/cert.pem" -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
fi
cacert="$dir/demo-tls/cert.pem"
# the admin token for the status page and the admin API (admin.token_env in the config)
if [ ! -s "$dir/demo-admin-token" ]; then
  (umask 077; openssl rand -hex 24 > "$dir/demo-admin-token")
fi
FLEETGATE_ADMIN_TOKEN=$(cat "$dir/demo-admin-token")
export FLEETGATE_ADMIN_TOKEN

for p in "$https" "$http" "$admin" "$p1" "$p2" "$p3"; do
  if port_busy "$p"; then echo "demo: port $p is in use; stop what uses it first" >&2; exit 1; fi
done

# id port slots prefill-tps decode-tps
# each with a models folder of its own, whose free storage it reports (docs/agent.md)
while read -r id port slots pre dec; do
  mkdir -p "$work/models-$id"
  "$agent" --engine sim --listen "127.0.0.1:$port" --model qwen3.5-0.8b --id "$id" \
    --slots "$slots" --prefill-tps "$pre" --decode-tps "$dec" --n-ctx 8192 \
    --models-dir "$work/models-$id" >"$work/$id.log" 2>&1 &
  pids+=($!)
done <<FLEET
flagship-01 $p1 4 466.7 40
midrange-01 $p2 2 256.7 22
budget-01 $p3 4 140 11.5
FLEET

mkdir -p "$dir/demo-data" # the Batch API's files and database (data_dir in config/demo.json)
"$gateway" --config "$conf" >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do port_busy "$https" && break; sleep 0.1; done
# the phones are taken into rotation by their first health check
for _ in $(seq 1 50); do
  curl -s --cacert "$cacert" "https://localhost:$https/readyz" | grep -q '"replicas_ready":3' && break
  sleep 0.1
done

echo "demo: gateway on https://localhost:$https (and http://127.0.0.1:$http) in front of 3 simulated phones"
echo "demo: status page: http://127.0.0.1:$admin/  (admin token: $FLEETGATE_ADMIN_TOKEN, kept in $dir/demo-admin-token)"
echo
echo "\$ curl --cacert $cacert https://localhost:$https/v1/chat/completions -d '{\"model\":\"qwen3.5-0.8b\",...}'"
curl -sS --fail-with-body --cacert "$cacert" -D "$work/headers.txt" \
  "https://localhost:$https/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"qwen3.5-0.8b","max_tokens":24,"messages":[{"role":"system","content":"You review card transactions for fraud. Answer with RISK_LEVEL: 1-5."},{"role":"user","content":"Card used in Lisbon at 09:12 and in Singapore at 09:40, 3 purchases of gift cards."}]}'
echo
grep -i -E '^(x-request-id|x-fleetgate-replica):' "$work/headers.txt"
echo
echo "\$ curl -N --cacert $cacert https://localhost:$https/... \"stream\":true"
curl -sS -N --fail-with-body --cacert "$cacert" "https://localhost:$https/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"qwen3.5-0.8b","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"Say hello to the fleet."}]}' \
  | python3 -c '
import json, sys
events = [l[6:].strip() for l in sys.stdin if l.startswith("data: ")]
text = "".join((json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
               for e in events if e != "[DONE]")
print(f"{len(events)} events, ending with {events[-1]}; text:{text}")'
echo
echo "demo: the gateway's access log:"
grep '"msg":"request"' "$work/gateway.log" || true
if [ "$serve" = 1 ]; then
  echo "demo: serving until Ctrl-C (try: curl --cacert $cacert https://localhost:$https/v1/models)"
  echo "demo: status page: http://127.0.0.1:$admin/  (admin token: $FLEETGATE_ADMIN_TOKEN)"
  wait
fi
