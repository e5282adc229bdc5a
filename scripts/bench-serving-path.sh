#!/usr/bin/env bash
# What the HTTP serving path costs single-stream decode: the engine's own forward pass
# in-process (engine/benches/real_model.rs, greedy, no server) against the same model served
# by `ballast engine` and streamed to `ballast bench` (128 prompt + 128 output tokens, EOS
# ignored), alternating rounds so both see the same machine. Both use 2 threads.
#
#   scripts/bench-serving-path.sh [ROUNDS] [MODEL]      # default 3 rounds, smollm2-135m
#
# Prints, per round, in-process decode tok/s, served decode tok/s (1 / mean TPOT) and the
# ratio. Run it on a quiet machine (`uptime`): the two cores are the whole budget.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
model=${2:-smollm2-135m}
scripts/fetch-model.sh >/dev/null
cargo build -q --release -p ballast
bench=$(cargo bench -q -p ballast-engine --bench real_model --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*real_model[^"]*\)".*/\1/p' | tail -1)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
tmp=$(mktemp -d); trap 'kill "$engine" 2>/dev/null; rm -rf "$tmp"' EXIT
RAYON_NUM_THREADS=2 ./target/release/ballast engine --model "$model" --port "$port" --max-num-seqs 1 \
    >"$tmp/engine.log" 2>&1 &
engine=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
# One warm-up request: the map and the caches, as the in-process bench warms them.
./target/release/ballast bench --url "http://127.0.0.1:$port" --concurrency 1 --num-requests 1 \
    --input-len 128 --output-len 16 --ignore-eos --stream --no-progress >/dev/null
printf '%-6s %14s %14s %8s\n' round in-process served ratio
for r in $(seq "$rounds"); do
    # The server idles (its rank thread sleeps) while the in-process bench runs.
    inproc=$(RAYON_NUM_THREADS=2 "$bench" 128 128 | awk '$1=="decode" && $2!="/" {print $2}')
    ./target/release/ballast bench --url "http://127.0.0.1:$port" --concurrency 1 --num-requests 4 \
        --input-len 128 --output-len 128 --ignore-eos --stream --no-progress --json "$tmp/r.json" >/dev/null
    served=$(python3 -c 'import json,sys;r=json.load(open(sys.argv[1]));print(f"{1/r[\"tpot_s\"][\"mean\"]:.1f}")' "$tmp/r.json")
    ratio=$(python3 -c "print(f'{$served/$inproc:.2f}')")
    printf '%-6s %14s %14s %8s\n' "$r" "$inproc" "$served" "$ratio"
done
