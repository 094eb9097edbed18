"""A component's own image, read from its own Pod (the downward API gives the Pod's name): the pods it starts
(MPS control daemons, IMEX daemons) run the image it runs, so one image reference in the manifests (what a
kustomize `images:` entry changes) serves them all, and the image pull secrets its Pod was pulled with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OwnImage:
    image: str
    pull_secrets: tuple[str, ...]  # the Pod's spec.imagePullSecrets names


def own_image(api: Any, namespace: str, pod_name: str, container: str) -> OwnImage:
    """The image of `container` in the Pod `namespace/pod_name` and the Pod's image pull secrets; ValueError
    saying what is missing (an unset $POD_NAME, an unreadable Pod, no such container)."""
    if not pod_name:
        raise ValueError("$POD_NAME is not set (give it from the downward API: fieldRef metadata.name)")
    try:
        pod = api.get("Pod", pod_name, namespace=namespace)
    except Exception as exc:  # noqa: BLE001 - reported with what was asked for
        raise ValueError(f"cannot read Pod {namespace}/{pod_name}: {exc}") from exc
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    image = next((c.get("image") for c in containers if c.get("name") == container), None)
    if not image:
        names = ", ".join(str(c.get("name")) for c in containers)
        raise ValueError(f"Pod {namespace}/{pod_name}: spec.containers has no container {container!r} with an image "
                         f"(containers: {names or 'none'}; set --container-name)")
    secrets = tuple(str(s["name"]) for s in spec.get("imagePullSecrets") or [] if isinstance(s, dict) and s.get("name"))
    return OwnImage(str(image), secrets)


def secret_names(csv: str) -> tuple[str, ...]:
    """Comma-separated secret names (`a,b`), blanks dropped."""
    return tuple(s.strip() for s in csv.split(",") if s.strip())
