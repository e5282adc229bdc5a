#!/usr/bin/env bash
# Installs NVRTC (the CUDA runtime compiler, CUDA 11.8 in Debian 12) so that
# `cargo test -p ballast-kernels` compiles every kernel to PTX on a machine without a GPU.
#
# Idempotent: adds the `non-free` component to the Debian sources only when missing,
# installs only missing packages, and creates the unversioned `libnvrtc.so` link only when
# absent. Runs as root, or through sudo otherwise.
#
# Why the link: cudarc's dynamic loading tries names such as `libnvrtc.so`; Debian's runtime
# package ships only the versioned `libnvrtc.so.11.2` (the unversioned name belongs to the
# -dev package, which pulls in the whole toolkit).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

SOURCES=/etc/apt/sources.list.d/debian.sources
if [ -f "$SOURCES" ]; then
    if grep -q '^Components:' "$SOURCES" && grep '^Components:' "$SOURCES" | grep -vq 'non-free\b'; then
        # Append non-free (and contrib, which non-free packages may depend on) to every
        # Components line that lacks it.
        $SUDO sed -i -E '/^Components:/{/[[:space:]]non-free([[:space:]]|$)/!s/$/ contrib non-free/}' "$SOURCES"
        echo "install-nvrtc: added contrib non-free to $SOURCES"
    fi
elif [ -f /etc/apt/sources.list ] && ! grep -Eq '^deb .* non-free( |$)' /etc/apt/sources.list; then
    $SUDO sed -i -E '/^deb /{/ non-free( |$)/!s/$/ contrib non-free/}' /etc/apt/sources.list
    echo "install-nvrtc: added contrib non-free to /etc/apt/sources.list"
fi

PACKAGES=(libnvrtc11.2 libnvrtc-builtins11.8)
missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Where the library landed: the shortest versioned name is the SONAME link
# (/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2), which survives package upgrades.
lib=$(dpkg -L libnvrtc11.2 | grep -E '/libnvrtc\.so\.[0-9.]+$' | awk '{ print length($0), $0 }' | sort -n | head -n1 | cut -d' ' -f2-)
if [ -z "$lib" ]; then
    echo "install-nvrtc: libnvrtc11.2 is installed but ships no libnvrtc.so.*" >&2
    exit 1
fi
dir=$(dirname "$lib")
if [ ! -e "$dir/libnvrtc.so" ]; then
    $SUDO ln -s "$(basename "$lib")" "$dir/libnvrtc.so"
    echo "install-nvrtc: linked $dir/libnvrtc.so -> $(basename "$lib")"
fi
$SUDO ldconfig
echo "install-nvrtc: NVRTC at $lib"
