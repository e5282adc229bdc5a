#!/usr/bin/env bash
# Ballast against llama.cpp on the default real model (SmolLM2-135M Q4_1), single stream,
# two threads, alternating so both see the same machine. Needs llama-cpp-python 0.3.36 in
# $LLAMA_CPP_PYTHON's environment (default: python3); see scripts/reference/greedy.py.
#
#   LLAMA_CPP_PYTHON=/tmp/llamacpp/bin/python scripts/bench-real-model.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
py=${LLAMA_CPP_PYTHON:-python3}
model=$(scripts/fetch-model.sh)
cargo bench -q -p ballast-engine --bench real_model --no-run
bench=$(cargo bench -q -p ballast-engine --bench real_model --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*real_model[^"]*\)".*/\1/p' | tail -1)
for r in $(seq "$rounds"); do
    echo "== round $r: ballast"
    RAYON_NUM_THREADS=2 "$bench" 128 128
    echo "== round $r: llama.cpp"
    "$py" scripts/reference/bench_llama_cpp.py "$model" 128 128
done
