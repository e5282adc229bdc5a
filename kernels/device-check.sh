#!/usr/bin/env bash
# Runs the kernel tests on a machine with an NVIDIA GPU: compiles every kernel with NVRTC for
# the GPU's architecture, launches each on random input and compares it with its CPU
# reference (the #[ignore]d tests in kernels/tests/device.rs), plus the CPU-only tests.
#
# Needs: the NVIDIA driver (libcuda.so), NVRTC (Debian 12: kernels/install-nvrtc.sh; a CUDA
# 12 toolkit's libnvrtc.so works too) and a Rust toolchain. Run from anywhere in the repo.
set -uo pipefail

cd "$(dirname "$0")/.."
export BALLAST_REQUIRE_NVRTC=1

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
else
    echo "device-check: nvidia-smi not found; the device tests will fail if no GPU is usable" >&2
fi

start=$(date +%s)
if ! cargo build -p ballast-kernels --release --tests; then
    echo "device-check: FAILED to build" >&2
    exit 1
fi
log=$(mktemp)
cargo test -p ballast-kernels --release -- --include-ignored 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
end=$(date +%s)

echo
echo "=== device-check summary ($((end - start)) s) ==="
grep -E '^test .* \.\.\. (ok|FAILED|ignored)' "$log" | sed 's/^test /  /'
grep -E '^test result:' "$log" | sed 's/^/  /'
rm -f "$log"
if [ "$status" -eq 0 ]; then
    echo "device-check: PASSED"
else
    echo "device-check: FAILED (exit $status)"
fi
exit "$status"
