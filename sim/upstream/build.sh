#!/usr/bin/env bash
# Builds what the upstream backend runs from pinned Go modules into a cache outside the repository, a no-op when
# cached; prints where on the last line of stdout:
#   build.sh [cluster]  Kubernetes, etcd, containerd and the CNI plugins (build-cluster.sh): the bin directory
#   build.sh drabench   kube-scheduler's DRA allocator driven directly (build-drabench.sh): the binary
# Each target is its own script because the cluster's cache key hashes its script ("$0"): moving the cluster build
# here from build.sh kept that script byte for byte, so its key (and every cache built before) stays valid.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-cluster}" in
  cluster) exec bash "$here/build-cluster.sh" ;;
  drabench) exec bash "$here/build-drabench.sh" ;;
  *) echo "usage: build.sh [cluster|drabench] (default cluster); got ${1@Q}" >&2; exit 2 ;;
esac
