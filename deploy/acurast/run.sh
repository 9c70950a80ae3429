#!/bin/sh
# The entry script of a fleetgate phone on Acurast's Shell runtime (acurast.json's
# "entrypoint"). deploy/acurast/make-deployment.sh copies it into a deployment folder
# beside fleetgate-agent (static aarch64), libfgifaddrs.so (the PRoot getifaddrs shim),
# ca.pem (certificates for downloads) and kit.conf (the operator's values: no secrets).
#
# Each execution starts from a freshly unpacked image, so every run:
#   1. checks what the processor must provide: BRIDGE_SOCKET (the tunnel) and the
#      secrets named in includeEnvironmentVariables (FLEETGATE_FLEET_SECRET at least);
#   2. asks whether the phone can hold the model (`fleetgate-agent --hold-check`: its memory
#      and storage against the model's size, before anything is downloaded); a phone that
#      cannot tells the gateway, and goes on with the model the gateway's placement names
#      instead (one of its catalogue this phone can hold), or, with none, is listed with
#      the gateway's refused registrations and the run ends with status 0, so that
#      restartPolicy onFailure does not start it again (docs/phones.md, "Phones too small
#      for the model");
#   3. fetches llama-server (a llama.cpp release archive) and the GGUF model with
#      `fleetgate-agent fetch`, which checks each file's SHA-256 before it is used (the
#      image has no curl or wget; the agent has libcurl and OpenSSL inside);
#   4. picks the thread counts to try from the phone's cores (or kit.conf's list);
#   5. execs the agent: --engine llama supervising llama-server on 127.0.0.1 (with the
#      shim preloaded and a fresh API key, so other apps on the phone cannot use it),
#      --tune-threads and --measure, --tunnel acurast for its public URL, heartbeats to
#      the gateway. The agent restarts llama-server if it dies; if the agent itself
#      exits, the execution ends and acurast.json's restartPolicy decides what follows.
# With FG_ENGINE=sim (make-deployment.sh --engine sim) nothing is downloaded: the agent
# runs its simulated phone, to try a deployment's plumbing before paying for a model.
#
# Environment (besides what kit.conf sets):
#   BRIDGE_SOCKET           set by the processor; required
#   FLEETGATE_FLEET_SECRET  enrols the phone with the gateway (unless FLEETGATE_AGENT_KEY
#                           holds a key the gateway has pinned)
#   FLEETGATE_AGENT_KEY, FLEETGATE_TUNNEL_KEY
#                           optional: keep the phone's identity and URL across runs
#                           (one phone per deployment only; see docs/phones.md)
#   FLEETGATE_WORK_DIR      where downloads go (default $HOME/fleetgate)
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
say() { echo "fleetgate run.sh: $*" >&2; }
die() { say "$*"; exit 1; }

[ -f "$HERE/kit.conf" ] || die "kit.conf is missing beside run.sh (make the folder with make-deployment.sh)"
. "$HERE/kit.conf"
AGENT=$HERE/fleetgate-agent
[ -x "$AGENT" ] || die "fleetgate-agent is missing or not executable in $HERE"

[ -n "${BRIDGE_SOCKET:-}" ] || die "BRIDGE_SOCKET is not set: this runs on an Acurast processor (Shell runtime, Android >= 1.26) that provides the tunnel"
if [ -z "${FLEETGATE_FLEET_SECRET:-}" ] && [ -z "${FLEETGATE_AGENT_KEY:-}" ]; then
  die "FLEETGATE_FLEET_SECRET is not set: give it to the deployment (includeEnvironmentVariables) so the phone can enrol"
fi

WORK=${FLEETGATE_WORK_DIR:-${HOME:-/tmp}/fleetgate}
mkdir -p "$WORK"

# A fresh id per run (the image keeps nothing, so without FLEETGATE_AGENT_KEY the phone
# has a new identity key each time and its old id stays pinned to the old key for a while).
rand_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
if [ -n "${FG_ID:-}" ]; then ID=$FG_ID; else ID="$FG_ID_PREFIX-$(rand_hex 4)"; fi

fetch() { # URL SHA256 OUT
  "$AGENT" fetch --ca "$HERE/ca.pem" "$1" "$2" "$3" || die "could not fetch $1"
}

# Can this phone hold the model? Asked before anything is downloaded: the agent compares
# the phone's memory (MemTotal) and the models folder's free storage with what the model
# needs (docs/agent.md, "What the phone holds"). Exit 3: it cannot, and has told the
# gateway. Exit 4: it cannot, and the gateway's placement named a model of its catalogue
# that it can hold, printed as FG_MODEL=... lines: the run goes on with that model (the
# gateway moves it between models from then on).
MODELS=$WORK/models
MODEL=$MODELS/$FG_MODEL.gguf
hold_check() {
  set -- --hold-check --id "$ID" --model "$FG_MODEL" --gateway "$FG_GATEWAY" --models-dir "$MODELS" \
    --model-file "$MODEL" --model-bytes "$FG_MODEL_BYTES"
  if [ -f "$HERE/gateway-ca.pem" ]; then set -- "$@" --gateway-ca "$HERE/gateway-ca.pem"; fi
  if [ -n "${FG_NEED_MEM_MB:-}" ]; then set -- "$@" --need-mem-mb "$FG_NEED_MEM_MB"; fi
  "$AGENT" "$@"
}
# The model the gateway names instead: only these names are taken from its lines.
take_model() {
  FG_NEED_MEM_MB=
  # shellcheck disable=SC2034 # v is read by the eval
  while IFS='=' read -r k v; do
    # each value checked again here (the agent checks them before it prints them)
    case $k=$v in
      FG_MODEL=*[!A-Za-z0-9._-]*|FG_MODEL=.*|FG_MODEL=) die "the gateway's model name '$v' cannot name a file" ;;
      FG_MODEL_URL=http://*|FG_MODEL_URL=https://*) case $v in *[!A-Za-z0-9._~:/?#@!\&\(\)*+,\;=%\[\]-]*) die "the gateway's model url is not plain" ;; esac ;;
      FG_MODEL_URL=*) die "the gateway's model url is not http(s)" ;;
      FG_MODEL_SHA256=*[!0-9a-fA-F]*) die "the gateway's sha256 is not hex" ;;
      FG_MODEL_BYTES=*[!0-9]*|FG_NEED_MEM_MB=*[!0-9]*|FG_CTX=*[!0-9]*) die "the gateway's $k is not a number" ;;
    esac
    case $k in
      FG_MODEL|FG_MODEL_URL|FG_MODEL_SHA256|FG_MODEL_BYTES|FG_NEED_MEM_MB|FG_CTX) eval "$k=\$v" ;;
    esac
  done <<EOF
$1
EOF
  MODEL=$MODELS/$FG_MODEL.gguf
}
if [ "$FG_ENGINE" = llama ]; then mkdir -p "$MODELS"; fi
if [ "$FG_ENGINE" = llama ] && [ -n "${FG_MODEL_BYTES:-}" ]; then
  rc=0
  out=$(hold_check) || rc=$?
  if [ "$rc" = 4 ]; then
    was=$FG_MODEL
    take_model "$out"
    say "this phone cannot hold $was; the gateway's placement gives it $FG_MODEL instead"
    rc=0
    out=$(hold_check) || rc=$?
    [ "$rc" = 4 ] && rc=3 # offered yet another: no second change
  fi
  case $rc in
    0) ;;
    3)
      # Acurast's onFailure restarts a run that fails (up to 3 times an execution), and this
      # phone would refuse again each time: the run ends here as done.
      say "this phone cannot hold $FG_MODEL (why: above, and on the gateway's status page): ending the run (status 0, not restarted)"
      exit 0 ;;
    *) die "could not check whether this phone can hold $FG_MODEL (exit $rc)" ;;
  esac
elif [ "$FG_ENGINE" = llama ]; then
  say "FG_MODEL_BYTES is not in kit.conf: memory and storage not checked (make the folder again with make-deployment.sh)"
fi

set -- --id "$ID" --model "$FG_MODEL" --listen "127.0.0.1:$FG_LISTEN_PORT" --gateway "$FG_GATEWAY" \
  --tunnel acurast --tunnel-domain "$FG_TUNNEL_DOMAIN"
for r in $FG_TUNNEL_RELAYS; do set -- "$@" --tunnel-relay "$r"; done
[ -f "$HERE/gateway-ca.pem" ] && set -- "$@" --gateway-ca "$HERE/gateway-ca.pem"
# the phone's price, for the gateway's cost accounting (a replica file's price wins)
[ -n "${FG_COST_PER_DAY:-}" ] && set -- "$@" --cost-per-day "$FG_COST_PER_DAY"

case "$FG_ENGINE" in
  sim)
    say "engine sim (no downloads): id $ID, model $FG_MODEL"
    # shellcheck disable=SC2086 # FG_SIM_ARGS is a list of options
    exec "$AGENT" --engine sim "$@" $FG_SIM_ARGS ;;
  llama) ;;
  *) die "FG_ENGINE must be llama or sim, not '$FG_ENGINE'" ;;
esac

# llama-server: a llama.cpp release archive (tar.gz / tar.xz / zip) or the bare program.
LLAMA_DIR=$WORK/llama
case "$FG_LLAMA_URL" in
  *.tar.gz|*.tgz|*.tar.xz|*.tar) arch=$WORK/llama.tar ;;
  *.zip) arch=$WORK/llama.zip ;;
  *) arch=$WORK/llama-server.bin ;;
esac
fetch "$FG_LLAMA_URL" "$FG_LLAMA_SHA256" "$arch"
rm -rf "$LLAMA_DIR"
mkdir -p "$LLAMA_DIR"
case "$arch" in
  *.tar) tar -xf "$arch" -C "$LLAMA_DIR" || die "cannot unpack $FG_LLAMA_URL" ;;
  *.zip)
    if command -v unzip >/dev/null; then unzip -q "$arch" -d "$LLAMA_DIR"
    elif command -v python3 >/dev/null; then python3 -m zipfile -e "$arch" "$LLAMA_DIR"
    else die "$FG_LLAMA_URL is a zip and the image has neither unzip nor python3: use a .tar.gz release"
    fi ;;
  *) cp "$arch" "$LLAMA_DIR/llama-server" ;;
esac
LLAMA=$(find "$LLAMA_DIR" -type f -name llama-server | head -n 1)
[ -n "$LLAMA" ] || die "no llama-server in $FG_LLAMA_URL"
chmod +x "$LLAMA"

if [ -n "${FG_MODEL_BYTES:-}" ]; then
  "$AGENT" fetch --ca "$HERE/ca.pem" --max-bytes "$FG_MODEL_BYTES" "$FG_MODEL_URL" "$FG_MODEL_SHA256" "$MODEL" ||
    die "could not fetch $FG_MODEL_URL"
else
  fetch "$FG_MODEL_URL" "$FG_MODEL_SHA256" "$MODEL"
fi

# Thread counts to try: kit.conf's list, or (auto) 2, 4, 6, 8 up to the phone's cores.
THREADS=$FG_THREADS
if [ "$THREADS" = auto ]; then
  cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 4)
  THREADS=""
  for t in 2 4 6 8; do [ "$t" -le "$cores" ] && THREADS="$THREADS${THREADS:+,}$t"; done
  [ -n "$THREADS" ] || THREADS=1
fi

# llama-server listens on loopback only, which other apps on the phone share: a key made
# for this run keeps them out (llama-server reads LLAMA_API_KEY; the agent sends it).
FLEETGATE_ENGINE_API_KEY=$(rand_hex 24)
LLAMA_API_KEY=$FLEETGATE_ENGINE_API_KEY
export FLEETGATE_ENGINE_API_KEY LLAMA_API_KEY
# llama-server runs through env(1) with two variables of its own: the getifaddrs shim
# (PRoot) and its shared libraries, which release archives keep beside the programs.
# Only llama-server gets them, not the agent.
ENV_CMD=$(command -v env) || die "the image has no env(1)"
LLAMA_LIBS=$(dirname "$LLAMA")
set -- "$@" --engine llama --engine-command "$ENV_CMD"
[ -f "$HERE/libfgifaddrs.so" ] && set -- "$@" --engine-arg "LD_PRELOAD=$HERE/libfgifaddrs.so"
set -- "$@" --engine-arg "LD_LIBRARY_PATH=$LLAMA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" --engine-arg "$LLAMA" \
  --upstream "http://127.0.0.1:$FG_LLAMA_PORT" \
  --engine-arg -m --engine-arg "$MODEL" --engine-arg --alias --engine-arg "$FG_MODEL" \
  --engine-arg --host --engine-arg 127.0.0.1 --engine-arg --port --engine-arg "$FG_LLAMA_PORT" \
  --engine-arg -np --engine-arg "$FG_PARALLEL" --engine-arg -c --engine-arg "$((FG_CTX * FG_PARALLEL))"
for a in $FG_LLAMA_ARGS; do set -- "$@" --engine-arg "$a"; done
# the models on the disk, reported with their digests (fetch recorded the model's)
set -- "$@" --models-dir "$MODELS"
if [ -n "${FG_MODEL_BYTES:-}" ]; then set -- "$@" --model-bytes "$FG_MODEL_BYTES"; fi
if [ -n "${FG_NEED_MEM_MB:-}" ]; then set -- "$@" --need-mem-mb "$FG_NEED_MEM_MB"; fi
say "engine llama: id $ID, model $FG_MODEL, $FG_PARALLEL slot(s) of $FG_CTX tokens, threads to try: $THREADS"
exec "$AGENT" "$@" --tune-threads "$THREADS" --measure
