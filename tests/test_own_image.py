"""The MPS daemon pods' image is the agent pod's own (read from its Pod), so one image reference serves both."""

from __future__ import annotations

import pytest

from driver.commands.plugin import own_image


def test_own_image_from_the_pod(apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    api.create("Namespace", {"metadata": {"name": "gpu-dra-system"}})
    api.create("Pod", {"metadata": {"name": "agent-x", "namespace": "gpu-dra-system"}, "spec": {"containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "node-agent", "image": "registry.example.com/gpu-dra@sha256:" + "b" * 64}]}},
        namespace="gpu-dra-system")
    assert own_image(api, "gpu-dra-system", "agent-x", "node-agent") == "registry.example.com/gpu-dra@sha256:" + "b" * 64
    with pytest.raises(ValueError, match=r"no container 'agent' .*containers: sidecar, node-agent; set --container-name"):
        own_image(api, "gpu-dra-system", "agent-x", "agent")
    with pytest.raises(ValueError, match=r"cannot read Pod gpu-dra-system/missing"):
        own_image(api, "gpu-dra-system", "missing", "node-agent")
    with pytest.raises(ValueError, match=r"\$POD_NAME is not set"):
        own_image(api, "gpu-dra-system", "", "node-agent")
