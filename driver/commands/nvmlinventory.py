"""What the one-shot commands (`inventory`, `slices`) share: one discovery through an NVML backend spec."""

from __future__ import annotations

import sys

from driver.discovery import discover
from driver.inventory import Inventory
from driver.nvml import load_backend
from driver.nvmlapi import BackendConfigError, NvmlUnavailable


def discover_once(nvml_spec: str, node: str, prog: str) -> Inventory | None:
    """Load the backend, discover, shut NVML down; on a backend error print it as `prog: ...` and return None."""
    try:
        nvml = load_backend(nvml_spec, node=node)
    except NvmlUnavailable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    except BackendConfigError as exc:
        print(f"{prog}: invalid simulator profile:\n{exc}", file=sys.stderr)
        return None
    try:
        return discover(nvml, node)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - a failing shutdown must not hide the inventory or the real error
            pass
