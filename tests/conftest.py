"""Shared pytest fixtures."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from controller.validationhooks import validation_admission
from gpudra.kubeapi import KubeApi


# `make test-fast` sets this and deselects the tests marked `process` (or `slow`): a test left unmarked that starts a
# process anyway (the CLI, a container runtime, a cluster, a compiler) fails there, naming itself, instead of
# slowing the edit-test loop down unnoticed.
FAST_ENV = "GPU_DRA_TEST_FAST"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(FAST_ENV) != "1":
        return
    real_init = subprocess.Popen.__init__

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "a fixture").split(" ")[0]
        pytest.fail(f"{test} starts a process ({args!r}) under `make test-fast`: mark it @pytest.mark.process",
                    pytrace=False)

    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    config.add_cleanup(lambda: setattr(subprocess.Popen, "__init__", real_init))


@dataclass
class RunningApiServer:
    server: EmbeddedApiServer
    url: str
    kubeconfig: Path
    api: KubeApi


# resource.k8s.io's beta versions, which a 1.37 kube-apiserver serves only when --runtime-config enables them.
RESOURCE_BETAS = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"


def _server_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What a test's `@pytest.mark.apiserver_options(runtime_config=..., features=...)` asks of the server."""
    marker = request.node.get_closest_marker("apiserver_options")
    return dict(marker.kwargs) if marker is not None else {}


@pytest.fixture
def apiserver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningApiServer]:
    """A started embedded control plane (validation admission wired when available) with a connected KubeApi."""
    server = EmbeddedApiServer(admission=validation_admission(), **_server_options(request))
    url = server.start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    api = KubeApi.connect(url=url)
    try:
        yield RunningApiServer(server, url, kubeconfig, api)
    finally:
        api.close()
        server.stop()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedApiServer]:
    """A started embedded control plane without admission, for tests that speak to it on the wire themselves."""
    srv = EmbeddedApiServer(**_server_options(request))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
