#!/usr/bin/env bash
# /metrics render time of an engine with 8 DP ranks after a workload, against Python's
# prometheus_client rendering a registry with the same series and values, in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo bench -p ballast-engine --bench metrics_render 2>/dev/null)
echo "$out"
rust_us=$(echo "$out" | sed -n 's/^ballast (Rust, prometheus crate): \([0-9.]*\) µs.*/\1/p')
if [ ! -x target/bench-venv/bin/python ]; then
  python3 -m venv target/bench-venv
  target/bench-venv/bin/pip install -q prometheus_client
fi
target/bench-venv/bin/python scripts/metrics_render.py target/metrics-8-ranks.prom "$rust_us"
