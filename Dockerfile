# The node agent, the controller and the webhook share one image. It ships only what runs in a cluster: not the
# testbed (sim/), the benchmarks (bench/) or the embedded control plane (controlplane/); `gpu-dra demo` and the
# like say so and point at a source install.
#
# Multi-arch (linux/amd64, linux/arm64 for GH200/GB200 nodes): `make image-multiarch IMAGE=...` (docker buildx).
# The base is pinned by digest (a multi-arch index); refresh it with
#   docker buildx imagetools inspect python:3.11-slim --format '{{json .Manifest.Digest}}'
ARG BASE_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${BASE_IMAGE}
WORKDIR /src
# Dependencies first and exactly as locked (tools/lockdeps.py), so a rebuild of the code reuses this layer.
COPY requirements.lock ./
RUN pip install --no-cache-dir --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY gpudra ./gpudra
COPY driver ./driver
COPY controller ./controller
COPY cli ./cli
RUN pip install --no-cache-dir --no-deps . && rm -rf /src && gpu-dra --version
WORKDIR /
USER 0
ENTRYPOINT []
CMD ["gpu-dra", "--help"]
