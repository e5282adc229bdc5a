#!/usr/bin/env bash
# Cost of the metrics pipeline on the step loop: decode-step time (mean ITL seen by the
# client) of synthetic:small with statistics on versus --disable-log-stats, runs
# interleaved on/off so machine noise hits both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q
bin=target/release/ballast
rounds=${ROUNDS:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run() { # $1 = on|off, $2 = round
  local flags=()
  [ "$1" = off ] && flags=(--disable-log-stats)
  mkfifo "$dir/fifo-$1-$2"
  "$bin" engine --model synthetic:small --port 0 "${flags[@]}" >"$dir/fifo-$1-$2" 2>/dev/null &
  local pid=$!
  exec 3<"$dir/fifo-$1-$2"
  read -r line <&3
  "$bin" bench --url "${line#ballast engine listening on }" --concurrency 8 --num-requests 32 \
    --input-len 16 --output-len 128 --ignore-eos --stream --no-progress --json "$dir/$1-$2.json" >/dev/null
  kill -TERM "$pid"; wait "$pid" || true
  exec 3<&-
}

for r in $(seq 1 "$rounds"); do run on "$r"; run off "$r"; done
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
itl = {m: [json.load(open(f"{d}/{m}-{r}.json"))["itl_s"]["mean"] for r in range(1, rounds + 1)] for m in ("on", "off")}
tps = {m: [json.load(open(f"{d}/{m}-{r}.json"))["output_tokens_per_s"] for r in range(1, rounds + 1)] for m in ("on", "off")}
on, off = statistics.median(itl["on"]), statistics.median(itl["off"])
print(f"mean ITL (decode step) stats on:  {on*1e3:.2f} ms  runs {[round(x*1e3, 2) for x in itl['on']]}")
print(f"mean ITL (decode step) stats off: {off*1e3:.2f} ms  runs {[round(x*1e3, 2) for x in itl['off']]}")
print(f"output tok/s on {statistics.median(tps['on']):.1f}, off {statistics.median(tps['off']):.1f}")
print(f"overhead of statistics: {(on / off - 1) * 100:+.2f} % (goal: under 1 %)")
PY
