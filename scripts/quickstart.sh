#!/usr/bin/env bash
# Quickstart: build Ballast, start one engine on the built-in synthetic model, load it with
# a short benchmark, then stop it with SIGTERM (the engine drains and exits 0).
#
#   scripts/quickstart.sh            # synthetic:small, 48 requests at concurrency 8
#   MODEL=synthetic:tiny scripts/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."

model=${MODEL:-synthetic:small}
cargo build --release --locked
bin=target/release/ballast

# The engine prints "ballast engine listening on URL" once its port is bound; reading that
# line through a FIFO waits exactly as long as start-up takes.
dir=$(mktemp -d)
mkfifo "$dir/out"
"$bin" engine --model "$model" --port 0 >"$dir/out" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
exec 3<"$dir/out"
read -r line <&3
url=${line#ballast engine listening on }
echo "engine $model is up at $url"

"$bin" bench --url "$url" --concurrency 8 --num-requests 48 \
  --input-len 128 --output-len 64 --shared-prefix-len 64 --tenants 4 \
  --stream --ignore-eos

echo "stopping the engine with SIGTERM (it drains in-flight requests first)"
kill -TERM "$pid"
wait "$pid"
echo "engine exited with status $?"
trap 'rm -rf "$dir"' EXIT
