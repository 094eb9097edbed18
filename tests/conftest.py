"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane import EmbeddedApiServer
from controller.validationhooks import validation_admission
from gpudra.kubeapi import KubeApi


@dataclass
class RunningApiServer:
    server: EmbeddedApiServer
    url: str
    kubeconfig: Path
    api: KubeApi


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[RunningApiServer]:
    """A started embedded control plane (validation admission wired when available) with a connected KubeApi."""
    server = EmbeddedApiServer(admission=validation_admission())
    url = server.start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    api = KubeApi.connect(url=url)
    try:
        yield RunningApiServer(server, url, kubeconfig, api)
    finally:
        api.close()
        server.stop()


@pytest.fixture
def server() -> Iterator[EmbeddedApiServer]:
    """A started embedded control plane without admission, for tests that speak to it on the wire themselves."""
    srv = EmbeddedApiServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
