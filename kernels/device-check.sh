#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one script:
#   1. every kernel against its CPU reference on random input (kernels/tests/it/device.rs);
#   2. every backend op against the CPU backend, and greedy decoding of synthetic models on
#      both backends, token for token (engine/tests/it/cuda.rs);
#   3. the benchmarks of docs/benchmarks.md: copy bandwidth, paged decode attention at
#      Llama-3-8B shapes, batch-1 decode of synthetic:llama-3-8b (engine/tests/it/cuda.rs,
#      device_benchmarks), written as Markdown to $OUT/device-check.md when OUT is set.
#
# Usage (from anywhere in the repository):
#   kernels/device-check.sh build [DIR]   build the test binaries here (needs cargo and the
#                                         crates) into DIR (default target-device/), stripped
#   kernels/device-check.sh run [DIR]     run the binaries in DIR on the GPU machine
#   kernels/device-check.sh               build, then run (a GPU machine with cargo)
#
# A GPU machine without network access: run `build` here, then carry target-device/ there
# (the library's `run` tool: carry ["target-device"]) and call `run`.
#
# Needs on the GPU machine: the NVIDIA driver (libcuda.so.1), cuBLAS (libcublas.so.12) and
# NVRTC (a CUDA 12 toolkit's libnvrtc.so, or Debian's, see kernels/install-nvrtc.sh).
set -uo pipefail

cd "$(dirname "$0")/.."
mode=${1:-all}
dir=${2:-target-device}

build() {
    mkdir -p "$dir"
    local list
    list=$(mktemp)
    # Release test binaries (each crate's one, `it`): the kernels' device tests and the
    # engine's CUDA tests are modules of them, run by name below.
    local crate name exe
    for pair in ballast-kernels:device ballast-engine:cuda; do
        crate=${pair%%:*}
        name=${pair#*:}
        if ! cargo test --release -p "$crate" --test it --no-run --message-format=json >"$list"; then
            echo "device-check: FAILED to build" >&2
            return 1
        fi
        exe=$(grep -o "\"executable\":\"[^\"]*/deps/it-[^\"]*\"" "$list" | tail -1 | cut -d'"' -f4)
        if [ -z "$exe" ]; then
            echo "device-check: no test binary of $crate in cargo's output" >&2
            return 1
        fi
        cp "$exe" "$dir/$name"
        strip "$dir/$name" 2>/dev/null || true
    done
    rm -f "$list"
    # The GPU machine may have no NVRTC: carry this machine's (Debian's CUDA 11.8 NVRTC, about
    # 62 MB with its builtins; `run` uses it only where the system has none).
    mkdir -p "$dir/lib"
    for lib in libnvrtc.so libnvrtc-builtins.so.11.8; do
        local found
        found=$(ldconfig -p 2>/dev/null | grep -o "/[^ ]*/$lib\$" | head -1)
        [ -n "$found" ] && cp -L "$found" "$dir/lib/$lib"
    done
    du -ch "$dir"/device "$dir"/cuda "$dir"/lib/* 2>/dev/null | sed 's/^/  /'
    echo "  (the run tool carries at most 64 MiB)"
}

run() {
    for name in device cuda; do
        if [ ! -x "$dir/$name" ]; then
            echo "device-check: $dir/$name is missing; run '$0 build $dir' first" >&2
            return 1
        fi
    done
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
    else
        echo "device-check: nvidia-smi not found; the tests will fail if no GPU is usable" >&2
    fi
    if ! ldconfig -p 2>/dev/null | grep -q libnvrtc.so && [ -e "$dir/lib/libnvrtc.so" ]; then
        echo "device-check: no system NVRTC; using the carried $dir/lib/libnvrtc.so" >&2
        export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
    fi
    for lib in libcuda.so.1 libcublas.so; do
        ldconfig -p 2>/dev/null | grep -q "$lib" || echo "device-check: $lib not in the linker cache (set LD_LIBRARY_PATH if it is elsewhere)" >&2
    done
    export BALLAST_REQUIRE_NVRTC=1
    local out=${OUT:-$dir}
    mkdir -p "$out"
    local log="$out/device-check.log"
    local status=0
    local start
    start=$(date +%s)
    echo "=== kernels against their CPU references ===" | tee "$log"
    "$dir/device" device:: --include-ignored --test-threads=1 2>&1 | tee -a "$log" || status=1
    echo "=== CUDA backend against the CPU backend ===" | tee -a "$log"
    "$dir/cuda" cuda:: --include-ignored --test-threads=1 --skip device_benchmarks 2>&1 | tee -a "$log" || status=1
    echo "=== benchmarks ===" | tee -a "$log"
    BALLAST_BENCH_OUT="$out/device-check.md" \
        "$dir/cuda" --ignored --exact cuda::device_benchmarks --nocapture 2>&1 | tee -a "$log" || status=1
    echo
    echo "=== device-check summary ($(($(date +%s) - start)) s) ==="
    grep -E '^test .* \.\.\. (ok|FAILED|ignored)' "$log" | sed 's/^test /  /'
    grep -E '^test result:' "$log" | sed 's/^/  /'
    if [ "$status" -eq 0 ]; then
        echo "device-check: PASSED"
    else
        echo "device-check: FAILED"
    fi
    return "$status"
}

case "$mode" in
build) build ;;
run) run ;;
all) build && run ;;
*)
    echo "usage: $0 [build|run] [DIR]" >&2
    exit 2
    ;;
esac
