#!/usr/bin/env bash
# `ballast gateway` against Envoy round robin, side by side in one run: routing (prefix
# affinity, a slow replica) and the gateway's own cost (added latency at 200 and 1,000
# requests/s, CPU and memory at 1,000 endpoints). See scripts/bench_gateway.py --help.
#
#   scripts/bench-gateway.sh [--rounds N] [--out DIR] [--only prefix,slow-replica,overhead]
#
# About 10 minutes on 2 cores with the default 2 rounds, plus the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p ballast
exec python3 scripts/bench_gateway.py "$@"
