#!/bin/sh
# certbot's deploy hook for fleetgate (docs/deploy.md#tls-certificates): after a
# certificate is issued or renewed, copy it where the gateway reads it and reload the
# gateway (SIGHUP through systemd: the new certificate for new connections, nothing
# dropped). Install it as /etc/letsencrypt/renewal-hooks/deploy/fleetgate, or give it
# to certbot with --deploy-hook. certbot sets RENEWED_LINEAGE (/etc/letsencrypt/live/NAME).
#   FLEETGATE_TLS_DIR  where the gateway's config points (default /etc/fleetgate/tls)
#   FLEETGATE_GROUP    the group that may read the key (default fleetgate, when it exists)
#   FLEETGATE_RELOAD   the reload command (default: systemctl reload fleetgate)
set -eu
lineage=${RENEWED_LINEAGE:?RENEWED_LINEAGE is not set: this runs as certbot --deploy-hook}
dest=${FLEETGATE_TLS_DIR:-/etc/fleetgate/tls}
group=${FLEETGATE_GROUP:-fleetgate}
reload=${FLEETGATE_RELOAD:-systemctl reload fleetgate}

for f in fullchain.pem privkey.pem; do
  [ -r "$lineage/$f" ] || { echo "fleetgate hook: cannot read $lineage/$f" >&2; exit 1; }
done
mkdir -p "$dest"
umask 077
# new files beside the old ones, then renamed over them: the gateway never reads half a file
cert=$(mktemp "$dest/.fullchain.XXXXXX")
key=$(mktemp "$dest/.privkey.XXXXXX")
trap 'rm -f "$cert" "$key"' EXIT
cat "$lineage/fullchain.pem" > "$cert"
cat "$lineage/privkey.pem" > "$key"
chmod 0644 "$cert"
if getent group "$group" >/dev/null 2>&1; then
  chgrp "$group" "$key"
  chmod 0640 "$key"
else
  echo "fleetgate hook: no group $group: the key stays readable by root only" \
       "(systemd-sysusers makes the group: docs/deploy.md)" >&2
fi
mv -f "$key" "$dest/privkey.pem"
mv -f "$cert" "$dest/fullchain.pem"
trap - EXIT
echo "fleetgate hook: $lineage copied to $dest; reloading: $reload"
$reload
