"""Small accessors over Kubernetes objects as plain dicts (what KubeApi returns)."""


from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]

# The finalizer kube-scheduler puts on a claim before it writes the allocation.
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
# Annotation on a claim generated from a template: the pod's claim name it was made for.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_GPU_RESOURCE = "nvidia.com/gpu"


def _mapping(value: Any) -> Mapping[str, Any]:
    # `type(...) is dict` first: objects are plain dicts almost always, and an ABC isinstance check costs ~10x more
    # on paths that run per object per pass.
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata"))


def name(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace") or "")


def uid(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKeyFunc)."""
    ns = namespace(obj)
    return f"{ns}/{name(obj)}" if ns else name(obj)


def claim_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` of a namespaced object, an omitted namespace read as `default`: offline manifests
    leave it out, as kubectl applies them into the default namespace."""
    return f"{namespace(obj) or 'default'}/{meta(obj).get('name', '')}"


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _mapping(meta(obj).get("labels"))


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _mapping(meta(obj).get("annotations"))


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    value = meta(obj).get("finalizers")
    return [str(f) for f in value] if isinstance(value, list) else []


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def section(obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    return _mapping(obj.get(field))


def list_field(obj: Mapping[str, Any], field: str) -> list[Any]:
    value = obj.get(field)
    return value if isinstance(value, list) else []


def allocation(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    value = section(claim, "status").get("allocation")
    return value if type(value) is dict or isinstance(value, Mapping) else None


def reserved_for(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in list_field(section(claim, "status"), "reservedFor") if isinstance(r, Mapping)]


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every result; adminAccess results do not hold their device."""
    alloc = allocation(claim)
    if alloc is None:
        return []
    out = []
    for result in list_field(section(alloc, "devices"), "results"):
        if isinstance(result, Mapping) and not result.get("adminAccess"):
            out.append((str(result.get("driver", "")), str(result.get("pool", "")), str(result.get("device", ""))))
    return out


def pod_done(pod: Mapping[str, Any]) -> bool:
    """A pod that will never run (again): terminal phase, or deleted before it was scheduled."""
    phase = section(pod, "status").get("phase")
    if phase in ("Succeeded", "Failed"):
        return True
    return deleting(pod) and not section(pod, "spec").get("nodeName")


def pod_scheduled(pod: Mapping[str, Any]) -> bool:
    return bool(section(pod, "spec").get("nodeName"))


def controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true`, if any."""
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def controller_owner_uid(obj: Mapping[str, Any]) -> str | None:
    ref = controller_owner(obj)
    return str(ref.get("uid") or "") if ref is not None else None


def rv_newer(candidate: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether `candidate` is a later version of the object than `current`.

    resourceVersions are opaque in general; the API servers we talk to (etcd-backed and the embedded
    one) use increasing integers, so compare them numerically and fall back to "newer" otherwise.
    """
    a = str(meta(candidate).get("resourceVersion") or "")
    b = str(meta(current).get("resourceVersion") or "")
    if a.isdigit() and b.isdigit():
        return int(a) >= int(b)
    return True
