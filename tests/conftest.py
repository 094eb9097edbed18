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
