#!/usr/bin/env bash
# Prometheus text parsing throughput on a large vLLM-format exposition: the operator's
# parser (Rust) against Python's prometheus_client parser, on the same file, in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo bench -p ballast-operator --bench parse 2>/dev/null)
echo "$out"
rust_mb_s=$(echo "$out" | sed -n 's/^ballast parser (Rust): \([0-9.]*\) MB\/s.*/\1/p')
if [ ! -x target/bench-venv/bin/python ]; then
  python3 -m venv target/bench-venv
fi
if ! target/bench-venv/bin/python -c 'import prometheus_client' 2>/dev/null; then
  target/bench-venv/bin/pip install -q prometheus_client
fi
target/bench-venv/bin/python scripts/parse_bench.py target/vllm-large.prom "$rust_mb_s"
