#!/usr/bin/env bash
# Builds the upstream cluster's binaries from Go modules (sim/upstream/gomod/*, go.sum pinned) into a cache outside
# the repository, keyed by the Kubernetes version and a digest of the module files and the Go toolchain:
#   ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/upstream/<k8s-version>-<digest>/bin
# A second run with the same key is a no-op. Prints the bin directory on the last line of stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mods=$here/gomod
k8s_version=$(sed -n "s/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p" "$mods/kube/go.mod" | head -1)
[ -n "$k8s_version" ] || { echo "build: no k8s.io/kubernetes version in $mods/kube/go.mod" >&2; exit 2; }
command -v go >/dev/null || { echo "build: go not found on PATH (Go ${GO_MIN:-1.26} is needed for the upstream backend)" >&2; exit 2; }
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0
digest=$( (go version; cat "$mods"/*/go.mod "$mods"/*/go.sum "$mods"/*/*.go "$0") | sha256sum | cut -c1-12)
out=${GPU_DRA_CACHE:-$HOME/.cache/gpu-dra}/upstream/$k8s_version-$digest
bin=$out/bin
if [ -f "$out/complete" ]; then
  echo "build: $k8s_version binaries are cached in $bin" >&2
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
start=$(date +%s)
step() { echo "build: [$(( $(date +%s) - start ))s] $*" >&2; }

# The version the components report (kubectl version, the node's kubeletVersion), as Kubernetes' own build stamps it.
major=${k8s_version#v}; minor=${major#*.}; minor=${minor%%.*}; major=${major%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp="$stamp -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  stamp="$stamp -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() {  # module-dir output-name package [extra ldflags]
  local dir=$1 name=$2 pkg=$3 extra=${4:-}
  step "go build $pkg"
  (cd "$mods/$dir" && go build -tags "${TAGS:-}" -ldflags "-s -w $extra" -o "$bin/$name" "$pkg")
}
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  build kube "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$stamp"
done
build etcd etcd .
TAGS="no_btrfs no_devmapper no_zfs" build containerd containerd github.com/containerd/containerd/v2/cmd/containerd
build containerd containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
build containerd ctr github.com/containerd/containerd/v2/cmd/ctr
mkdir -p "$out/cni"
for p in main/bridge main/loopback ipam/host-local meta/portmap; do
  (cd "$mods/cni" && step "go build CNI ${p#*/}" && go build -ldflags "-s -w" -o "$out/cni/${p#*/}" "github.com/containernetworking/plugins/plugins/$p")
done
echo "$k8s_version" > "$out/complete"
# Older builds of this version (other module files or toolchain) are replaced by this one: ~630 MiB each.
for stale in "${out%-*}"-*; do
  [ "$stale" = "$out" ] || rm -rf "$stale"
done
step "done: $(du -sh "$out" | cut -f1) in $out"
echo "$bin"
