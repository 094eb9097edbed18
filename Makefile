# Set-up and run targets. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KIND_CLUSTER ?= gpu-dra
# One fully qualified reference (the manifests' `images:` name); override for your registry.
IMAGE ?= ghcr.io/gpu-dra/gpu-dra:dev
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: install install-test demo test test-fast lint bench proto lock image image-multiarch kind-up kind-deploy kind-demo kind-down

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

bench: install
	$(BIN)/gpu-dra bench allocate
	$(BIN)/gpu-dra bench prepare
	$(BIN)/gpu-dra bench cel

proto: install-test
	$(BIN)/python -m proto.generate

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

kind-deploy:
	docker build -t $(IMAGE) .
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)
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
