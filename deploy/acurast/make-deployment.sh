#!/bin/bash
# Turns an operator's values into a folder ready for `acurast deploy`: fleetgate phones on
# Acurast's Shell runtime that fetch llama-server and the model, open their tunnel and
# join the gateway by themselves (docs/phones.md walks through it).
#
#   OUT/acurast.json          the manifest (deploy/acurast/acurast.template.json filled in)
#   OUT/deployment/           what Acurast zips and uploads (fileUrl):
#       run.sh                the entry script (deploy/acurast/run.sh)
#       fleetgate-agent       the static agent for the phones (aarch64 unless --arch)
#       libfgifaddrs.so       the getifaddrs shim llama-server needs under PRoot
#       ca.pem                certificates the agent checks downloads (and an https gateway) with
#       gateway-ca.pem        only with --gateway-ca: the CA of a privately signed gateway
#       kit.conf              the values below, for run.sh
#   OUT/NEXT-STEPS.txt        what to export and run next: the secrets, the memory a phone
#                             needs for the model, the cost cap in ACU
#
# Secrets are never written: only their names go into includeEnvironmentVariables, and
# Acurast sends their values, encrypted per phone, from the deploying shell's environment.
#
# usage: deploy/acurast/make-deployment.sh --out DIR --gateway URL --model NAME
#          --image-url URL --image-sha256 HEX --max-cost N
#          [--engine llama] --model-url URL --model-sha256 HEX --llama-url URL --llama-sha256 HEX
#          [--model-bytes N] [--need-mem-mb N]
#          [--engine sim [--sim-args "..."]]
#          [--replicas N] [--days D] [--network mainnet|canary] [--project NAME]
#          [--secret-env NAME]... [--keep-url] [--parallel N] [--ctx N] [--threads auto|LIST]
#          [--llama-arg ARG]... [--listen-port P] [--llama-port P] [--id-prefix P]
#          [--tunnel-relay HOST:PORT]... [--tunnel-domain SUFFIX]
#          [--gateway-ca FILE] [--ca-bundle FILE] [--agent FILE] [--arch arm64|x86_64]
#          [--cost-per-day X]
# --max-cost is maxCostPerExecution: the most one phone is paid for its whole run (one
# execution of --days days), in ACU's smallest unit (1 ACU = 10^12): 0.57 ACU a day for 7
# days is 3990000000000. --model-bytes is the GGUF's size (asked of --model-url with a HEAD
# request when left out): each phone checks that it can hold the model before downloading.
# See docs/phones.md for each value; --help prints this.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=$ROOT/deploy/acurast
die() { echo "make-deployment: $*" >&2; exit 2; }

OUT="" GATEWAY="" MODEL="" IMAGE_URL="" IMAGE_SHA="" MAX_COST="" ENGINE=llama
MODEL_URL="" MODEL_SHA="" LLAMA_URL="" LLAMA_SHA="" SIM_ARGS="--slots 2 --prefill-tps 60 --decode-tps 8"
REPLICAS=1 DAYS=7 NETWORK=mainnet PROJECT="" KEEP_URL=0 PARALLEL=1 CTX=8192 THREADS=auto
LISTEN_PORT=3000 LLAMA_PORT=8081 ID_PREFIX="" DOMAIN="" GATEWAY_CA="" AGENT="" ARCH=arm64
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt START_DELAY_MS=600000 COST_PER_DAY="" MODEL_BYTES="" NEED_MEM_MB=""
SECRETS=(FLEETGATE_FLEET_SECRET) RELAYS=() LLAMA_ARGS=()
while [ $# -gt 0 ]; do
  [ "$1" = --help ] || [ "$1" = -h ] && { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
  [ "$1" = --keep-url ] && { KEEP_URL=1; shift; continue; }
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --out) OUT=$2 ;; --gateway) GATEWAY=$2 ;; --model) MODEL=$2 ;;
    --image-url) IMAGE_URL=$2 ;; --image-sha256) IMAGE_SHA=$2 ;; --max-cost) MAX_COST=$2 ;;
    --engine) ENGINE=$2 ;; --model-url) MODEL_URL=$2 ;; --model-sha256) MODEL_SHA=$2 ;;
    --llama-url) LLAMA_URL=$2 ;; --llama-sha256) LLAMA_SHA=$2 ;; --sim-args) SIM_ARGS=$2 ;;
    --replicas) REPLICAS=$2 ;; --days) DAYS=$2 ;; --network) NETWORK=$2 ;; --project) PROJECT=$2 ;;
    --secret-env) SECRETS+=("$2") ;; --parallel) PARALLEL=$2 ;; --ctx) CTX=$2 ;;
    --threads) THREADS=$2 ;; --llama-arg) LLAMA_ARGS+=("$2") ;; --listen-port) LISTEN_PORT=$2 ;;
    --llama-port) LLAMA_PORT=$2 ;; --id-prefix) ID_PREFIX=$2 ;; --tunnel-relay) RELAYS+=("$2") ;;
    --tunnel-domain) DOMAIN=$2 ;; --gateway-ca) GATEWAY_CA=$2 ;; --ca-bundle) CA_BUNDLE=$2 ;;
    --agent) AGENT=$2 ;; --arch) ARCH=$2 ;; --cost-per-day) COST_PER_DAY=$2 ;;
    --model-bytes) MODEL_BYTES=$2 ;; --need-mem-mb) NEED_MEM_MB=$2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done

# ---- the values, checked before anything is written --------------------------------------
is_url() { [[ $1 =~ ^https?://[A-Za-z0-9._~:/?#@!\$\&\(\)*+,\;=%-]+$ ]] && [ ${#1} -lt 1024 ]; }
is_https() { [[ $1 == https://* ]] && is_url "$1"; }
is_sha() { [[ $1 =~ ^[0-9a-fA-F]{64}$ ]]; }
is_int() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
is_name() { [[ $1 =~ ^[A-Za-z0-9._-]{1,$2}$ ]]; }

[ -n "$OUT" ] || die "--out DIR is required"
is_url "$GATEWAY" || die "--gateway must be the gateway's http(s):// URL (phones reach it over the internet: use https)"
is_name "$MODEL" 64 || die "--model: the model name the gateway routes by (1-64 of A-Z a-z 0-9 . _ -)"
is_https "$IMAGE_URL" || die "--image-url: the https URL of an aarch64 proot-distro image (.tar.xz; docs/phones.md)"
is_sha "$IMAGE_SHA" || die "--image-sha256: the image's SHA-256 (64 hex digits)"
is_int "$MAX_COST" 1 999999999999999999 || die "--max-cost: maxCostPerExecution in the smallest ACU unit (a whole number > 0)"
is_int "$REPLICAS" 1 10000 || die "--replicas: how many phones (1-10000)"
is_int "$DAYS" 1 365 || die "--days: how long each execution may run (1-365)"
is_int "$PARALLEL" 1 16 || die "--parallel: requests served at once per phone (1-16)"
is_int "$CTX" 256 262144 || die "--ctx: context tokens per slot (256-262144)"
is_int "$LISTEN_PORT" 1024 65535 || die "--listen-port: 1024-65535 (the runtime cannot bind below 1024)"
is_int "$LLAMA_PORT" 1024 65535 || die "--llama-port: 1024-65535"
[ "$LISTEN_PORT" != "$LLAMA_PORT" ] || die "--listen-port and --llama-port must differ"
[ -z "$COST_PER_DAY" ] || [[ $COST_PER_DAY =~ ^[0-9]{1,9}(\.[0-9]{1,9})?$ ]] ||
  die "--cost-per-day: what a phone costs per day in the gateway's currency, e.g. 0.57"
[ "$THREADS" = auto ] || [[ $THREADS =~ ^[0-9]{1,4}(,[0-9]{1,4}){0,7}$ ]] || die "--threads: auto or a list like 4,6,8"
case "$NETWORK" in
  mainnet) DEF_RELAY=relay-1.mainnet.acurast.com:4433 DEF_DOMAIN=acu.run ;;
  canary) DEF_RELAY=relay-2.canary.acurast.com:4433 DEF_DOMAIN=canary.acu.run ;;
  *) die "--network: mainnet or canary" ;;
esac
[ ${#RELAYS[@]} -gt 0 ] || RELAYS=("$DEF_RELAY")
DOMAIN=${DOMAIN:-$DEF_DOMAIN}
for r in "${RELAYS[@]}"; do [[ $r =~ ^[A-Za-z0-9.-]{1,253}:[0-9]{1,5}$ ]] || die "--tunnel-relay: HOST:PORT, not '$r'"; done
[[ $DOMAIN =~ ^[A-Za-z0-9.-]{1,200}$ ]] || die "--tunnel-domain: a domain name, not '$DOMAIN'"
PROJECT=${PROJECT:-fleetgate-$MODEL}
is_name "$PROJECT" 64 || die "--project: 1-64 of A-Z a-z 0-9 . _ -"
ID_PREFIX=${ID_PREFIX:-$PROJECT}
is_name "$ID_PREFIX" 48 || die "--id-prefix: 1-48 of A-Z a-z 0-9 . _ - (the phone's id is PREFIX-xxxxxxxx)"
case "$ENGINE" in
  llama)
    is_url "$MODEL_URL" || die "--model-url: where phones download the GGUF"
    is_sha "$MODEL_SHA" || die "--model-sha256: the GGUF's SHA-256 (sha256sum model.gguf)"
    is_url "$LLAMA_URL" || die "--llama-url: a llama.cpp release for ubuntu-arm64 (llama-<tag>-bin-ubuntu-arm64.tar.gz)"
    is_sha "$LLAMA_SHA" || die "--llama-sha256: that archive's SHA-256"
    [ -z "$MODEL_BYTES" ] || is_int "$MODEL_BYTES" 1 1125899906842624 ||
      die "--model-bytes: the GGUF's size in bytes (stat -c %s model.gguf)"
    [ -z "$NEED_MEM_MB" ] || is_int "$NEED_MEM_MB" 1 100000000 ||
      die "--need-mem-mb: the memory a phone must give the model, in MiB" ;;
  sim)
    [[ $SIM_ARGS =~ ^[A-Za-z0-9.,_\ -]*$ ]] || die "--sim-args: sim options only (letters, digits, . , _ -)" ;;
  *) die "--engine: llama or sim" ;;
esac
for a in "${LLAMA_ARGS[@]+"${LLAMA_ARGS[@]}"}"; do
  [[ $a =~ ^[A-Za-z0-9.,:=_/+-]{1,200}$ ]] || die "--llama-arg: one word of llama-server's options, not '$a'"
done
[ "$KEEP_URL" = 0 ] || [ "$REPLICAS" = 1 ] ||
  die "--keep-url gives every phone of a deployment the same tunnel key and identity: use it with --replicas 1 (one deployment per phone)"
[ "$KEEP_URL" = 0 ] || SECRETS+=(FLEETGATE_AGENT_KEY FLEETGATE_TUNNEL_KEY)
for s in "${SECRETS[@]}"; do [[ $s =~ ^[A-Za-z_][A-Za-z0-9_]{0,127}$ ]] || die "--secret-env: an environment variable's name, not '$s'"; done
[ -r "$CA_BUNDLE" ] || die "--ca-bundle: cannot read $CA_BUNDLE (install ca-certificates)"
[ -z "$GATEWAY_CA" ] || [ -r "$GATEWAY_CA" ] || die "--gateway-ca: cannot read $GATEWAY_CA"

case "$ARCH" in
  arm64|aarch64) ARCH=arm64 CC=aarch64-linux-gnu-gcc ELF="ARM aarch64" ;;
  x86_64|amd64) ARCH=x86_64 CC=cc ELF="x86-64" ;; # a local stand-in (tests), not for phones
  *) die "--arch: arm64 (phones) or x86_64 (a local stand-in)" ;;
esac
if [ -z "$AGENT" ]; then
  if [ "$ARCH" = arm64 ]; then
    AGENT=$ROOT/build-phone-arm64/agent/fleetgate-agent
    # brought up to date with the tree (about a second when nothing changed)
    "$ROOT/deploy/build-agent-phone.sh" --arch arm64 >&2
  else
    AGENT=$ROOT/build/agent/fleetgate-agent
  fi
fi
[ -x "$AGENT" ] || die "no agent at $AGENT (deploy/build-agent-phone.sh --arch arm64, or --agent FILE)"
if command -v file >/dev/null && ! file -L "$AGENT" | grep -q "$ELF"; then
  die "$AGENT is not an $ELF executable (--arch $ARCH)"
fi
command -v "$CC" >/dev/null || die "$CC is missing (apt-get install crossbuild-essential-arm64)"
command -v /usr/bin/python3 >/dev/null || die "python3 is missing (apt-get install python3)"

# The model's size: what each phone checks its memory and storage against before it
# downloads anything (docs/phones.md, "Phones too small for the model").
if [ "$ENGINE" = llama ] && [ -z "$MODEL_BYTES" ]; then
  MODEL_BYTES=$(/usr/bin/python3 - "$MODEL_URL" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=30) as r:
        n = r.headers.get("Content-Length")
    if n is None or not n.isdigit() or int(n) <= 0:
        sys.exit("the server did not say its size (no Content-Length)")
    print(int(n))
except Exception as e:  # noqa: BLE001 -- said to the operator as it is
    sys.exit(str(e))
EOF
) || die "--model-bytes: could not ask $MODEL_URL for the model's size (give --model-bytes)"
fi

# ---- the folder ----------------------------------------------------------------------------
DEP=$OUT/deployment
mkdir -p "$DEP"
install -m 0755 "$KIT/run.sh" "$DEP/run.sh"
install -m 0755 "$AGENT" "$DEP/fleetgate-agent"
# stripped: a smaller upload for every phone (about 5 MB instead of 6)
if command -v "${CC%gcc}strip" >/dev/null; then "${CC%gcc}strip" "$DEP/fleetgate-agent"; fi
"$CC" -O2 -Wall -Wextra -shared -fPIC -o "$DEP/libfgifaddrs.so" "$KIT/ifaddrs-shim.c"
install -m 0644 "$CA_BUNDLE" "$DEP/ca.pem"
if [ -n "$GATEWAY_CA" ]; then install -m 0644 "$GATEWAY_CA" "$DEP/gateway-ca.pem"; else rm -f "$DEP/gateway-ca.pem"; fi

q() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # one shell word, single-quoted
{
  echo "# fleetgate phone kit: written by deploy/acurast/make-deployment.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo "# Read by run.sh. No secrets here: they arrive as environment variables."
  echo "FG_ENGINE=$(q "$ENGINE")"
  echo "FG_GATEWAY=$(q "$GATEWAY")"
  echo "FG_MODEL=$(q "$MODEL")"
  echo "FG_MODEL_URL=$(q "$MODEL_URL")"
  echo "FG_MODEL_SHA256=$(q "$MODEL_SHA")"
  echo "FG_LLAMA_URL=$(q "$LLAMA_URL")"
  echo "FG_LLAMA_SHA256=$(q "$LLAMA_SHA")"
  echo "FG_LLAMA_ARGS=$(q "${LLAMA_ARGS[*]+"${LLAMA_ARGS[*]}"}")"
  echo "FG_SIM_ARGS=$(q "$SIM_ARGS")"
  echo "FG_PARALLEL=$(q "$PARALLEL")"
  echo "FG_CTX=$(q "$CTX")"
  echo "FG_THREADS=$(q "$THREADS")"
  echo "FG_LISTEN_PORT=$(q "$LISTEN_PORT")"
  echo "FG_LLAMA_PORT=$(q "$LLAMA_PORT")"
  echo "FG_ID_PREFIX=$(q "$ID_PREFIX")"
  echo "FG_TUNNEL_RELAYS=$(q "${RELAYS[*]}")"
  echo "FG_TUNNEL_DOMAIN=$(q "$DOMAIN")"
  echo "FG_COST_PER_DAY=$(q "$COST_PER_DAY")"
  echo "FG_MODEL_BYTES=$(q "$MODEL_BYTES")"
  echo "FG_NEED_MEM_MB=$(q "$NEED_MEM_MB")"
} > "$DEP/kit.conf"

/usr/bin/python3 - "$KIT/acurast.template.json" "$OUT/acurast.json" <<EOF
import json, sys
values = {
    "project": "$PROJECT", "image_url": "$IMAGE_URL", "image_sha256": "${IMAGE_SHA,,}",
    "network": "$NETWORK", "max_execution_ms": $DAYS * 86400000,
    "max_start_delay_ms": $START_DELAY_MS, "replicas": $REPLICAS, "max_cost": $MAX_COST,
    "env_names": sorted(set("${SECRETS[*]}".split())),
}
def fill(v):
    if isinstance(v, dict):
        return {fill(k): fill(x) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x) for x in v]
    if isinstance(v, str) and v.startswith("{{") and v.endswith("}}"):
        return values[v[2:-2]]
    return v
with open(sys.argv[1]) as f:
    manifest = fill(json.load(f))
with open(sys.argv[2], "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
EOF

{
  echo "Deployment $PROJECT: $REPLICAS phone(s), model $MODEL, gateway $GATEWAY ($ENGINE engine)."
  echo
  echo "1. Check $OUT/acurast.json (docs/phones.md explains every field)."
  echo "2. In the shell you deploy from, export the secrets it names (never written to this folder):"
  for s in $(printf '%s\n' "${SECRETS[@]}" | sort -u); do echo "     export $s=..."; done
  echo "3. cd $OUT && acurast deploy $PROJECT"
  echo "4. Watch the phones join: the Replicas table of the gateway's status page, or"
  echo "     GET /admin/v1/replicas on its admin listener (ids $ID_PREFIX-xxxxxxxx)"
  echo
  /usr/bin/python3 - "$MAX_COST" "$DAYS" "$REPLICAS" "$ENGINE" "$MODEL" "$MODEL_BYTES" "$NEED_MEM_MB" <<'EOF'
import math, sys
from decimal import Decimal
max_cost, days, replicas, engine, model, model_bytes, need_mem = sys.argv[1:]
def acu(units):
    v = (Decimal(units) / Decimal(10**12)).quantize(Decimal("0.000001"))
    return format(v, "f").rstrip("0").rstrip(".") or "0"
per_day = Decimal(max_cost) / int(days)
print(f"Cost cap: maxCostPerExecution {max_cost} = {acu(max_cost)} ACU for one phone's whole run "
      f"({days} day(s): {acu(per_day)} ACU a phone-day); at most "
      f"{acu(int(max_cost) * int(replicas))} ACU for {replicas} phone(s). `acurast estimate-fee` shows the price.")
if engine == "llama" and model_bytes:
    # the agent's rule (agent/hold.c, docs/agent.md): the file, 20 % for the KV cache and
    # compute buffers, 512 MiB for llama-server and the agent; a phone gives a model its
    # MemTotal less max(2 GiB, a quarter), and a phone sold with N GB shows about 90 % of it
    need = int(need_mem) if need_mem else math.ceil(int(model_bytes) / 2**20 * 1.2 + 512)
    def usable(total):
        return total - max(2048.0, total / 4)
    gb = next((n for n in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if usable(n * 1024 * 0.9) >= need), None)
    size = f"phones of {gb} GB of RAM or more" if gb else "more memory than phones have (64 GB)"
    print(f"Memory: {model} ({int(model_bytes) / 1e9:.2f} GB) needs {need} MiB: {size}. Acurast's CLI cannot "
          f"require it (docs/phones.md): a smaller phone checks before it downloads anything, says so on the "
          f"gateway's status page (Refused registrations) and ends its run without a restart.")
EOF
} > "$OUT/NEXT-STEPS.txt"
cat "$OUT/NEXT-STEPS.txt"
