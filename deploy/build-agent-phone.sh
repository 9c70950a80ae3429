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
# folder. Build natively here (x86-64), or cross-compile for the phones (aarch64) with
# --arch arm64: Debian's cross toolchain, the arm64 libraries by multiarch (the script
# adds the arm64 architecture to dpkg and installs what is missing), deploy/cross/
# aarch64-linux-gnu.ini, and a fully static executable (glibc, libuv, cJSON built from
# Debian's source, libcurl, OpenSSL) that runs on any aarch64 Linux userland.
# --cross-file/--host cross-compile for another target (set up its libraries yourself).
#
# usage: deploy/build-agent-phone.sh [BUILD_DIR] [--arch x86_64|arm64] [--static]
#                                    [--curl-src DIR] [--cross-file FILE] [--host TRIPLE]
#   BUILD_DIR   default build-phone (build-phone-arm64 with --arch arm64); the agent ends
#               up at BUILD_DIR/agent/fleetgate-agent
#   --arch      x86_64 (also amd64; the default) or arm64 (also aarch64; implies --static)
#   --static    one static executable (glibc, libuv and cJSON too), as for arm64
#   --curl-src  an unpacked curl source tree to use instead of fetching Debian's
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
CURL_SRC=""
CROSS=""
HOST=""
ARCH=x86_64
STATIC=0
while [ $# -gt 0 ]; do
  case "$1" in
    --curl-src) CURL_SRC=$(cd "$2" && pwd); shift 2 ;;
    --cross-file) CROSS=$(realpath "$2"); shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --static) STATIC=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "build-agent-phone: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
case "$ARCH" in
  x86_64|amd64) ARCH=x86_64; OUT=${OUT:-$ROOT/build-phone}; MA=x86_64-linux-gnu; TPFX="" ;;
  arm64|aarch64)
    ARCH=arm64; OUT=${OUT:-$ROOT/build-phone-arm64}; MA=aarch64-linux-gnu; TPFX=aarch64-linux-gnu-
    STATIC=1
    CROSS=${CROSS:-$ROOT/deploy/cross/aarch64-linux-gnu.ini}
    HOST=${HOST:-aarch64-linux-gnu} ;;
  *) echo "build-agent-phone: --arch is x86_64 or arm64, not $ARCH" >&2; exit 2 ;;
esac

# The project's build dependencies (meson, libssl-dev with its static archives...), and
# what building curl from its Debian source takes besides: make, dpkg-source.
"$ROOT/deploy/setup.sh" >/dev/null
missing=()
command -v make >/dev/null || missing+=(make)
command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
[ "$STATIC" = 1 ] && ! command -v file >/dev/null && missing+=(file)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ "$ARCH" = arm64 ]; then
  # The cross compiler, and the arm64 libraries the top meson.build declares (the agent
  # links libuv and OpenSSL; hiredis and SQLite are only the gateway's, but meson looks
  # for them when it configures). cJSON is built from source: Debian ships no libcjson.a.
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "build-agent-phone: adding the arm64 architecture to dpkg (multiarch)"
    $SUDO dpkg --add-architecture arm64
  fi
  for p in crossbuild-essential-arm64 file libc6-dev:arm64 libuv1-dev:arm64 libssl-dev:arm64 \
           libhiredis-dev:arm64 libsqlite3-dev:arm64; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-agent-phone: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CURL_DIR=$OUT/curl
PREFIX=$CURL_DIR/prefix
JOBS=$(nproc 2>/dev/null || echo 2)

SRC_DIR=""  # the folder a fetch_source call unpacked

fetch_source() { # PACKAGE
  # apt-get source with private lists and cache: reads Debian's deb-src index for the
  # release this machine runs and unpacks PACKAGE with Debian's patches applied.
  local pkg=$1 apt=$CURL_DIR/apt codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources" "$CURL_DIR"
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
  echo "== fetching Debian's $pkg source"
  apt-get "${opts[@]}" -qq update
  (cd "$CURL_DIR" && apt-get "${opts[@]}" -qq source "$pkg" >/dev/null)
  SRC_DIR=$(find "$CURL_DIR" -maxdepth 1 -type d -name "$pkg-*" | sort | tail -1)
  [ -n "$SRC_DIR" ] || { echo "build-agent-phone: could not fetch $pkg's source" >&2; exit 1; }
}

curl_env=()
if [ "$ARCH" = arm64 ]; then
  # configure finds aarch64-linux-gnu-gcc from --host; pkg-config must read the arm64
  # .pc files only (Debian 12 has no aarch64-linux-gnu-pkg-config).
  curl_env=(PKG_CONFIG=pkg-config PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
fi
if [ "$STATIC" = 1 ]; then
  mkdir -p "$PREFIX/lib/pkgconfig" "$PREFIX/include/cjson"
  # libuv: Debian's static archive is libuv_a.a, which meson's prefer_static cannot find
  # under the name -luv; this libuv.pc (searched first) names it.
  sed 's/^Name: libuv-static/Name: libuv/' "/usr/lib/$MA/pkgconfig/libuv-static.pc" \
    >"$PREFIX/lib/pkgconfig/libuv.pc"
  if [ ! -f "$PREFIX/lib/libcjson.a" ]; then
    fetch_source cjson
    echo "== building a static cJSON from $SRC_DIR"
    ver=$(sed -n 's/^project(cJSON *VERSION \([0-9.]*\).*/\1/p' "$SRC_DIR/CMakeLists.txt" | head -1)
    "${TPFX}gcc" -O2 -fPIC -std=c89 -c "$SRC_DIR/cJSON.c" -o "$CURL_DIR/cJSON.o"
    "${TPFX}ar" rcs "$PREFIX/lib/libcjson.a" "$CURL_DIR/cJSON.o"
    cp "$SRC_DIR/cJSON.h" "$PREFIX/include/cjson/"
    cat >"$PREFIX/lib/pkgconfig/libcjson.pc" <<EOF
libdir=$PREFIX/lib
includedir=$PREFIX/include

Name: libcjson
Version: ${ver:-1.7.15}
Description: Ultralightweight JSON parser in ANSI C (static, from Debian's source)
Libs: -L\${libdir} -lcjson
Libs.private: -lm
Cflags: -I\${includedir} -I\${includedir}/cjson
EOF
  fi
fi

if [ ! -f "$PREFIX/lib/libcurl.a" ]; then
  mkdir -p "$CURL_DIR"
  if [ -z "$CURL_SRC" ]; then fetch_source curl; CURL_SRC=$SRC_DIR; fi
  echo "== configuring a slim static libcurl from $CURL_SRC"
  rm -rf "$CURL_DIR/obj" && mkdir -p "$CURL_DIR/obj"
  host_args=()
  [ -n "$HOST" ] && host_args=(--host="$HOST")
  # Only HTTP and HTTPS over OpenSSL, the threaded resolver (a slow DNS answer must not
  # stall the loop), proxies (a phone may sit behind one); everything else off.
  (cd "$CURL_DIR/obj" && env "${curl_env[@]}" "$CURL_SRC/configure" --quiet "${host_args[@]}" --prefix="$PREFIX" \
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
# arm64: one static executable; the phone's userland (a PRoot image) need not have any of
# its libraries, nor this glibc (2.34 and later resolve names without loading NSS modules).
[ "$STATIC" = 1 ] && setup_args+=(-Dc_link_args=-static)
if [ -f "$OUT/build.ninja" ]; then
  meson setup --reconfigure "$OUT" "${setup_args[@]}" >/dev/null
else
  meson setup "$OUT" "${setup_args[@]}" >/dev/null
fi
meson compile -C "$OUT" agent/fleetgate-agent >/dev/null
BIN=$OUT/agent/fleetgate-agent
echo "== $BIN"
if [ "$ARCH" = arm64 ]; then
  file -b "$BIN" | sed 's/^/  /'
  if command -v qemu-aarch64-static >/dev/null; then qemu-aarch64-static "$BIN" --version; fi
else
  "$BIN" --version
  if [ "$STATIC" = 1 ]; then
    file -b "$BIN" | sed 's/^/  /'
  else
    echo "shared libraries it loads:"
    ldd "$BIN" | awk '{print "  " $1}'
  fi
fi
