#!/usr/bin/env bash
# Ballast's engine against llama.cpp's own server (llama-server, built by scripts/llama-cpp.sh)
# in its best configuration, side by side: the same GGUF files, 2 threads each, the same client
# (`ballast bench --stream`), one server at a time, the order of the two servers swapped every
# round. Writes every report (the client's JSON), the machine's CPU model and flags and a
# Markdown summary to $BENCH_ANCHOR_OUT, server logs and text reports beside it under logs/.
#
#   scripts/bench-anchor.sh [ROUNDS]                 # default 3 rounds
#   ISA=avx2 scripts/bench-anchor.sh                 # both servers limited to AVX2 (see below)
#   BENCH_ANCHOR_OUT=docs/bench-results/$(date -u +%F)/avx512 scripts/bench-anchor.sh
#   QUANTS="Q4_1 Q4_K_M" CASES="single conc" SWEEP=0 scripts/bench-anchor.sh 1   # a quick look
#
# Files (QUANTS, default Q4_1 Q4_0 Q4_K_M Q5_K_M Q6_K): Q4_1 is the shipped file
# (scripts/fetch-model.sh), the others are made from it by scripts/quantize-model.sh.
# Cases (CASES, default all), each with its own seed per round, the same for both servers:
#   single   128 prompt + 128 output tokens, EOS ignored, one at a time: decode 1/TPOT, TTFT
#   prefill  TTFT at 512 and at 2,048 prompt tokens (16 output)
#   conc     16 concurrent, 128 + 128: output tok/s, TTFT, TPOT
#   prefix   16 concurrent, 640-token prompts whose first 512 tokens are shared (Q4_1 only)
# Q4_0 (llama.cpp's fastest CPU path) runs `single` only.
#
# The anchor at its best: before the rounds a sweep (SWEEP=0 skips it and takes the first
# configuration of each list) runs every llama-server configuration below on the Q4_1 file
# with fewer requests, and each case then uses, on every file and in every round, the
# configuration that did best on it (decode rate, TTFT, or output rate). The sweep's reports
# are kept (sweep/) and the summary prints them; the chosen flags stand in the same row as each
# ratio.
#
# ISA=avx2 measures what a CPU without AVX-512 gets, on whatever CPU runs it: llama.cpp built by
# `LLAMA_CPP_ISA=avx2 scripts/llama-cpp.sh` (AVX2, FMA, F16C only) and Ballast with
# BALLAST_NO_AVX512=1 BALLAST_NO_VNNI=1 (its AVX2 row kernels), built into target/isa-avx2 with
# matrixmultiply (the f32 GEMM under prefill and attention) held to its AVX2/FMA kernel: it picks
# its kernel at run time and would otherwise use its AVX-512 one, which a CPU without AVX-512
# does not have. Its only switch is MMTEST_FEATURE at compile time, hence the separate build.
#
# The machine should be quiet: before each round the script measures the CPU that is busy
# while nothing of its own runs and waits (up to QUIET_WAIT seconds, default 900) until it is
# under QUIET_MAX cores (default 0.15); each case also records the CPU that other processes used
# while it ran ("other load" in the tables).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-3}"
ISA="${ISA:-native}"
QUANTS="${QUANTS:-Q4_1 Q4_0 Q4_K_M Q5_K_M Q6_K}"
CASES="${CASES:-single prefill conc prefix}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${BENCH_ANCHOR_OUT:-target/bench-anchor/$STAMP-$ISA}"
LOGS="$OUT/logs"
QUIET_MAX="${QUIET_MAX:-0.15}"
QUIET_WAIT="${QUIET_WAIT:-900}"
THREADS=2
B_PORT="${B_PORT:-18110}"
L_PORT="${L_PORT:-18111}"

# The engine as a user runs it: defaults (continuous batching, --max-num-seqs 256, prefix
# caching on, f16 KV cache for a GGUF file, the model's full context), 2 kernel threads.
BALLAST_FLAGS=(--cpu-threads "$THREADS")
BALLAST_ENV=()
TARGET="${CARGO_TARGET_DIR:-target}"
BUILD_ENV=()
case "$ISA" in
    native) ;;
    avx2)
        BALLAST_ENV=(BALLAST_NO_AVX512=1 BALLAST_NO_VNNI=1)
        TARGET="$TARGET/isa-avx2"
        BUILD_ENV=(CARGO_TARGET_DIR="$TARGET" MMTEST_FEATURE=sse2,avx,avx2,fma)
        ;;
    *) echo "bench-anchor: error: ISA is native or avx2, not $ISA" >&2; exit 1 ;;
esac

# llama-server's configurations. Every one: 2 threads for generation and for batches (prompt
# processing), continuous batching (its default, said explicitly), no web UI. Single-stream
# cases: one slot with room for the longest prompt. Concurrent cases: 16 slots, with one KV
# buffer that the slots share (--kv-unified) or one per slot, each slot's context large enough
# for the prefix case's 640 + 128 tokens; prompt caching (`cache_prompt`, on by default) lets a
# slot reuse the part of its previous prompt that the next request repeats, which is what
# serves the shared system prompt. Flash attention off and on for both.
LLAMA_COMMON=(--threads "$THREADS" --threads-batch "$THREADS" --cont-batching --no-webui)
declare -A CONFIG=(
    [single-fa-off]="--parallel 1 --ctx-size 4096 --flash-attn off"
    [single-fa-on]="--parallel 1 --ctx-size 4096 --flash-attn on"
    [conc-fa-off-unified]="--parallel 16 --ctx-size 16384 --kv-unified --flash-attn off"
    [conc-fa-on-unified]="--parallel 16 --ctx-size 16384 --kv-unified --flash-attn on"
    [conc-fa-off-per-slot]="--parallel 16 --ctx-size 16384 --no-kv-unified --flash-attn off"
    [conc-fa-on-per-slot]="--parallel 16 --ctx-size 16384 --no-kv-unified --flash-attn on"
)
SINGLE_CONFIGS=(single-fa-on single-fa-off)
CONC_CONFIGS=(conc-fa-on-unified conc-fa-off-unified conc-fa-on-per-slot conc-fa-off-per-slot)

log() { echo "bench-anchor: $*" >&2; }
die() { log "error: $*"; exit 1; }
has_case() { [[ " $CASES " == *" $1 "* ]]; }

mkdir -p "$OUT" "$LOGS"
LLAMA_BIN="$(LLAMA_CPP_ISA="$ISA" scripts/llama-cpp.sh)"
declare -A FILE
for q in $QUANTS; do
    if [[ "$q" == Q4_1 ]]; then
        FILE[$q]="$(scripts/fetch-model.sh)"
    else
        FILE[$q]="$(scripts/quantize-model.sh "$q")"
    fi
done
[[ -n "${FILE[Q4_1]:-}" ]] || die "QUANTS must include Q4_1 (the sweep and the prefix case use it)"
log "building ballast (release)"
env "${BUILD_ENV[@]}" cargo build -q --release -p ballast
BALLAST="$TARGET/release/ballast"
INPROC=""
if [[ "${INPROCESS:-1}" == 1 ]]; then
    log "building the in-process bench (engine/benches/real_model.rs)"
    INPROC="$(env "${BUILD_ENV[@]}" cargo bench -q -p ballast-engine --bench real_model --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*real_model[^"]*\)".*/\1/p' | tail -1)"
    [[ -x "$INPROC" ]] || die "could not build engine/benches/real_model.rs"
fi

# --- CPU accounting: jiffies (USER_HZ, 100 a second) busy on the whole machine, and used by one
# process; "other load" is the first minus ours, in cores.
HZ="$(getconf CLK_TCK)"
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
proc_cpu() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12+$13}'; }
quiet_load() {   # cores busy over 5 s while this script runs nothing
    local a b
    a="$(machine_busy)"; sleep 5; b="$(machine_busy)"
    awk -v d="$((b - a))" -v hz="$HZ" 'BEGIN{printf "%.2f", d / hz / 5}'
}
wait_quiet() {
    local load waited=0
    while :; do
        load="$(quiet_load)"
        if awk -v l="$load" -v m="$QUIET_MAX" 'BEGIN{exit !(l <= m)}'; then break; fi
        if (( waited >= QUIET_WAIT )); then
            log "still $load cores busy after ${waited}s of waiting; going on (noted in the summary)"
            break
        fi
        log "$load cores busy with other work (uptime: $(uptime | sed 's/.*load/load/')); waiting"
        sleep 25; waited=$((waited + 30))
    done
    echo "$load"
}

# --- servers
SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT
wait_up() {   # port, log
    local i
    for i in $(seq 300); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$2" >&2; die "the server exited"; }
        sleep 0.5
    done
    die "the server on port $1 did not come up (log: $2)"
}
start_ballast() {   # file, log
    env "${BALLAST_ENV[@]}" "$BALLAST" engine --model "$1" --served-model-name m --port "$B_PORT" \
        "${BALLAST_FLAGS[@]}" >"$2" 2>&1 &
    SERVER_PID=$!
    wait_up "$B_PORT" "$2"
}
start_llama() {   # file, log, config
    local flags
    read -r -a flags <<<"${CONFIG[$3]}"
    "$LLAMA_BIN/llama-server" --model "$1" --alias m --host 127.0.0.1 --port "$L_PORT" \
        "${LLAMA_COMMON[@]}" "${flags[@]}" >"$2" 2>&1 &
    SERVER_PID=$!
    wait_up "$L_PORT" "$2"
}

# One bench run: its report is $dir/$name.json, the CPU other processes used during it
# $dir/$name.load, its text report $LOGS/<dir>-$name.txt.
bench() {   # dir, name, port, seed, bench flags...
    local dir="$1" name="$2" port="$3" seed="$4" t0 s0 b0 t1 s1 b1 cpu txt
    shift 4
    txt="$LOGS/$(basename "$dir")-$name.txt"
    t0="$(date +%s.%N)"; s0="$(proc_cpu "$SERVER_PID")"; b0="$(machine_busy)"
    TIMEFORMAT='%U %S'
    cpu="$( { time "$BALLAST" bench --url "http://127.0.0.1:$port" --model m --seed "$seed" \
        --no-progress --json "$dir/$name.json" "$@" >"$txt" 2>&1; } 2>&1 )"
    t1="$(date +%s.%N)"; s1="$(proc_cpu "$SERVER_PID")"; b1="$(machine_busy)"
    awk -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')" -v hz="$HZ" \
        -v m="$((b1 - b0))" -v s="$((s1 - s0))" -v c="$cpu" \
        'BEGIN{split(c, u, " "); printf "%.2f\n", (m - s - (u[1] + u[2]) * hz) / hz / t}' \
        >"$dir/$name.load"
    log "  $(basename "$dir")/$name: $(grep -m1 '^Requests' "$txt" || echo 'no report')"
}
warm() {   # port: one short request the cases never repeat (its own seed)
    "$BALLAST" bench --url "http://127.0.0.1:$1" --model m --seed 999999 --num-requests 2 \
        --input-len 64 --output-len 16 --ignore-eos --stream --no-progress >/dev/null 2>&1 || true
}

# The cases: bench flags for the rounds and (fewer requests) for the sweep.
declare -A FLAGS=(
    [single]="--concurrency 1 --num-requests 6 --input-len 128 --output-len 128 --ignore-eos --stream"
    [prefill512]="--concurrency 1 --num-requests 3 --input-len 512 --output-len 16 --ignore-eos --stream"
    [prefill2048]="--concurrency 1 --num-requests 2 --input-len 2048 --output-len 16 --ignore-eos --stream"
    [conc]="--concurrency 16 --num-requests 32 --input-len 128 --output-len 128 --ignore-eos --stream"
    [prefix]="--concurrency 16 --num-requests 32 --input-len 640 --shared-prefix-len 512 --output-len 128 --ignore-eos --stream"
)
declare -A SWEEP_REQUESTS=([single]=3 [prefill512]=2 [prefill2048]=1 [conc]=16 [prefix]=16)
# Case index (for seeds) and the kind of server session a case needs.
declare -A INDEX=([single]=1 [prefill512]=2 [prefill2048]=3 [conc]=4 [prefix]=5)
kind_of() { case "$1" in conc | prefix) echo conc ;; *) echo single ;; esac; }

# The cases a file runs, in order.
cases_for() {   # quant
    local c out=()
    for c in single prefill512 prefill2048 conc prefix; do
        has_case "${c%%[0-9]*}" || continue
        [[ "$1" == Q4_0 && "$c" != single ]] && continue
        [[ "$c" == prefix && "$1" != Q4_1 ]] && continue
        out+=("$c")
    done
    echo "${out[@]}"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "isa: $ISA"
    echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/^Mem/{print $2}') GiB"
    echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | sed 's/^flags[^:]*: *//')"
    echo "ballast: $("$BALLAST" --version), tree $(git describe --always --dirty 2>/dev/null || echo unknown)${BALLAST_ENV[*]:+, environment ${BALLAST_ENV[*]}}${BUILD_ENV[1]:+, built with ${BUILD_ENV[1]}}"
    echo "llama.cpp: $(head -1 "$LLAMA_BIN/BUILD-INFO"); $(sed -n 2p "$LLAMA_BIN/BUILD-INFO"); $("$LLAMA_BIN/llama-server" --version 2>&1 | grep -m1 version || true)"
    for q in $QUANTS; do echo "file $q: $(basename "${FILE[$q]}") sha256 $(sha256sum "${FILE[$q]}" | cut -d' ' -f1)"; done
    echo "ballast engine flags: --model FILE --served-model-name m ${BALLAST_FLAGS[*]}"
    echo "llama-server flags, every configuration: --model FILE --alias m ${LLAMA_COMMON[*]}"
    for c in "${SINGLE_CONFIGS[@]}" "${CONC_CONFIGS[@]}"; do echo "llama-server configuration $c: ${CONFIG[$c]}"; done
    for c in single prefill512 prefill2048 conc prefix; do echo "case $c: ${FLAGS[$c]}"; done
    echo "cases: $CASES; files: $QUANTS; rounds: $ROUNDS"
} >"$OUT/meta.txt"
cat "$OUT/meta.txt" >&2

# --- the sweep: every configuration on the Q4_1 file, the best per case.
declare -A BEST
if [[ "${SWEEP:-1}" == 1 ]]; then
    dir="$OUT/sweep"
    mkdir -p "$dir"
    log "sweep: waiting for a quiet machine"
    wait_quiet >"$dir/quiet.load"
    for cfg in "${SINGLE_CONFIGS[@]}" "${CONC_CONFIGS[@]}"; do
        kind="${cfg%%-*}"
        todo=()
        for c in $(cases_for Q4_1); do [[ "$(kind_of "$c")" == "$kind" ]] && todo+=("$c"); done
        ((${#todo[@]})) || continue
        start_llama "${FILE[Q4_1]}" "$LOGS/sweep-$cfg.log" "$cfg"
        warm "$L_PORT"
        for c in "${todo[@]}"; do
            read -r -a f <<<"${FLAGS[$c]}"
            for i in "${!f[@]}"; do   # fewer requests than in the rounds
                [[ "${f[$i]}" == --num-requests ]] && f[i + 1]="${SWEEP_REQUESTS[$c]}"
            done
            bench "$dir" "llama-$cfg-$c" "$L_PORT" $((900000 + INDEX[$c])) "${f[@]}"
        done
        stop_server
    done
    while read -r c cfg; do BEST[$c]="$cfg"; done < <(python3 scripts/anchor_summary.py pick "$OUT")
else
    for c in single prefill512 prefill2048; do BEST[$c]="${SINGLE_CONFIGS[0]}"; done
    for c in conc prefix; do BEST[$c]="${CONC_CONFIGS[0]}"; done
fi
for c in single prefill512 prefill2048 conc prefix; do
    echo "$c ${BEST[$c]:-}"
done >"$OUT/chosen.txt"
log "llama-server configuration per case: $(tr '\n' ';' <"$OUT/chosen.txt")"

# One server session: Ballast, or llama-server in one configuration, on one file, serving the
# given cases. Reports are round$r/<server>-<case>-<quant>.json.
session() {   # server, config ("" for ballast), quant, dir, round, cases...
    local server="$1" cfg="$2" q="$3" dir="$4" r="$5" port c
    shift 5
    if [[ "$server" == ballast ]]; then
        port="$B_PORT"; start_ballast "${FILE[$q]}" "$LOGS/$(basename "$dir")-ballast-$q-$1.log"
    else
        port="$L_PORT"; start_llama "${FILE[$q]}" "$LOGS/$(basename "$dir")-llama-$q-$cfg.log" "$cfg"
    fi
    warm "$port"
    for c in "$@"; do
        read -r -a f <<<"${FLAGS[$c]}"
        # Seeds differ by case, file and round and are the same for both servers, so both get
        # the same prompts and neither finds a prompt of an earlier case in its cache.
        bench "$dir" "$server-$c-$q" "$port" $((r * 1000 + INDEX[$c] * 10 + QI[$q])) "${f[@]}"
        [[ "$server" == llama ]] && echo "$cfg" >"$dir/$server-$c-$q.config"
    done
    stop_server
}
declare -A QI
i=0
for q in $QUANTS; do QI[$q]=$i; i=$((i + 1)); done

for r in $(seq "$ROUNDS"); do
    dir="$OUT/round$r"
    mkdir -p "$dir"
    log "round $r: waiting for a quiet machine"
    wait_quiet >"$dir/quiet.load"
    log "round $r: $(cat "$dir/quiet.load") cores busy before it"
    # Odd rounds start with Ballast, even rounds with llama-server, in every pair of sessions.
    if (( r % 2 )); then order=(ballast llama); else order=(llama ballast); fi
    for q in $QUANTS; do
        for kind in single conc; do
            todo=()
            for c in $(cases_for "$q"); do [[ "$(kind_of "$c")" == "$kind" ]] && todo+=("$c"); done
            ((${#todo[@]})) || continue
            for s in "${order[@]}"; do
                if [[ "$s" == ballast ]]; then
                    session ballast "" "$q" "$dir" "$r" "${todo[@]}"
                    continue
                fi
                # One llama-server session per configuration the cases chose.
                for cfg in $(for c in "${todo[@]}"; do echo "${BEST[$c]}"; done | awk '!seen[$0]++'); do
                    mine=()
                    for c in "${todo[@]}"; do [[ "${BEST[$c]}" == "$cfg" ]] && mine+=("$c"); done
                    session llama "$cfg" "$q" "$dir" "$r" "${mine[@]}"
                done
            done
        done
    done
    if [[ -n "$INPROC" ]]; then
        env "${BALLAST_ENV[@]}" RAYON_NUM_THREADS="$THREADS" "$INPROC" 128 128 >"$dir/inprocess.txt" 2>&1 \
            || log "the in-process bench failed (see $dir/inprocess.txt)"
    fi
done

if [[ "${LLAMA_BENCH:-1}" == 1 ]]; then
    log "llama-bench"
    files=()
    for q in $QUANTS; do files+=(-m "${FILE[$q]}"); done
    "$LLAMA_BIN/llama-bench" "${files[@]}" -t "$THREADS" -p 512,2048 -n 128 -fa 0,1 -r 2 \
        -o md >"$OUT/llama-bench.md" 2>"$LOGS/llama-bench.log" || log "llama-bench failed"
fi

python3 scripts/anchor_summary.py summary "$OUT" | tee "$OUT/summary.md"
