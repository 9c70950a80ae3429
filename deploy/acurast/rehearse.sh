#!/usr/bin/env bash
# A rehearsal of an Acurast deployment on this machine, before paying for phones: the
# deployment folder that make-deployment.sh makes is run here as a phone would run it,
# against a local gateway, with a stand-in for Acurast's bridge socket and tunnel relay
# (tests/system/acubridge.py) and a local download server playing GitHub and Hugging Face.
#
#   deploy/acurast/rehearse.sh                  llama-server and its model (below), or the
#                                               sim when they cannot run here
#   deploy/acurast/rehearse.sh --engine sim     the simulated phone: nothing downloaded
#   deploy/acurast/rehearse.sh --stay           keep everything up until Ctrl-C (the status
#                                               page's URL and admin token are printed)
#   deploy/acurast/rehearse.sh --phone-mem-mb 7474
#                                               a phone of that much memory (MemTotal, e.g.
#                                               an 8 GB one): it refuses a model too big for
#                                               it, listed with the gateway's refused
#                                               registrations
#
# Options: --engine llama|sim, --llama-server FILE and --gguf FILE (default: llama-server
# and tiny.gguf of ../shared/engines/llama-server beside this tree), --model NAME (the name
# clients ask for; default rehearsal-model), --model-bytes N (the size the phone checks
# against; default the GGUF's), --dir DIR (where everything goes; default a new folder in
# /tmp, kept afterwards with the logs), --stay, --phone-mem-mb N. FLEETGATE_BIN and
# FLEETGATE_AGENT_BIN name the binaries (default build/). Needs python3 with the
# `cryptography` module (Debian: python3-cryptography) for the bridge's certificates.
#
# What runs: the gateway (heartbeats on, the bridge's CA trusted for the tunnel's TLS), the
# bridge double, the download server, then the folder's run.sh with BRIDGE_SOCKET and the
# fleet secret, as Acurast would run it. Once the phone is ready, one chat request goes
# through the gateway, the tunnel and the phone's agent to its engine, and the answer is
# printed. The x86-64 agent of build/ stands in for the phones' aarch64 one.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "rehearse: $*"; }
die() { echo "rehearse: $*" >&2; exit 2; }

ENGINE="" STAY=0 DIR="" MODEL=rehearsal-model MODEL_BYTES="" PHONE_MEM_MB=""
LLAMA_SERVER=$ROOT/../shared/engines/llama-server/llama-server
GGUF=$ROOT/../shared/engines/llama-server/tiny.gguf
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --stay) STAY=1; shift; continue ;;
  esac
  [ $# -ge 2 ] || die "$1 needs a value (see --help)"
  case "$1" in
    --engine) ENGINE=$2 ;; --dir) DIR=$2 ;; --model) MODEL=$2 ;; --model-bytes) MODEL_BYTES=$2 ;;
    --llama-server) LLAMA_SERVER=$2 ;; --gguf) GGUF=$2 ;; --phone-mem-mb) PHONE_MEM_MB=$2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done

GATEWAY=${FLEETGATE_BIN:-$ROOT/build/gateway/fleetgate}
AGENT=${FLEETGATE_AGENT_BIN:-$ROOT/build/agent/fleetgate-agent}
PY=/usr/bin/python3
[ -x "$GATEWAY" ] && [ -x "$AGENT" ] || die "build first: meson setup build && meson compile -C build (or set FLEETGATE_BIN, FLEETGATE_AGENT_BIN)"
[ -x "$PY" ] || PY=python3
"$PY" -c 'import cryptography' 2>/dev/null || die "python3 lacks the cryptography module (apt-get install python3-cryptography)"
[[ $MODEL =~ ^[A-Za-z0-9._-]{1,64}$ ]] || die "--model: 1-64 of A-Z a-z 0-9 . _ -"
[ -z "$MODEL_BYTES" ] || [[ $MODEL_BYTES =~ ^[0-9]{1,16}$ ]] || die "--model-bytes: a size in bytes"
[ -z "$PHONE_MEM_MB" ] || [[ $PHONE_MEM_MB =~ ^[0-9]{1,9}$ ]] || die "--phone-mem-mb: MiB"

# llama-server when it runs here (x86-64 with AVX2: the shared build), else the sim
llama_runs() { [ -x "$LLAMA_SERVER" ] && [ -f "$GGUF" ] && "$LLAMA_SERVER" --version >/dev/null 2>&1; }
case "$ENGINE" in
  "") if llama_runs; then ENGINE=llama; else ENGINE=sim; say "no llama-server that runs here ($LLAMA_SERVER): the sim plays the phone"; fi ;;
  llama) llama_runs || die "--engine llama: $LLAMA_SERVER does not run here, or $GGUF is missing (--llama-server, --gguf)" ;;
  sim) ;;
  *) die "--engine: llama or sim" ;;
esac

if [ -z "$DIR" ]; then DIR=$(mktemp -d /tmp/fleetgate-rehearsal.XXXXXX); fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  say "stopped; logs and files are in $DIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# five free loopback ports: gateway, admin, the phone's agent, its llama-server, downloads;
# drawn at random below the kernel's ephemeral range (32768 up), which outgoing
# connections take theirs from, and each checked free
pick_ports() {
  "$PY" - <<'EOF'
import random, socket
socks = []
while len(socks) < 5:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(20000, 32768)))
        socks.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}
read -r P_GW P_ADMIN P_AGENT P_LLAMA P_FILES < <(pick_ports)

SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
ADMIN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export FLEETGATE_FLEET_SECRET=$SECRET REHEARSAL_ADMIN_TOKEN=$ADMIN_TOKEN

# Acurast's bridge socket and tunnel relay (the double): its CA signs the tunnel's TLS
mkdir -p "$DIR/bridge"
"$PY" "$ROOT/tests/system/acubridge.py" "$DIR/bridge" >"$DIR/bridge.out" 2>"$DIR/bridge.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$DIR/bridge.out" ] && break; sleep 0.1; done
read -r BRIDGE_SOCKET BRIDGE_CA < <("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["socket"], d["ca"])' "$DIR/bridge.out") ||
  die "the bridge double did not start: $(cat "$DIR/bridge.log")"

# the gateway: heartbeats on, the tunnel's loopback addresses and the bridge's CA allowed
"$PY" - "$DIR/gateway.json" "$P_GW" "$P_ADMIN" "$BRIDGE_CA" <<'EOF'
import json, sys
out, gw, admin, ca = sys.argv[1:]
json.dump({
    "listen": [{"address": f"127.0.0.1:{gw}"}],
    "admin": {"listen": f"127.0.0.1:{admin}", "token_env": "REHEARSAL_ADMIN_TOKEN"},
    "fleet": {"secret_env": "FLEETGATE_FLEET_SECRET", "heartbeat_timeout_s": 60},
    "health": {"interval_s": 1, "timeout_s": 3, "rise": 1, "fall": 2, "readyz_counts": True},
    "upstream": {"ca_file": ca, "allow_http": True, "allow_addresses": ["127.0.0.0/8", "::1/128"]},
    "queue": {"max": 100, "timeout_s": 120},
    "replicas": [],
}, open(out, "w"), indent=1)
EOF
up() { "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1" >/dev/null 2>&1; }
for attempt in 1 2 3; do
  "$GATEWAY" --config "$DIR/gateway.json" >"$DIR/gateway.log" 2>&1 &
  gw=$!
  for _ in $(seq 100); do up "http://127.0.0.1:$P_ADMIN/healthz" && break; kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
  if up "http://127.0.0.1:$P_ADMIN/healthz"; then pids+=("$gw"); break; fi
  kill "$gw" 2>/dev/null || true
  wait "$gw" 2>/dev/null || true
  # another program took a port meanwhile: other ones
  [ "$attempt" -lt 3 ] && grep -q "address already in use" "$DIR/gateway.log" ||
    die "the gateway did not start: $(tail -5 "$DIR/gateway.log")"
  read -r P_GW P_ADMIN P_AGENT P_LLAMA P_FILES < <(pick_ports)
  "$PY" - "$DIR/gateway.json" "$P_GW" "$P_ADMIN" <<'EOF'
import json, sys
out, gw, admin = sys.argv[1:]
c = json.load(open(out))
c["listen"][0]["address"] = f"127.0.0.1:{gw}"
c["admin"]["listen"] = f"127.0.0.1:{admin}"
json.dump(c, open(out, "w"), indent=1)
EOF
done
say "gateway on http://127.0.0.1:$P_GW (log: $DIR/gateway.log)"

# what the phone downloads, from a local server: a llama.cpp-style release archive of
# llama-server, and the model
KIT_ARGS=()
if [ "$ENGINE" = llama ]; then
  mkdir -p "$DIR/files/rel/build/bin"
  cp "$LLAMA_SERVER" "$DIR/files/rel/build/bin/llama-server"
  tar -czf "$DIR/files/llama-rehearsal-bin-x64.tar.gz" -C "$DIR/files/rel" build
  rm -rf "$DIR/files/rel"
  cp "$GGUF" "$DIR/files/$MODEL.gguf"
  (cd "$DIR/files" && exec "$PY" -m http.server --bind 127.0.0.1 "$P_FILES") >"$DIR/files.log" 2>&1 &
  pids+=($!)
  sha() { sha256sum "$1" | cut -d' ' -f1; }
  KIT_ARGS+=(--llama-url "http://127.0.0.1:$P_FILES/llama-rehearsal-bin-x64.tar.gz"
             --llama-sha256 "$(sha "$DIR/files/llama-rehearsal-bin-x64.tar.gz")"
             --model-url "http://127.0.0.1:$P_FILES/$MODEL.gguf" --model-sha256 "$(sha "$DIR/files/$MODEL.gguf")"
             --model-bytes "${MODEL_BYTES:-$(stat -c %s "$DIR/files/$MODEL.gguf")}"
             --parallel 2 --ctx 2048 --threads 1,2 --llama-arg --jinja)
else
  KIT_ARGS+=(--engine sim --sim-args "--slots 2 --prefill-tps 400 --decode-tps 40 --time-scale 5")
fi

# the deployment folder, as for Acurast (the image is not used here: the phone is this machine);
# the phone's two ports are fixed in it, so they are picked again if taken meanwhile
free_now() { "$PY" -c 'import socket,sys
for p in sys.argv[1:]:
    s = socket.socket(); s.bind(("127.0.0.1", int(p))); s.close()' "$@" 2>/dev/null; }
for _ in 1 2 3; do
  free_now "$P_AGENT" "$P_LLAMA" && break
  read -r _ _ P_AGENT P_LLAMA _ < <(pick_ports)
done
[ "$ENGINE" = sim ] || KIT_ARGS+=(--llama-port "$P_LLAMA")
rm -rf "$DIR/kit"
"$ROOT/deploy/acurast/make-deployment.sh" --out "$DIR/kit" --arch x86_64 --agent "$AGENT" \
  --gateway "http://127.0.0.1:$P_GW" --model "$MODEL" --id-prefix rehearsal \
  --image-url https://example.invalid/not-used-in-a-rehearsal.tar.xz --image-sha256 "$(printf '0%.0s' $(seq 64))" \
  --max-cost 3990000000000 --days 7 --cost-per-day 0.57 --listen-port "$P_AGENT" \
  --tunnel-relay relay.rehearsal.invalid:4433 --tunnel-domain localhost "${KIT_ARGS[@]}" >"$DIR/make-deployment.log"
say "deployment folder: $DIR/kit (acurast.json, deployment/, NEXT-STEPS.txt)"

# the phone: run.sh as Acurast runs it, in a fresh home, with the bridge and the secret
PHONE_ENV=(BRIDGE_SOCKET="$BRIDGE_SOCKET" FLEETGATE_FLEET_SECRET="$SECRET" HOME="$DIR/phone-home" FLEETGATE_TUNNEL_KEY=)
rm -rf "$DIR/phone-home"
mkdir -p "$DIR/phone-home"
if [ -n "$PHONE_MEM_MB" ]; then
  # the agent reads the phone's memory from FLEETGATE_AGENT_SYSROOT/proc/meminfo
  mkdir -p "$DIR/phone-root/proc"
  printf 'MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n' $((PHONE_MEM_MB * 1024)) \
    $((PHONE_MEM_MB * 256)) $((PHONE_MEM_MB * 512)) >"$DIR/phone-root/proc/meminfo"
  PHONE_ENV+=(FLEETGATE_AGENT_SYSROOT="$DIR/phone-root")
fi
env -u FLEETGATE_REPLICA_TOKEN "${PHONE_ENV[@]}" /bin/sh "$DIR/kit/deployment/run.sh" >"$DIR/phone.log" 2>&1 &
phone=$!
pids+=($phone)
say "the phone runs $DIR/kit/deployment/run.sh (log: $DIR/phone.log)"

ready() {
  "$PY" -c 'import json,sys,urllib.request; sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[1], timeout=2)).get("replicas_ready", 0) >= 1 else 1)' \
    "http://127.0.0.1:$P_GW/readyz" 2>/dev/null
}
admin() {
  "$PY" -c 'import sys,urllib.request; print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]}), timeout=5).read().decode())' \
    "http://127.0.0.1:$P_ADMIN$1" "$ADMIN_TOKEN"
}
deadline=$((SECONDS + 180))
while ! ready; do
  if ! kill -0 "$phone" 2>/dev/null; then
    rc=0
    wait "$phone" || rc=$?
    pids=("${pids[@]/$phone}")
    say "the phone's run ended (status $rc) before it joined:"
    tail -n 5 "$DIR/phone.log" | sed 's/^/  /'
    say "the gateway's refused registrations:"
    refused=$(admin /admin/v1/status | "$PY" -c 'import json,sys; [print("  " + e["id"] + ": " + e["reason"]) for e in json.load(sys.stdin)["refused_registrations"]]')
    echo "${refused:-  (none)}"
    if [ "$STAY" = 1 ]; then
      say "status page: http://127.0.0.1:$P_ADMIN/  (admin token: $ADMIN_TOKEN); Ctrl-C stops it"
      while :; do sleep 3600; done
    fi
    # a phone made too small with --phone-mem-mb was meant to be refused
    if [ -n "$PHONE_MEM_MB" ] && [ "$rc" = 0 ] && [[ $refused == *"cannot_hold"* ]]; then
      say "done: the phone refused the model, as a phone of $PHONE_MEM_MB MiB should"
      exit 0
    fi
    exit 1
  fi
  [ $SECONDS -lt $deadline ] || die "the phone did not join within 180 s (see $DIR/phone.log and $DIR/gateway.log)"
  sleep 0.5
done
say "the phone joined: $(admin /admin/v1/replicas | "$PY" -c 'import json,sys; r=json.load(sys.stdin)["replicas"][0]; print(r["id"], "at", r["url"], "-", r["state"])')"

# one request through the gateway, the tunnel and the phone's agent to its engine
"$PY" - "http://127.0.0.1:$P_GW" "$MODEL" <<'EOF'
import json, sys, urllib.request
url, model = sys.argv[1:]
body = json.dumps({"model": model, "max_tokens": 12,
                   "messages": [{"role": "user", "content": "Say hello to the rehearsal."}]}).encode()
req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    ans = json.load(r)
    print(f"rehearse: answered by {r.headers['x-fleetgate-replica']}: {ans['choices'][0]['message']['content']!r} "
          f"({ans['usage']['prompt_tokens']} prompt tokens, {ans['usage']['completion_tokens']} generated)")
EOF

if [ "$STAY" = 1 ]; then
  say "status page: http://127.0.0.1:$P_ADMIN/  (admin token: $ADMIN_TOKEN)"
  say "clients: http://127.0.0.1:$P_GW/v1/chat/completions, model $MODEL; Ctrl-C stops everything"
  while :; do sleep 3600; done
fi
say "done"
