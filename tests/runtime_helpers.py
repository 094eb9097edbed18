"""Gate for tests that start real containers: they run in CI (CI=true, where .ci/run installs podman, runc and
busybox-static and runs as root) and fail there when the machine cannot; elsewhere they skip with the reason."""

from __future__ import annotations

import os

import pytest

from sim.runtime import INSTALL_HINT, podman_missing


def require_podman() -> None:
    missing = podman_missing()
    if not missing:
        return
    why = f"containers cannot run here: {'; '.join(missing)} (install: {INSTALL_HINT}, as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: the runtime tests must run, but {why}")
    pytest.skip(why)
