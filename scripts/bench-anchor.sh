#!/usr/bin/env bash
# Ballast's engine against llama.cpp's own server (llama-server, built by scripts/llama-cpp.sh)
# side by side: the same GGUF file, 2 threads each, the same client (`ballast bench --stream`),
# one server at a time, the order of the two servers swapped every round. Writes every report
# and a Markdown summary (one table per case, with the ratio and the flags of both servers) to
# $BENCH_ANCHOR_OUT (default target/bench-anchor/<UTC time>), and prints the summary.
#
#   scripts/bench-anchor.sh [ROUNDS]        # default 3 rounds; about 7 minutes a round on 2 cores
#   CASES="single conc" scripts/bench-anchor.sh 1
#
# Cases (CASES, default all): single (128 prompt + 128 output tokens, EOS ignored, Q4_1: decode
# 1/TPOT and TTFT), single_q4_0 (the same on a Q4_0 file made by scripts/quantize-model.sh),
# prefill (TTFT at 512 and 2,048 prompt tokens), conc (16 concurrent, 128 + 128: output tok/s),
# prefix (16 concurrent, 640-token prompts whose first 512 tokens are shared: a system prompt).
# After the rounds, llama-bench on both files for reference (LLAMA_BENCH=0 skips it), and in
# every round the engine's own in-process forward pass (engine/benches/real_model.rs, Q4_1,
# 128 + 128; INPROCESS=0 skips it) so the cost of the serving path shows in the same run.
#
# The machine should be quiet: before each round the script measures the CPU that is busy
# while nothing of its own runs and waits (up to QUIET_WAIT seconds, default 900) until it is
# under QUIET_MAX cores (default 0.15); each case also records the CPU that other processes used
# while it ran ("other load" in the tables).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-3}"
CASES="${CASES:-single single_q4_0 prefill conc prefix}"
OUT="${BENCH_ANCHOR_OUT:-target/bench-anchor/$(date -u +%Y%m%dT%H%M%SZ)}"
QUIET_MAX="${QUIET_MAX:-0.15}"
QUIET_WAIT="${QUIET_WAIT:-900}"
THREADS=2
B_PORT="${B_PORT:-18110}"
L_PORT="${L_PORT:-18111}"

# The engine as a user runs it: defaults (continuous batching, --max-num-seqs 256, prefix
# caching on, f16 KV cache for a GGUF file, the model's full context), 2 kernel threads.
BALLAST_FLAGS=(--cpu-threads "$THREADS")
# llama-server in its best configuration for each kind of case (see docs/benchmarks.md for how
# each flag was chosen). Single stream: one slot with room for the longest prompt. Concurrent:
# 16 slots with continuous batching (on by default), one unified KV buffer shared by the slots,
# each slot's context large enough for the prefix case's 640 + 128 tokens. Prompt caching
# (`cache_prompt`, on by default) lets a slot reuse the part of its previous prompt that the
# next request repeats, which is what serves the shared system prompt.
LLAMA_COMMON=(--threads "$THREADS" --threads-batch "$THREADS" --no-webui)
LLAMA_SINGLE=("${LLAMA_COMMON[@]}" --parallel 1 --ctx-size 4096)
LLAMA_CONC=("${LLAMA_COMMON[@]}" --parallel 16 --ctx-size 16384 --kv-unified)

log() { echo "bench-anchor: $*" >&2; }
die() { log "error: $*"; exit 1; }
has_case() { [[ " $CASES " == *" $1 "* ]]; }

mkdir -p "$OUT"
LLAMA_BIN="$(scripts/llama-cpp.sh)"
Q4_1="$(scripts/fetch-model.sh)"
Q4_0=""
has_case single_q4_0 && Q4_0="$(scripts/quantize-model.sh Q4_0)"
log "building ballast (release)"
cargo build -q --release -p ballast
BALLAST="${CARGO_TARGET_DIR:-target}/release/ballast"
INPROC=""
if [[ "${INPROCESS:-1}" == 1 ]]; then
    log "building the in-process bench (engine/benches/real_model.rs)"
    INPROC="$(cargo bench -q -p ballast-engine --bench real_model --no-run --message-format=json 2>/dev/null |
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
    "$BALLAST" engine --model "$1" --served-model-name m --port "$B_PORT" "${BALLAST_FLAGS[@]}" \
        >"$2" 2>&1 &
    SERVER_PID=$!
    wait_up "$B_PORT" "$2"
}
start_llama() {   # file, log, flags...
    local file="$1" logf="$2"
    shift 2
    "$LLAMA_BIN/llama-server" --model "$file" --alias m --host 127.0.0.1 --port "$L_PORT" "$@" \
        >"$logf" 2>&1 &
    SERVER_PID=$!
    wait_up "$L_PORT" "$logf"
}

# One bench run; its report is $dir/$name.json and the other load during it $dir/$name.load.
bench() {   # dir, name, port, seed, bench flags...
    local dir="$1" name="$2" port="$3" seed="$4" t0 s0 b0 t1 s1 b1 cpu
    shift 4
    t0="$(date +%s.%N)"; s0="$(proc_cpu "$SERVER_PID")"; b0="$(machine_busy)"
    TIMEFORMAT='%U %S'
    cpu="$( { time "$BALLAST" bench --url "http://127.0.0.1:$port" --model m --seed "$seed" \
        --no-progress --json "$dir/$name.json" "$@" >"$dir/$name.txt" 2>&1; } 2>&1 )"
    t1="$(date +%s.%N)"; s1="$(proc_cpu "$SERVER_PID")"; b1="$(machine_busy)"
    awk -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')" -v hz="$HZ" \
        -v m="$((b1 - b0))" -v s="$((s1 - s0))" -v c="$cpu" \
        'BEGIN{split(c, u, " "); printf "%.2f\n", (m - s - (u[1] + u[2]) * hz) / hz / t}' \
        >"$dir/$name.load"
    log "  $name: $(grep -m1 '^Requests' "$dir/$name.txt" || echo 'no report')"
}
warm() {   # port: one short request the cases never repeat (its own seed)
    "$BALLAST" bench --url "http://127.0.0.1:$1" --model m --seed 999999 --num-requests 2 \
        --input-len 64 --output-len 16 --ignore-eos --stream --no-progress >/dev/null 2>&1 || true
}

SINGLE=(--concurrency 1 --num-requests 8 --input-len 128 --output-len 128 --ignore-eos --stream)
P512=(--concurrency 1 --num-requests 4 --input-len 512 --output-len 16 --ignore-eos --stream)
P2048=(--concurrency 1 --num-requests 3 --input-len 2048 --output-len 16 --ignore-eos --stream)
CONC=(--concurrency 16 --num-requests 48 --input-len 128 --output-len 128 --ignore-eos --stream)
PREFIX=(--concurrency 16 --num-requests 48 --input-len 640 --shared-prefix-len 512
    --output-len 128 --ignore-eos --stream)

# The cases one server session serves: kind is "single" (llama-server with one slot) or "conc".
session() {   # server, kind, file, dir, round
    local server="$1" kind="$2" file="$3" dir="$4" r="$5" port seed
    if [[ "$server" == ballast ]]; then
        port="$B_PORT"; start_ballast "$file" "$dir/ballast-$kind-$(basename "$file").log"
    elif [[ "$kind" == conc ]]; then
        port="$L_PORT"; start_llama "$file" "$dir/llama-$kind.log" "${LLAMA_CONC[@]}"
    else
        port="$L_PORT"; start_llama "$file" "$dir/llama-$kind-$(basename "$file").log" "${LLAMA_SINGLE[@]}"
    fi
    warm "$port"
    # Seeds differ by case and round and are the same for both servers, so both get the same
    # prompts and neither finds a prompt of an earlier case in its cache.
    seed=$((r * 100))
    if [[ "$kind" == single && "$file" == "$Q4_1" ]]; then
        has_case single && bench "$dir" "$server-single" "$port" $((seed + 1)) "${SINGLE[@]}"
        if has_case prefill; then
            bench "$dir" "$server-prefill512" "$port" $((seed + 2)) "${P512[@]}"
            bench "$dir" "$server-prefill2048" "$port" $((seed + 3)) "${P2048[@]}"
        fi
    elif [[ "$kind" == single ]]; then
        bench "$dir" "$server-single_q4_0" "$port" $((seed + 1)) "${SINGLE[@]}"
    else
        has_case conc && bench "$dir" "$server-conc" "$port" $((seed + 4)) "${CONC[@]}"
        has_case prefix && bench "$dir" "$server-prefix" "$port" $((seed + 5)) "${PREFIX[@]}"
    fi
    stop_server
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(grep -o -w 'avx512f\|avx512_vnni\|avx_vnni\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')$(free -g | awk '/^Mem/{print $2}') GiB"
    echo "ballast: $("$BALLAST" --version), tree $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "llama.cpp: $(head -1 "$LLAMA_BIN/BUILD-INFO"); $("$LLAMA_BIN/llama-server" --version 2>&1 | grep -m1 version || true)"
    echo "Q4_1: $Q4_1"
    [[ -n "$Q4_0" ]] && echo "Q4_0: $Q4_0 (scripts/quantize-model.sh Q4_0)"
    echo "ballast engine flags: --model FILE --served-model-name m ${BALLAST_FLAGS[*]}"
    echo "llama-server flags, single stream: --model FILE --alias m ${LLAMA_SINGLE[*]}"
    echo "llama-server flags, concurrent: --model FILE --alias m ${LLAMA_CONC[*]}"
    echo "cases: $CASES; rounds: $ROUNDS"
} >"$OUT/meta.txt"
cat "$OUT/meta.txt" >&2

for r in $(seq "$ROUNDS"); do
    dir="$OUT/round$r"
    mkdir -p "$dir"
    log "round $r: waiting for a quiet machine"
    wait_quiet >"$dir/quiet.load"
    log "round $r: $(cat "$dir/quiet.load") cores busy before it"
    # Odd rounds start with Ballast, even rounds with llama-server, in every pair of sessions.
    if (( r % 2 )); then order=(ballast llama); else order=(llama ballast); fi
    if has_case single || has_case prefill; then
        for s in "${order[@]}"; do session "$s" single "$Q4_1" "$dir" "$r"; done
    fi
    if has_case single_q4_0; then
        for s in "${order[@]}"; do session "$s" single "$Q4_0" "$dir" "$r"; done
    fi
    if has_case conc || has_case prefix; then
        for s in "${order[@]}"; do session "$s" conc "$Q4_1" "$dir" "$r"; done
    fi
    if [[ -n "$INPROC" ]]; then
        RAYON_NUM_THREADS="$THREADS" "$INPROC" 128 128 >"$dir/inprocess.txt" 2>&1 \
            || log "the in-process bench failed (see $dir/inprocess.txt)"
    fi
done

if [[ "${LLAMA_BENCH:-1}" == 1 ]]; then
    log "llama-bench"
    files=(-m "$Q4_1")
    [[ -n "$Q4_0" ]] && files+=(-m "$Q4_0")
    "$LLAMA_BIN/llama-bench" "${files[@]}" -t "$THREADS" -p 128,512,2048 -n 128 -fa 0,1 -r 3 \
        -o md >"$OUT/llama-bench.md" 2>"$OUT/llama-bench.log" || log "llama-bench failed"
fi

python3 scripts/anchor_summary.py "$OUT" | tee "$OUT/summary.md"
