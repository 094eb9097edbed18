"""The MPS and IMEX daemon pods' image is the agent's or controller's own (read from its Pod), so one image
reference serves all, with the pull secrets that Pod was pulled with."""

from __future__ import annotations

import pytest

from gpudra.ownpod import OwnImage, own_image, secret_names


def test_own_image_from_the_pod(apiserver) -> None:  # type: ignore[no-untyped-def]
    api = apiserver.api
    api.create("Namespace", {"metadata": {"name": "gpu-dra-system"}})
    api.create("Pod", {"metadata": {"name": "agent-x", "namespace": "gpu-dra-system"}, "spec": {
        "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}], "containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "node-agent", "image": "registry.example.com/gpu-dra@sha256:" + "b" * 64}]}},
        namespace="gpu-dra-system")
    assert own_image(api, "gpu-dra-system", "agent-x", "node-agent") == OwnImage(
        "registry.example.com/gpu-dra@sha256:" + "b" * 64, ("regcred", "mirror"))
    assert secret_names(" regcred, ,mirror ") == ("regcred", "mirror")
    with pytest.raises(ValueError, match=r"no container 'agent' .*containers: sidecar, node-agent; set --container-name"):
        own_image(api, "gpu-dra-system", "agent-x", "agent")
    with pytest.raises(ValueError, match=r"cannot read Pod gpu-dra-system/missing"):
        own_image(api, "gpu-dra-system", "missing", "node-agent")
    with pytest.raises(ValueError, match=r"\$POD_NAME is not set"):
        own_image(api, "gpu-dra-system", "", "node-agent")


def test_controller_gives_the_imex_daemons_its_own_image_and_pull_secrets(apiserver) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from controller.commands.controller import config_from_args, daemon_image_from_pod, register

    api = apiserver.api
    api.create("Namespace", {"metadata": {"name": "gpu-dra-system"}})
    api.create("Pod", {"metadata": {"name": "ctl-1", "namespace": "gpu-dra-system"}, "spec": {
        "imagePullSecrets": [{"name": "regcred"}],
        "containers": [{"name": "controller", "image": "registry.example.com/mirror/gpu-dra:v9"}]}},
        namespace="gpu-dra-system")
    parser = argparse.ArgumentParser()
    register(parser)
    env = {"POD_NAME": "ctl-1", "POD_NAMESPACE": "gpu-dra-system"}
    args = parser.parse_args(["--compute-domain-daemon-image-from-pod"])
    config = daemon_image_from_pod(api, args, config_from_args(args), env)
    assert (config.compute_domain_daemon_image, config.compute_domain_daemon_pull_secrets) == (
        "registry.example.com/mirror/gpu-dra:v9", ("regcred",))
    args = parser.parse_args(["--compute-domain-daemon-image-from-pod", "--compute-domain-daemon-image-pull-secrets=a,b"])
    assert daemon_image_from_pod(api, args, config_from_args(args), env).compute_domain_daemon_pull_secrets == ("a", "b")
    args = parser.parse_args(["--compute-domain-daemon-image-from-pod", "--container-name=ctl"])
    with pytest.raises(ValueError, match="no container 'ctl'"):
        daemon_image_from_pod(api, args, config_from_args(args), env)
