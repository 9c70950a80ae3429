#!/usr/bin/env bash
# The main job in one command: install what is missing, build, start a simulated fleet
# of three phones (classes from tests/bench/fleet-profiles.json), put the gateway in
# front of it, and send it a real chat request (whole, then streamed).
#   deploy/demo.sh           run the demo and stop everything afterwards
#   deploy/demo.sh --serve   keep the fleet and the gateway running until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."
serve=0
[ "${1:-}" = "--serve" ] && serve=1

deploy/setup.sh

work=$(mktemp -d /tmp/fleetgate-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped; logs were in $work"
}
trap cleanup EXIT INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# a self-signed certificate for the HTTPS listener (config/demo.json points at it)
if [ ! -f config/demo-tls/cert.pem ]; then
  mkdir -p config/demo-tls
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -keyout config/demo-tls/key.pem -out config/demo-tls/cert.pem -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
fi

for p in 8443 8080 18101 18102 18103; do
  if port_busy "$p"; then echo "demo: port $p is in use; stop what uses it first" >&2; exit 1; fi
done

agent=build/agent/fleetgate-agent
# id port slots prefill-tps decode-tps
while read -r id port slots pre dec; do
  "$agent" --engine sim --listen "127.0.0.1:$port" --model qwen3.5-0.8b --id "$id" \
    --slots "$slots" --prefill-tps "$pre" --decode-tps "$dec" --n-ctx 8192 \
    >"$work/$id.log" 2>&1 &
  pids+=($!)
done <<'FLEET'
flagship-01 18101 4 466.7 40
midrange-01 18102 2 256.7 22
budget-01 18103 4 140 11.5
FLEET

mkdir -p config/demo-data # the Batch API's files and database (data_dir in config/demo.json)
build/gateway/fleetgate --config config/demo.json >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do port_busy 8443 && break; sleep 0.1; done
# the phones are taken into rotation by their first health check
for _ in $(seq 1 50); do
  curl -s --cacert config/demo-tls/cert.pem https://localhost:8443/readyz | grep -q '"replicas_ready":3' && break
  sleep 0.1
done

echo "demo: gateway on https://localhost:8443 (and http://127.0.0.1:8080) in front of 3 simulated phones"
echo
echo "\$ curl --cacert config/demo-tls/cert.pem https://localhost:8443/v1/chat/completions -d '{\"model\":\"qwen3.5-0.8b\",...}'"
curl -sS --fail-with-body --cacert config/demo-tls/cert.pem -D "$work/headers.txt" \
  https://localhost:8443/v1/chat/completions \
  -H 'Content-Type: application/json' \
  -d '{"model":"qwen3.5-0.8b","max_tokens":24,"messages":[{"role":"system","content":"You review card transactions for fraud. Answer with RISK_LEVEL: 1-5."},{"role":"user","content":"Card used in Lisbon at 09:12 and in Singapore at 09:40, 3 purchases of gift cards."}]}'
echo
grep -i -E '^(x-request-id|x-fleetgate-replica):' "$work/headers.txt"
echo
echo "\$ curl -N --cacert config/demo-tls/cert.pem https://localhost:8443/... \"stream\":true"
curl -sS -N --fail-with-body --cacert config/demo-tls/cert.pem https://localhost:8443/v1/chat/completions \
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
  echo "demo: serving until Ctrl-C (try: curl --cacert config/demo-tls/cert.pem https://localhost:8443/v1/models)"
  wait
fi
