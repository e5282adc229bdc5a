#!/usr/bin/env bash
# Aggregate output tokens/s at 16 concurrent chat requests (about 128 prompt tokens, 128
# output tokens, EOS ignored where the server honours `ignore_eos`; llama-cpp-python's server
# takes neither token-id prompts nor that flag, so its answers may end early and its rate is
# per token actually generated) through `ballast bench`, against a Ballast engine and then against
# llama-cpp-python's OpenAI server on the same model file and thread count. The servers run
# one after the other, never together. Needs llama-cpp-python[server]==0.3.36 in
# $LLAMA_CPP_PYTHON's environment.
#
#   LLAMA_CPP_PYTHON=/tmp/llamacpp/bin/python scripts/bench-concurrent.sh [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-48}
py=${LLAMA_CPP_PYTHON:-python3}
model=$(scripts/fetch-model.sh)
cargo build -q --release -p ballast
bin=${CARGO_TARGET_DIR:-target}/release/ballast
bench() {
    "$bin" bench --url "http://127.0.0.1:$1" --model "$2" --concurrency 16 \
        --num-requests "$requests" --endpoint chat --input-len 128 --output-len 128 \
        --ignore-eos --no-progress --json "$3" | tail -25
}
wait_up() {
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return; sleep 1; done
    echo "server on port $1 did not come up" >&2
    exit 1
}

echo "== ballast engine (2 threads, --max-num-seqs 16)"
"$bin" engine --model "$model" --served-model-name m --port 18090 --cpu-threads 2 \
    --max-num-seqs 16 --max-model-len 512 >/tmp/bench-concurrent-ballast.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
wait_up 18090
bench 18090 m /tmp/bench-concurrent-ballast.json
kill $pid; wait $pid 2>/dev/null || true

echo "== llama-cpp-python server (2 threads)"
"$py" scripts/reference/llama_cpp_server.py --model "$model" --model_alias m --n_threads 2 \
    --n_ctx 4096 --port 18091 >/tmp/bench-concurrent-llama.log 2>&1 &
pid=$!
wait_up 18091
bench 18091 m /tmp/bench-concurrent-llama.json
