#!/usr/bin/env bash
# Where the served engine's time goes: `perf record` (Debian's perf; cpu-clock sampling, which
# works on VMs that expose no hardware counters) of `ballast engine` on the shipped Q4_1 file
# while `ballast bench` holds it at single-stream decode, then at 16 concurrent streams. Prints
# the top entries of each profile (self time per symbol, and per shared object) and writes
# perf.data files under $OUT (default target/profile/<UTC time>-<kernel>).
#
#   scripts/profile-engine.sh                          # the kernels this CPU picks
#   BALLAST_CPU_KERNEL=avx2 scripts/profile-engine.sh  # what a CPU without AVX-512 runs
#   SECONDS_PER=30 FILE=path/to.gguf scripts/profile-engine.sh
#   PROFILES=conc16 scripts/profile-engine.sh          # one of the two (single, conc16)
#   PROFILES=prefill2048 scripts/profile-engine.sh     # 2,048-token prompts, one at a time
#
# Needs perf (package linux-perf) and kernel.perf_event_paranoid <= 2 for a process of one's own
# (root needs nothing). The engine runs with 2 kernel threads, as in scripts/bench-anchor.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

KERNEL="${BALLAST_CPU_KERNEL:-auto}"
OUT="${OUT:-target/profile/$(date -u +%Y%m%dT%H%M%SZ)-$KERNEL}"
SECONDS_PER="${SECONDS_PER:-20}"
PORT="${PORT:-18120}"
TOP="${TOP:-25}"

log() { echo "profile-engine: $*" >&2; }
die() { log "error: $*"; exit 1; }
command -v perf >/dev/null || die "perf is needed (apt-get install linux-perf)"

FILE="${FILE:-$(scripts/fetch-model.sh)}"
# The AVX2 paths are what a CPU without AVX-512 runs: there matrixmultiply (the f32 GEMM under
# prefill and attention) must not pick its AVX-512 kernel either, and its only switch is
# MMTEST_FEATURE at compile time, so those paths get a build of their own (as in
# scripts/bench-anchor.sh with ISA=avx2).
TARGET="${CARGO_TARGET_DIR:-target}"
BUILD_ENV=()
case "$KERNEL" in
    avx2 | avx-vnni)
        TARGET="$TARGET/isa-avx2"
        BUILD_ENV=(CARGO_TARGET_DIR="$TARGET" MMTEST_FEATURE=sse2,avx,avx2,fma)
        ;;
esac
log "building ballast (release, with debug symbols as the release profile has them)"
env "${BUILD_ENV[@]}" cargo build -q --release -p ballast
BALLAST="$TARGET/release/ballast"
mkdir -p "$OUT"

ENGINE=""
cleanup() {
    [[ -z "$ENGINE" ]] || { kill -TERM "$ENGINE" 2>/dev/null || true; wait "$ENGINE" 2>/dev/null || true; }
    [[ -z "${LOAD:-}" ]] || kill "$LOAD" 2>/dev/null || true
}
trap cleanup EXIT
BALLAST_CPU_KERNEL="$KERNEL" "$BALLAST" engine --model "$FILE" --served-model-name m --port "$PORT" \
    --cpu-threads 2 >"$OUT/engine.log" 2>&1 &
ENGINE=$!
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 "$ENGINE" 2>/dev/null || die "the engine exited (log: $OUT/engine.log)"
    sleep 0.3
done
log "engine up: $(grep -m1 -o 'kernel[^,]*' "$OUT/engine.log" || true)"

# One profile: load at the given concurrency for longer than the sample window.
profile() {   # name, concurrency[, input length, output length]
    local name="$1" c="$2" input="${3:-128}" output="${4:-128}"
    "$BALLAST" bench --url "http://127.0.0.1:$PORT" --model m --concurrency "$c" \
        --duration $((SECONDS_PER + 15)) --num-requests 100000 --input-len "$input" --output-len "$output" \
        --ignore-eos --stream --no-progress --json "$OUT/$name-bench.json" >"$OUT/$name-bench.txt" 2>&1 &
    LOAD=$!
    sleep 5   # past the first prefills
    perf record -F 999 -g -p "$ENGINE" -o "$OUT/$name.perf.data" -- sleep "$SECONDS_PER" \
        >"$OUT/$name.record.log" 2>&1
    wait "$LOAD" || true
    LOAD=""
    {
        echo "## $name (concurrency $c, $input prompt + $output output tokens, BALLAST_CPU_KERNEL=$KERNEL, ${SECONDS_PER} s of samples)"
        echo
        echo '```'
        echo "\$ perf report --no-children --sort dso -g none -i $name.perf.data"
        perf report --no-children --sort dso -g none -i "$OUT/$name.perf.data" --stdio 2>/dev/null |
            grep -v '^#' | grep -v '^$' | grep '%' | head -8 || true
        echo
        echo "\$ perf report --no-children --sort symbol -g none -i $name.perf.data"
        perf report --no-children --sort symbol -g none -i "$OUT/$name.perf.data" --stdio 2>/dev/null |
            grep -v '^#' | grep -v '^$' | grep '%' | head -"$TOP" | cut -c1-150 || true
        echo '```'
        echo
        echo "Load while sampled: $(grep -m1 '^Requests' "$OUT/$name-bench.txt" || true); $(grep -m1 -i 'output tok' "$OUT/$name-bench.txt" || true)"
        echo
    } | tee "$OUT/$name.md"
}
[[ " ${PROFILES:-single conc16} " == *" single "* ]] && profile single 1
[[ " ${PROFILES:-single conc16} " == *" conc16 "* ]] && profile conc16 16
[[ " ${PROFILES:-single conc16} " == *" prefill2048 "* ]] && profile prefill2048 1 2048 1
log "profiles in $OUT"
