"""A pod's volumes as the kubelet sets them up before its containers start: emptyDir (a directory per pod),
configMap and secret (their keys as files, `items` choosing keys and paths, `defaultMode`/`mode`, always mounted
read-only), under <kubelet dir>/pods/<pod uid>/volumes/ as the kubelet lays them out. A ConfigMap or Secret
that does not exist (and is not optional) fails the mount: MountVolume.SetUp failed for volume ... The mounts a
container gets follow its volumeMounts (mountPath, readOnly, subPath). Other volume types are not simulated."""

from __future__ import annotations

import base64
import os
import re
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
_PLUGIN_DIRS = {"emptyDir": "kubernetes.io~empty-dir", "configMap": "kubernetes.io~configmap",
                "secret": "kubernetes.io~secret"}


class VolumeError(Exception):
    """A volume that cannot be set up; the message is the kubelet's FailedMount text."""


@dataclass(frozen=True)
class Mount:
    host: Path
    container: str
    read_only: bool


def pod_dir(kubelet_dir: Path, uid: str) -> Path:
    if not _UID.match(uid):
        raise VolumeError(f"pod uid {uid!r} is not a Kubernetes UID")
    return kubelet_dir / "pods" / uid


def object_files(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's (data, binaryData) or a Secret's (data, stringData) keys and their bytes."""
    if kind == "ConfigMap":
        out = {str(k): str(v).encode() for k, v in (obj.get("data") or {}).items()}
        out.update({str(k): base64.b64decode(str(v)) for k, v in (obj.get("binaryData") or {}).items()})
        return out
    out = {str(k): base64.b64decode(str(v)) for k, v in (obj.get("data") or {}).items()}
    out.update({str(k): str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def _safe_relative(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


def set_up(kubelet_dir: Path, pod: Mapping[str, Any], lookup: Lookup) -> dict[str, Path]:
    """Create the pod's volumes; returns volume name -> host directory (types not simulated are left out)."""
    meta = pod.get("metadata") or {}
    namespace, uid = str(meta.get("namespace") or "default"), str(meta.get("uid") or "")
    base = pod_dir(kubelet_dir, uid) / "volumes"
    out: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(volume, Mapping):
            continue
        name = str(volume.get("name") or "")
        kind = next((k for k in _PLUGIN_DIRS if k in volume), None)
        if kind is None or not _UID.match(name.replace(".", "-")):
            continue
        target = base / _PLUGIN_DIRS[kind] / name
        if kind == "emptyDir":
            target.mkdir(parents=True, exist_ok=True)
            out[name] = target
            continue
        source = volume[kind] or {}
        obj_kind = "ConfigMap" if kind == "configMap" else "Secret"
        obj_name = str(source.get("name") if kind == "configMap" else source.get("secretName") or "")
        obj = lookup(obj_kind, namespace, obj_name)
        if obj is None and not source.get("optional"):
            word = "configmap" if kind == "configMap" else "secret"
            raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : {word} "{obj_name}" not found')
        files = object_files(obj_kind, obj or {})
        default_mode = source.get("defaultMode", 0o644)
        wanted: list[tuple[str, str, int]] = []
        if source.get("items"):
            for item in source["items"]:
                key, path = str(item.get("key") or ""), str(item.get("path") or "")
                if key not in files:
                    if source.get("optional"):
                        continue
                    raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : configmap references non-existent '
                                      f'config key: {key}' if kind == "configMap" else
                                      f'MountVolume.SetUp failed for volume "{name}" : references non-existent secret '
                                      f'key: {key}')
                wanted.append((key, path, int(item.get("mode", default_mode))))
        else:
            wanted = [(k, k, int(default_mode)) for k in files]
        shutil.rmtree(target, ignore_errors=True)  # the kubelet's atomic writer replaces the whole set
        target.mkdir(parents=True)
        for key, path, mode in wanted:
            if not _safe_relative(path):
                raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : invalid path {path!r}')
            file = target / path
            file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            try:
                os.write(fd, files[key])
            finally:
                os.close(fd)
            os.chmod(file, mode)
        out[name] = target
    return out


def container_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path],
                     read_only_volumes: set[str]) -> list[Mount]:
    out = []
    for vm in container.get("volumeMounts") or []:
        if not isinstance(vm, Mapping):
            continue
        host = volumes.get(str(vm.get("name") or ""))
        if host is None:
            continue
        sub = str(vm.get("subPath") or "")
        if sub:
            if not _safe_relative(sub):
                raise VolumeError(f"subPath {sub!r}: must be a relative path without '..'")
            host = subpath(host, sub, str(vm.get("name") or ""), str(container.get("name") or ""))
        out.append(Mount(host, str(vm.get("mountPath") or ""), bool(vm.get("readOnly")) or vm.get("name") in read_only_volumes))
    return out


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _no_links(base: Path, path: Path) -> bool:
    """Every component of `path` below `base` opens without following a link (what the runtime will mount now)."""
    fd = os.open(base, os.O_PATH | os.O_DIRECTORY)
    try:
        for part in path.relative_to(base).parts:
            child = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                return False
        return True
    finally:
        os.close(fd)


def subpath(volume: Path, sub: str, mount: str, container: str) -> Path:
    """The host path of a volumeMount's subPath, as the kubelet prepares it: symlinks in it are resolved and the
    result must stay inside the volume (a tenant's link to a host path is refused, not followed by the runtime);
    a missing subPath is created inside the volume. The errors are the kubelet's, which keep host paths from the
    pod's status."""
    base = Path(os.path.realpath(volume))
    resolved = Path(os.path.realpath(volume / sub))
    if not os.path.exists(volume / sub):
        if not _within(resolved, base):
            raise VolumeError(f'failed to create subPath directory for volumeMount "{mount}" of container "{container}"')
        try:
            resolved.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VolumeError(f'failed to create subPath directory for volumeMount "{mount}" of container '
                              f'"{container}"') from exc
    try:
        safe = _within(resolved, base) and _no_links(base, resolved)
    except OSError:
        safe = False
    if not safe:
        raise VolumeError(f'failed to prepare subPath for volumeMount "{mount}" of container "{container}"')
    return resolved


def read_only_volumes(pod: Mapping[str, Any]) -> set[str]:
    """configMap and secret volumes are always mounted read-only."""
    return {str(v.get("name")) for v in (pod.get("spec") or {}).get("volumes") or []
            if isinstance(v, Mapping) and ("configMap" in v or "secret" in v)}


def tear_down(kubelet_dir: Path, uid: str) -> None:
    try:
        shutil.rmtree(pod_dir(kubelet_dir, uid), ignore_errors=True)
    except VolumeError:
        pass


TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def wants_token(pod: Mapping[str, Any]) -> bool:
    """A pod that names its ServiceAccount gets its token volume (the ServiceAccount admission plugin's
    kube-api-access volume), unless it opts out. Pods of the implicit `default` account get none here."""
    spec = pod.get("spec") or {}
    return bool(spec.get("serviceAccountName")) and spec.get("automountServiceAccountToken") is not False


def write_token(kubelet_dir: Path, pod: Mapping[str, Any], token: str, ca: str | None = None) -> Path:
    """The projected token volume's files (token, namespace, and ca.crt when the API server serves TLS: the
    cluster CA, which in-cluster clients verify it with); returns its directory."""
    meta = pod.get("metadata") or {}
    target = pod_dir(kubelet_dir, str(meta.get("uid") or "")) / "volumes" / "kubernetes.io~projected" / "kube-api-access"
    target.mkdir(parents=True, exist_ok=True)
    files = [("token", token), ("namespace", str(meta.get("namespace") or "default"))]
    if ca is not None:
        files.append(("ca.crt", ca))
    for name, text in files:
        tmp = target / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, target / name)
    return target
