#!/bin/bash
# Builds fleetgate-agent the way it should ship to a phone: against a libcurl configured
# for the agent's job only (HTTP and HTTPS over OpenSSL; no FTP, LDAP, RTMP, SSH, Kerberos,
# HTTP/2, IDN, PSL or compression libraries), linked statically together with OpenSSL's
# libcrypto and libssl. Debian's libcurl package serves every protocol it knows and drags
# some thirty shared libraries into any program that links it; on a phone with 0.8 GB to
# spare the agent should not pay for them (docs/benchmarks.md, "Agent memory").
#
# The libcurl is Debian's own source package (the same version and security patches as the
# system's libcurl), fetched with apt-get source through a private source list in the build
# folder: nothing on the machine is changed. Build natively here, or cross-compile for the
# phone with --cross-file (a meson cross file; set CC/--host for curl's configure yourself).
#
# usage: deploy/build-agent-phone.sh [BUILD_DIR] [--curl-src DIR] [--cross-file FILE] [--host TRIPLE]
#   BUILD_DIR   default build-phone; the agent ends up at BUILD_DIR/agent/fleetgate-agent
#   --curl-src  an unpacked curl source tree to use instead of fetching Debian's
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
CURL_SRC=""
CROSS=""
HOST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --curl-src) CURL_SRC=$(cd "$2" && pwd); shift 2 ;;
    --cross-file) CROSS=$(realpath "$2"); shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "build-agent-phone: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
OUT=${OUT:-$ROOT/build-phone}

# The project's build dependencies (meson, libssl-dev with its static archives...), and
# what building curl from its Debian source takes besides: make, dpkg-source.
"$ROOT/deploy/setup.sh" >/dev/null
missing=()
command -v make >/dev/null || missing+=(make)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CURL_DIR=$OUT/curl
PREFIX=$CURL_DIR/prefix
JOBS=$(nproc 2>/dev/null || echo 2)

fetch_curl() {
  # apt-get source with private lists and cache: reads Debian's deb-src index for the
  # release this machine runs and unpacks curl with Debian's patches applied.
  local apt=$CURL_DIR/apt codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources"
  cat >"$apt/sources/src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $codename-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  local opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/sources"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
              -o APT::Sandbox::User=root)
  echo "== fetching Debian's curl source"
  apt-get "${opts[@]}" -qq update
  (cd "$CURL_DIR" && apt-get "${opts[@]}" -qq source curl >/dev/null)
  CURL_SRC=$(find "$CURL_DIR" -maxdepth 1 -type d -name 'curl-*' | sort | tail -1)
  [ -n "$CURL_SRC" ] || { echo "build-agent-phone: could not fetch curl's source" >&2; exit 1; }
}

if [ ! -f "$PREFIX/lib/libcurl.a" ]; then
  mkdir -p "$CURL_DIR"
  [ -n "$CURL_SRC" ] || fetch_curl
  echo "== configuring a slim static libcurl from $CURL_SRC"
  rm -rf "$CURL_DIR/obj" && mkdir -p "$CURL_DIR/obj"
  host_args=()
  [ -n "$HOST" ] && host_args=(--host="$HOST")
  # Only HTTP and HTTPS over OpenSSL, the threaded resolver (a slow DNS answer must not
  # stall the loop), proxies (a phone may sit behind one); everything else off.
  (cd "$CURL_DIR/obj" && "$CURL_SRC/configure" --quiet "${host_args[@]}" --prefix="$PREFIX" \
      --disable-shared --enable-static --with-pic --with-openssl \
      --enable-http --enable-proxy --enable-threaded-resolver --enable-ipv6 \
      --disable-ftp --disable-file --disable-ldap --disable-ldaps --disable-rtsp \
      --disable-dict --disable-telnet --disable-tftp --disable-pop3 --disable-imap \
      --disable-smb --disable-smtp --disable-gopher --disable-mqtt --disable-manual \
      --disable-ntlm --disable-ntlm-wb \
      --disable-cookies --disable-alt-svc --disable-hsts --disable-netrc \
      --disable-dateparse --disable-doh --disable-mime --disable-progress-meter \
      --disable-unix-sockets \
      --without-libpsl --without-zlib --without-brotli --without-zstd --without-nghttp2 \
      --without-libidn2 --without-libssh2 --without-libssh --without-librtmp \
      --without-gssapi --without-ngtcp2 --without-nghttp3 --without-quiche --without-hyper \
      --without-libgsasl --without-ca-bundle --with-ca-path=/etc/ssl/certs)
  make -s -C "$CURL_DIR/obj/lib" -j"$JOBS" >/dev/null
  make -s -C "$CURL_DIR/obj/lib" install >/dev/null
  make -s -C "$CURL_DIR/obj/include" install >/dev/null
  make -s -C "$CURL_DIR/obj" install-pkgconfigDATA >/dev/null
fi

echo "== building fleetgate-agent against it in $OUT"
setup_args=(--buildtype=release -Dtests=disabled -Dprefer_static=true -Db_lto=true
            "--pkg-config-path=$PREFIX/lib/pkgconfig")
[ -n "$CROSS" ] && setup_args+=(--cross-file "$CROSS")
if [ -f "$OUT/build.ninja" ]; then
  meson setup --reconfigure "$OUT" "${setup_args[@]}" >/dev/null
else
  meson setup "$OUT" "${setup_args[@]}" >/dev/null
fi
meson compile -C "$OUT" agent/fleetgate-agent >/dev/null
BIN=$OUT/agent/fleetgate-agent
echo "== $BIN"
"$BIN" --version
echo "shared libraries it loads:"
ldd "$BIN" | awk '{print "  " $1}'
