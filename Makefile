# Set-up and run targets. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KIND_CLUSTER ?= gpu-dra
# One fully qualified reference (the manifests' `images:` name); override for your registry.
IMAGE ?= ghcr.io/gpu-dra/gpu-dra:v0.1.0
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: install install-test demo test test-fast test-upstream lint bench proto lock upstream image-oci image image-multiarch kind-up kind-deploy kind-demo kind-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e .

# Reinstalled when pyproject.toml changes, not on every `make test`/`test-fast`/`lint` (.ci/run starts from no .venv).
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install-test: $(VENV)/.test-installed

demo: install
	$(BIN)/gpu-dra demo

test: install-test
	$(BIN)/pytest -q

# The edit-test loop: the unit tests that start no process and take no seconds (markers `process` and `slow`,
# pyproject.toml; tests/conftest.py fails an unmarked test that starts a process here).
test-fast: install-test
	GPU_DRA_TEST_FAST=1 $(BIN)/pytest -q -m "not process and not slow"

# ruff (rules in pyproject.toml's [tool.ruff]) over the whole tree; mypy (strict, [tool.mypy]) over the product.
lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy

# Real Kubernetes on this machine (root, Go): the end-to-end and differential tests of the upstream backend.
test-upstream: install-test upstream
	$(BIN)/pytest -q -m upstream

# Kubernetes 1.37 (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kube-proxy, kubectl), etcd,
# containerd and the CNI plugins, built from their Go modules into ~/.cache/gpu-dra/upstream/<version>-<digest>;
# and drabench (kube-scheduler's DRA allocator for `bench allocate --kubernetes upstream`) beside them.
upstream:
	bash sim/upstream/build.sh cluster
	bash sim/upstream/build.sh drabench

# The product image, its testbed variant (with the NVML simulator), pause and the workload stand-ins, as OCI
# archives built without docker (debootstrap + pip; root), cached in ~/.cache/gpu-dra/images.
image-oci: install
	$(BIN)/python -m sim.upstream.images

bench: install
	$(BIN)/gpu-dra bench allocate
	$(BIN)/gpu-dra bench prepare
	$(BIN)/gpu-dra bench cel

proto: install-test
	$(BIN)/python proto/generate.py

# requirements.lock: the runtime dependencies the image installs, pinned from this environment.
lock: install
	$(BIN)/python tools/lockdeps.py

# The image for this machine's architecture, loaded into the local docker.
image:
	docker build -t $(IMAGE) .

# amd64 + arm64 (GH200/GB200 nodes) in one manifest list, pushed to the registry of $(IMAGE): a multi-platform
# build cannot be loaded into the local docker. Needs a buildx builder with both platforms (QEMU or native nodes).
image-multiarch:
	docker buildx build --platform $(PLATFORMS) -t $(IMAGE) --push .

# The kind path needs docker and kind on the host; it cannot run in this project's CI.
kind-up:
	kind create cluster --name $(KIND_CLUSTER) --config manifests/kind/cluster.yaml

# The overlay runs the testbed image (the NVML simulator inside), built without docker and loaded as an archive.
kind-deploy: install
	kind load image-archive "$$($(BIN)/python -m sim.upstream.images --only testbed)" --name $(KIND_CLUSTER)
	kubectl apply -k manifests/kind/overlay
	kubectl -n gpu-dra-system rollout status daemonset/gpu-dra-node-agent --timeout=120s
	kubectl -n gpu-dra-system rollout status deployment/gpu-dra-controller --timeout=120s

kind-demo:
	kubectl apply -f manifests/examples/00-namespace.yaml
	kubectl apply -f manifests/examples/training-a100.yaml -f manifests/examples/notebook-v100.yaml
	kubectl get resourceslices -o wide
	kubectl -n gpu-demo get pods,resourceclaims -o wide

kind-down:
	kind delete cluster --name $(KIND_CLUSTER)
