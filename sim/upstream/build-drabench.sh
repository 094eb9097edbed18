#!/usr/bin/env bash
# Builds drabench (sim/upstream/gotools/drabench: kube-scheduler's DRA allocator, k8s.io/dynamic-resource-allocation,
# driven directly by `gpu-dra bench allocate --kubernetes upstream`) from its pinned Go module into a cache outside
# the repository, keyed by the library's version and a digest of the module files, this script and the Go toolchain:
#   ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/upstream/drabench-<version>-<digest>/drabench
# A second run with the same key is a no-op. Prints the binary's path on the last line of stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod=$here/gotools/drabench
version=$(sed -n "s/^[[:space:]]*k8s.io\/dynamic-resource-allocation \(v[0-9.]*\).*/\1/p" "$mod/go.mod" | head -1)
[ -n "$version" ] || { echo "build: no k8s.io/dynamic-resource-allocation version in $mod/go.mod" >&2; exit 2; }
command -v go >/dev/null || { echo "build: go not found on PATH (Go ${GO_MIN:-1.26} builds kube-scheduler's allocator)" >&2; exit 2; }
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0
digest=$( (go version; cat "$mod/go.mod" "$mod/go.sum" "$mod"/*.go "$here/build-drabench.sh") | sha256sum | cut -c1-12)
# The "drabench-" prefix keeps this cache and the cluster's (<k8s-version>-<digest>, a "v" first) apart: neither
# build's clean-up of its own older builds below can match the other's directory.
out=${GPU_DRA_CACHE:-$HOME/.cache/gpu-dra}/upstream/drabench-$version-$digest
if [ -f "$out/complete" ] && [ -x "$out/drabench" ]; then
  echo "build: drabench ($version) is cached in $out" >&2
  echo "$out/drabench"
  exit 0
fi
start=$(date +%s)
echo "build: [0s] go build drabench (k8s.io/dynamic-resource-allocation $version) into $out" >&2
mkdir -p "$out"
rm -f "$out/complete"
# Into a temporary name first: a build cut short leaves no binary that a later run could take for a whole one.
(cd "$mod" && go build -ldflags "-s -w" -o "$out/drabench.partial" .)
mv -f "$out/drabench.partial" "$out/drabench"
echo "$version" > "$out/complete"
# Older builds of this tool (other module files, script or toolchain) are replaced by this one.
for stale in "${out%-*}"-*; do
  case "$stale" in
    "$out") ;;
    */drabench-*) rm -rf "$stale" ;;
  esac
done
echo "build: [$(( $(date +%s) - start ))s] done: $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out/drabench"
