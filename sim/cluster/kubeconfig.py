"""A cluster's context in the user's kubeconfig, merged in on `up` and removed on `down`, as kind does.

The target file is `--kubeconfig FILE`, else the first file of $KUBECONFIG, else ~/.kube/config. Entries of other
clusters are kept as they are; ours are named `gpu-dra-NAME` (cluster, user and context).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpudra.atomicfile import atomic_write


def context_name(cluster: str) -> str:
    return f"gpu-dra-{cluster}"


def target_file(explicit: str | None, environ: Mapping[str, str] = os.environ) -> Path:
    if explicit:
        return Path(explicit).expanduser().absolute()
    first = next((p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p), None)
    if first:
        return Path(first).expanduser().absolute()
    return Path.home() / ".kube" / "config"


def _empty() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": [],
            "current-context": "", "preferences": {}}


def _replace(entries: list[dict[str, Any]], name: str, entry: dict[str, Any] | None) -> list[dict[str, Any]]:
    kept = [e for e in entries if isinstance(e, dict) and e.get("name") != name]
    return kept + ([entry] if entry is not None else [])


def with_context(config: dict[str, Any] | None, cluster: str, server: dict[str, Any],
                 user: dict[str, Any]) -> dict[str, Any]:
    """`config` with our cluster (`server`: a kubeconfig cluster entry, the URL and its CA) and user (its
    credential) set, and our context made current (pure)."""
    out = dict(config or _empty())
    name = context_name(cluster)
    out["clusters"] = _replace(list(out.get("clusters") or []), name, {"name": name, "cluster": dict(server)})
    out["users"] = _replace(list(out.get("users") or []), name, {"name": name, "user": dict(user)})
    out["contexts"] = _replace(list(out.get("contexts") or []), name,
                               {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}})
    out["current-context"] = name
    out.setdefault("apiVersion", "v1")
    out.setdefault("kind", "Config")
    return out


def admin_access(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cluster entry (HTTPS URL and CA) and the user entry (the admin's token) of the kubeconfig the
    control plane wrote."""
    config = _read(path) or {}
    clusters = [c.get("cluster") for c in config.get("clusters") or [] if isinstance(c, dict)]
    users = [u.get("user") for u in config.get("users") or [] if isinstance(u, dict)]
    if not clusters or not isinstance(clusters[0], dict) or not users or not isinstance(users[0], dict):
        raise KubeconfigError(f"{path}: the control plane's kubeconfig has no cluster or no user")
    return clusters[0], users[0]


def without_context(config: dict[str, Any], cluster: str) -> dict[str, Any]:
    """`config` without our entries; the current context is unset if it was ours (pure)."""
    out = dict(config)
    name = context_name(cluster)
    for key in ("clusters", "users", "contexts"):
        out[key] = _replace(list(out.get(key) or []), name, None)
    if out.get("current-context") == name:
        out["current-context"] = ""
    return out


class KubeconfigError(RuntimeError):
    pass


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"{path}: not a valid kubeconfig (YAML error: {exc}); fix or move it, or pass "
                              "--kubeconfig FILE") from exc
    if data is None:
        return None
    if not isinstance(data, dict):
        raise KubeconfigError(f"{path}: not a valid kubeconfig (expected a mapping with clusters, users, contexts)")
    return data


def _write(path: Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, yaml.safe_dump(config, sort_keys=False).encode(), mode=0o600)


def merge(path: Path, cluster: str, admin_kubeconfig: Path) -> str:
    """Add our context to `path` with the control plane's URL, CA and admin credential from `admin_kubeconfig`,
    made current; return the context that was current before ("" for none)."""
    server, user = admin_access(admin_kubeconfig)
    config = _read(path)
    previous = str((config or {}).get("current-context") or "")
    _write(path, with_context(config, cluster, server, user))
    return previous


def switch_notice(cluster: str, previous: str, path: Path) -> str:
    """The line `up` prints when it changed kubectl's current context (empty when ours was current already): a
    person's next `kubectl` goes elsewhere than before, which must not happen silently."""
    name = context_name(cluster)
    if previous == name:
        return ""
    was = f"was {previous}; `kubectl config use-context {previous}` switches back" if previous else "none was set before"
    return f"switched the current kubectl context in {path} to {name} ({was})"


def remove(path: Path, cluster: str) -> bool:
    """Remove our entries; True if there were any."""
    config = _read(path)
    if config is None:
        return False
    name = context_name(cluster)
    had = any(isinstance(c, dict) and c.get("name") == name for c in config.get("contexts") or [])
    _write(path, without_context(config, cluster))
    return had
