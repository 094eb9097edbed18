"""A container's environment as the kubelet builds it (kubelet_pods.go makeEnvironmentVariables): `envFrom`
(ConfigMaps and Secrets, with prefix), then `env` in order, each value with $(VAR) expanded against what is set
so far; `valueFrom` reads the pod's own fields (the downward API), its resources, ConfigMap and Secret keys.
A missing object or key fails the container's start (CreateContainerConfigError), unless `optional`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpudra.quantity import Quantity, QuantityError
from sim.kubelet.volumes import object_files

# (kind, namespace, name) -> the object, or None when it does not exist.
Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class EnvError(Exception):
    """CreateContainerConfigError: the message is the kubelet's."""


@dataclass(frozen=True)
class PodContext:
    pod: Mapping[str, Any]
    node_name: str
    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, str]


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion (third_party/forked/golang/expansion): `$(NAME)` becomes NAME's value when
    `env` has it and stays as written when not (any text up to the first `)` is the name), `$$` is one `$`, and
    any other `$` (a `$(` never closed, a `$` before another character or at the end) is kept."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        after = text[i + 1]
        close = text.find(")", i + 2) if after == "(" else -1
        if close >= 0:
            name = text[i + 2:close]
            out.append(env.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append("$" if after == "$" else "$" + after)
            i += 2
    return "".join(out)


def static_env(container: Mapping[str, Any]) -> dict[str, str]:
    """What the kubelet expands an exec probe's command with (kubecontainer.ExpandContainerCommandOnlyStatic):
    each `env` entry's literal `value` as written, an entry with `valueFrom` as the empty string, no `envFrom`."""
    return {str(e["name"]): str(e.get("value") or "") for e in container.get("env") or []
            if isinstance(e, Mapping) and e.get("name")}


def field_value(path: str, ctx: PodContext) -> str:
    meta = ctx.pod.get("metadata") or {}
    spec = ctx.pod.get("spec") or {}
    if m := _FIELD_KEY.match(path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"), "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName") or ctx.node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": ctx.pod_ip, "status.podIPs": ctx.pod_ip, "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path not in simple:
        raise EnvError(f"unsupported fieldPath: {path}")
    return str(simple[path] or "")


def resource_value(ref: Mapping[str, Any], container: Mapping[str, Any], ctx: PodContext) -> str:
    """resourceFieldRef: the container's limit (the node's allocatable when unset) or request, divided by the
    divisor and rounded up (cpu in cores by default, so 250m is "1")."""
    resource = str(ref.get("resource") or "")
    part, _, name = resource.partition(".")
    if part not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage") and \
            not name.startswith("hugepages-"):
        raise EnvError(f"unsupported container resource: {resource}")
    values = (container.get("resources") or {}).get(part) or {}
    raw = values.get(name)
    if raw is None and part == "requests":
        raw = ((container.get("resources") or {}).get("limits") or {}).get(name)
    if raw is None:
        raw = ctx.node_allocatable.get(name, "0")
    try:
        value = Quantity.parse(str(raw)).as_fraction()
        divisor = Quantity.parse(str(ref.get("divisor") or "1")).as_fraction()
    except QuantityError as exc:
        raise EnvError(f"{resource}: {exc}") from exc
    if divisor <= 0:
        raise EnvError(f"{resource}: divisor must be positive")
    return str(math.ceil(value / divisor))


def _data(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    return {k: v.decode(errors="replace") for k, v in object_files(kind, obj).items()}


def _key_ref(kind: str, ref: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    name, key = str(ref.get("name") or ""), str(ref.get("key") or "")
    obj = lookup(kind, namespace, name)
    word = "configmap" if kind == "ConfigMap" else "secret"
    if obj is None:
        if ref.get("optional"):
            return None
        raise EnvError(f'{word} "{name}" not found')
    data = _data(kind, obj)
    if key not in data:
        if ref.get("optional"):
            return None
        raise EnvError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return data[key]


def container_env(container: Mapping[str, Any], ctx: PodContext, lookup: Lookup,
                  base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (the device plugin grant's env), then envFrom, then env."""
    namespace = str((ctx.pod.get("metadata") or {}).get("namespace") or "default")
    env: dict[str, str] = dict(base or {})
    for source in container.get("envFrom") or []:
        if not isinstance(source, Mapping):
            continue
        kind, ref = (("ConfigMap", source["configMapRef"]) if source.get("configMapRef") else
                     ("Secret", source.get("secretRef") or {}))
        name = str(ref.get("name") or "")
        obj = lookup(kind, namespace, name)
        if obj is None:
            if ref.get("optional"):
                continue
            raise EnvError(f'{"configmap" if kind == "ConfigMap" else "secret"} "{name}" not found')
        prefix = str(source.get("prefix") or "")
        for key, value in _data(kind, obj).items():
            if _ENV_NAME.match(prefix + key):  # keys that are no valid name are skipped (an event upstream)
                env[prefix + key] = value
    for entry in container.get("env") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        source = entry.get("valueFrom")
        if not source:
            env[str(entry["name"])] = expand(str(entry.get("value") or ""), env)
            continue
        value: str | None
        if source.get("fieldRef"):
            value = field_value(str(source["fieldRef"].get("fieldPath") or ""), ctx)
        elif source.get("resourceFieldRef"):
            value = resource_value(source["resourceFieldRef"], container, ctx)
        elif source.get("configMapKeyRef"):
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, lookup)
        elif source.get("secretKeyRef"):
            value = _key_ref("Secret", source["secretKeyRef"], namespace, lookup)
        else:
            raise EnvError(f"env {entry['name']}: valueFrom has no source this kubelet knows")
        if value is not None:
            env[str(entry["name"])] = value
    return env
