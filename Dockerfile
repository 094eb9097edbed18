# The node agent and the controller share one image.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpudra ./gpudra
COPY driver ./driver
COPY controller ./controller
COPY proto ./proto
COPY cli ./cli
COPY sim ./sim
COPY bench ./bench
COPY manifests /opt/gpu-dra/manifests
RUN pip install --no-cache-dir . && rm -rf /src
USER 0
ENTRYPOINT []
# `docker run IMAGE gpu-dra demo --manifests /opt/gpu-dra/manifests` runs the demo inside the image.
CMD ["gpu-dra", "--help"]
