#!/bin/sh
# Run by `meson install` (meson.add_install_script): puts the example configuration in
# SYSCONFDIR/fleetgate only where the operator has nothing yet, so an upgrade never
# replaces a configuration, a replica file or a secret. Respects DESTDIR.
#   install-etc.sh ETC_DIR GATEWAY_JSON REPLICA_EXAMPLE
set -eu
etc=$1 gateway_json=$2 replica_example=$3
dest="${DESTDIR:-}$etc"
dry=${MESON_INSTALL_DRY_RUN:-}

say() { echo "fleetgate: $*"; }
run() { if [ -n "$dry" ]; then say "would run: $*"; else "$@"; fi; }

# folder MODE PATH: made when absent; an existing one keeps its owner and mode
folder() {
  if [ -d "$2" ]; then return 0; fi
  run install -d -m "$1" "$2"
  say "made $2"
}
# file MODE SRC DST: copied when DST is absent, else kept as it is
file() {
  if [ -e "$3" ] || [ -L "$3" ]; then
    say "kept $3 (already there; the shipped example is in share/doc/fleetgate/examples)"
    return 0
  fi
  run install -m "$1" "$2" "$3"
  say "installed $3"
}

folder 0755 "$dest"
folder 0755 "$dest/replicas.d"
folder 0755 "$dest/tls"            # fullchain.pem, privkey.pem (deploy/certbot-deploy-hook.sh)
folder 0700 "$dest/credentials"    # LoadCredential=env:...: one file per secret, root-only
file 0644 "$gateway_json" "$dest/gateway.json"
file 0644 "$replica_example" "$dest/replicas.d/pixel-01.json.example"
