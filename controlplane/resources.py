"""The resource types the embedded control plane serves, and the discovery documents describing them.

One table drives routing, discovery, field selectors and the shapes of error messages, so that a new
resource is one entry here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from controlplane.runtimeconfig import RuntimeConfig
from gpudra.conversion import served_versions
from gpudra.features import Features

ALL_VERBS: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")
# The patch release and build date each minor's /version reports (the embedded server speaks that release's API).
_RELEASES: dict[str, tuple[str, str, str]] = {
    "1.34": ("v1.34.3", "2025-12-09T00:00:00Z", "go1.24.11"),
    "1.35": ("v1.35.0", "2025-12-17T00:00:00Z", "go1.25.5"),
    "1.36": ("v1.36.2", "2026-06-10T00:00:00Z", "go1.26.3"),
    "1.37": ("v1.37.0", "2026-08-19T00:00:00Z", "go1.26.0"),
}


def server_version(kubernetes_version: str = "1.37") -> dict[str, str]:
    """The /version document of the release the server is started for."""
    git_version, build_date, go_version = _RELEASES[kubernetes_version]
    major, minor = kubernetes_version.split(".")
    return {"major": major, "minor": minor, "gitVersion": git_version, "gitCommit": "embedded",
            "gitTreeState": "clean", "buildDate": build_date, "goVersion": go_version, "compiler": "gc",
            "platform": "linux/amd64"}


SERVER_VERSION: dict[str, str] = server_version()


def _path(obj: dict[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class CustomKind(Protocol):
    """What a custom resource's type adds (controlplane.crds.definition): its schema, its versions, its columns.
    The store and the handler call these where built-in kinds use the client's models and gpudra.conversion."""

    def decode(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
        """`obj` (at its apiVersion) defaulted and pruned, in the storage version; the dropped fields; type errors."""
        ...

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]: ...

    def shown(self, obj: dict[str, Any], version: str) -> dict[str, Any]: ...


@dataclass(frozen=True, eq=False)
class ResourceType:
    """One REST resource: where it lives, what it is called, and which fields can be selected on."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    has_status: bool = False
    # Extra field-selector labels beyond metadata.name / metadata.namespace, as dotted paths into the object.
    field_labels: tuple[str, ...] = ()
    # Field-selector prefixes whose any sub-path may be selected on (events' involvedObject.*).
    field_prefixes: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    extra_subresources: tuple[str, ...] = ()
    # Every version the type is served at, preferred first; `version` (the storage version) when empty.
    # Objects are stored at `version` and converted (gpudra.conversion) for the others.
    served: tuple[str, ...] = ()
    # Review kinds (SelfSubjectAccessReview, ...) are answered, never stored: POST only.
    virtual: bool = False
    # Set for custom resources (served from a CustomResourceDefinition); None for built-in kinds.
    custom: CustomKind | None = None

    def __post_init__(self) -> None:
        # Types key the store's tables and are hashed on every request; the generated hash would walk all
        # thirteen fields each time.
        object.__setattr__(self, "_hash", hash((self.group, self.version, self.plural, self.kind)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        # Identity is the route: a CRD update replaces its type's columns or schema, not the type.
        return isinstance(other, ResourceType) and (self.group, self.version, self.plural, self.kind) == (
            other.group, other.version, other.plural, other.kind)

    @property
    def versions(self) -> tuple[str, ...]:
        return self.served or (self.version,)

    def api_version_at(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`resourceclaims.resource.k8s.io` (or `pods` for the core group), as Kubernetes' messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`ResourceClaim.resource.k8s.io` (or `Pod`), as Kubernetes' "is invalid" messages name it."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def field_value(self, obj: dict[str, Any], label: str) -> str | None:
        """The value a field selector compares against, or None when `label` is not selectable here."""
        if label == "metadata.name":
            return _text(_path(obj, "metadata.name"))
        if label == "metadata.namespace":
            return _text(_path(obj, "metadata.namespace")) if self.namespaced else ""
        if label in self.field_labels or any(label.startswith(p + ".") for p in self.field_prefixes):
            return _text(_path(obj, label))
        return None

    def selectable_fields(self) -> list[str]:
        base = ["metadata.name", "metadata.namespace", *self.field_labels]
        return base + [p + ".*" for p in self.field_prefixes]


@dataclass(frozen=True)
class Registry:
    """All served resource types, indexed the ways the server needs to find them."""

    types: tuple[ResourceType, ...]
    _by_route: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict, compare=False)
    _by_kind: dict[str, ResourceType] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for rt in self.types:
            for version in rt.versions:
                self._by_route[(rt.group, version, rt.plural)] = rt
            self._by_kind[rt.kind] = rt

    def serve(self, rt: ResourceType) -> ResourceType | None:
        """Add or replace a custom resource type (keyed by group and plural); returns the type it replaced."""
        old = next((t for t in self.types if t.group == rt.group and t.plural == rt.plural), None)
        if old is not None:
            self.withdraw(old)
        object.__setattr__(self, "types", (*self.types, rt))
        for version in rt.versions:
            self._by_route[(rt.group, version, rt.plural)] = rt
        self._by_kind.setdefault(rt.kind, rt)
        return old

    def withdraw(self, rt: ResourceType) -> None:
        """Stop serving a custom resource type."""
        object.__setattr__(self, "types", tuple(t for t in self.types if not (t.group == rt.group
                                                                              and t.plural == rt.plural)))
        for key in [k for k, t in self._by_route.items() if t.group == rt.group and t.plural == rt.plural]:
            del self._by_route[key]
        if self._by_kind.get(rt.kind) is not None and self._by_kind[rt.kind].group == rt.group:
            del self._by_kind[rt.kind]
            replacement = next((t for t in self.types if t.kind == rt.kind), None)
            if replacement is not None:
                self._by_kind[rt.kind] = replacement

    def by_route(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_route.get((group, version, plural))

    def by_kind(self, kind: str) -> ResourceType | None:
        return self._by_kind.get(kind)

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per group, the preferred (storage) version first, then newest to oldest."""
        out: dict[str, list[str]] = {}
        for rt in self.types:
            versions = out.setdefault(rt.group, [])
            for version in rt.versions:
                if version not in versions:
                    versions.append(version)
        return out

    def in_group_version(self, group: str, version: str) -> Iterable[ResourceType]:
        return (rt for rt in self.types if rt.group == group and version in rt.versions)


DEFAULT_REGISTRY = Registry(
    types=(
        ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), has_status=True,
                     field_labels=("status.phase",), extra_subresources=("finalize",)),
        ResourceType("", "v1", "nodes", "Node", False, ("no",), has_status=True,
                     field_labels=("spec.unschedulable",)),
        ResourceType("", "v1", "pods", "Pod", True, ("po",), has_status=True,
                     field_labels=("spec.nodeName", "spec.schedulerName", "spec.serviceAccountName",
                                   "status.phase", "status.podIP", "status.nominatedNodeName"),
                     categories=("all",), extra_subresources=("attach", "binding", "eviction", "exec", "log", "portforward")),
        ResourceType("", "v1", "events", "Event", True, ("ev",),
                     field_labels=("reason", "type", "source", "reportingComponent"),
                     field_prefixes=("involvedObject",)),
        ResourceType("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), has_status=True),
        ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), extra_subresources=("token",)),
        # What pods' env.valueFrom, envFrom and volumes read (the kubelet simulator).
        ResourceType("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
        ResourceType("", "v1", "services", "Service", True, ("svc",), has_status=True, categories=("all",)),
        ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, ()),
        ResourceType("", "v1", "secrets", "Secret", True, field_labels=("type",)),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
        ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        ResourceType("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
                     virtual=True),
        ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False,
                     virtual=True),
        ResourceType("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False,
                     virtual=True),
        ResourceType("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False, virtual=True),
        ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                     "ValidatingAdmissionPolicy", False, has_status=True),
        ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                     "ValidatingAdmissionPolicyBinding", False),
        ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                     "ValidatingWebhookConfiguration", False),
        ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                     "MutatingWebhookConfiguration", False),
        ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",)),
        ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), has_status=True),
        # The Workload API as Kubernetes 1.37 serves it (KEP-4671; GenericWorkload).
        ResourceType("scheduling.k8s.io", "v1beta1", "workloads", "Workload", True),
        ResourceType("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", True, has_status=True),
        ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False,
                     served=served_versions("DeviceClass")),
        ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False,
                     field_labels=("spec.driver", "spec.nodeName"), served=served_versions("ResourceSlice")),
        ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, has_status=True,
                     served=served_versions("ResourceClaim")),
        ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
                     served=served_versions("ResourceClaimTemplate")),
        ResourceType("resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", False, has_status=True,
                     served=served_versions("DeviceTaintRule")),
        # Workload controllers, stored as they are; `gpu-dra cluster` runs the controllers that make their pods.
        ResourceType("apps", "v1", "deployments", "Deployment", True, ("deploy",), has_status=True, categories=("all",),
                     extra_subresources=("scale",)),
        ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), has_status=True, categories=("all",),
                     extra_subresources=("scale",)),
        ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), has_status=True, categories=("all",),
                     extra_subresources=("scale",)),
        ResourceType("batch", "v1", "jobs", "Job", True, has_status=True, categories=("all",)),
        ResourceType("batch", "v1", "cronjobs", "CronJob", True, ("cj",), has_status=True, categories=("all",)),
        ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), has_status=True, categories=("all",)),
        ResourceType("apps", "v1", "controllerrevisions", "ControllerRevision", True, ()),
        ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                     ("crd", "crds"), has_status=True, categories=("api-extensions",)),
    )
)

# Types a release serves only from some version on (beta APIs gpu-dra uses, enabled where the kind config enables
# them): the Workload API's scheduling.k8s.io/v1beta1 arrived in 1.37 (1.35/1.36 had alpha versions, off).
_INTRODUCED: dict[tuple[str, str], str] = {
    ("scheduling.k8s.io", "workloads"): "1.37",
    ("scheduling.k8s.io", "podgroups"): "1.37",
}
# Types whose REST storage kube-apiserver installs only with a feature gate on (the Features attribute).
_GATED: dict[tuple[str, str], str] = {
    ("scheduling.k8s.io", "workloads"): "generic_workload",
    ("scheduling.k8s.io", "podgroups"): "generic_workload",
    ("resource.k8s.io", "devicetaintrules"): "device_taint_rules",
}


def known_group_versions(registry: Registry = DEFAULT_REGISTRY) -> set[tuple[str, str]]:
    return {(rt.group, v) for rt in registry.types for v in rt.versions}


def registry_for(kubernetes_version: str, runtime_config: RuntimeConfig | None = None,
                 features: Features | None = None) -> Registry:
    """DEFAULT_REGISTRY as a kube-apiserver of `kubernetes_version` ("1.34".."1.37") serves it: what that release
    has, the versions `runtime_config` enables (GA only by default), the types whose gates `features` (that
    release's defaults when None) has on. A type keeps its storage version only when that is served."""
    minor = int(kubernetes_version.split(".")[1])
    config = runtime_config or RuntimeConfig()
    gates = features or Features.for_version(kubernetes_version)
    keep: list[ResourceType] = []
    for rt in DEFAULT_REGISTRY.types:
        if int(_INTRODUCED.get((rt.group, rt.plural), "1.0").split(".")[1]) > minor:
            continue
        gate = _GATED.get((rt.group, rt.plural))
        if gate is not None and not getattr(gates, gate):
            continue
        versions = tuple(v for v in rt.versions if config.serves(rt.group, v, rt.plural))
        if rt.version not in versions:
            continue
        keep.append(rt if versions == rt.versions else replace(rt, served=versions))
    # A registry of its own even when it serves everything: a server adds the types its CRDs define to it.
    return Registry(types=tuple(keep))


_SUBRESOURCE_KINDS = {"binding": "Binding", "token": "TokenRequest", "attach": "PodAttachOptions",
                      "exec": "PodExecOptions", "portforward": "PodPortForwardOptions"}
# The verbs of subresources that are not create-only: streams are GET (a WebSocket upgrade) and POST (SPDY).
_SUBRESOURCE_VERBS = {"log": ["get"], "finalize": ["update"], "attach": ["create", "get"], "exec": ["create", "get"],
                      "portforward": ["create", "get"]}


def _resource_entries(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": ["create"] if rt.virtual else list(ALL_VERBS),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    entries = [main]
    if rt.has_status:
        entries.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                        "kind": rt.kind, "verbs": ["get", "patch", "update"]})
    for sub in rt.extra_subresources:
        if sub == "scale":  # served in autoscaling/v1, as kube-apiserver lists it
            entries.append({"name": f"{rt.plural}/scale", "singularName": "", "namespaced": rt.namespaced,
                            "group": "autoscaling", "version": "v1", "kind": "Scale",
                            "verbs": ["get", "patch", "update"]})
            continue
        if sub == "eviction":  # policy/v1 Eviction: kubectl drain looks for it here
            entries.append({"name": f"{rt.plural}/eviction", "singularName": "", "namespaced": rt.namespaced,
                            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            continue
        entries.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                        "kind": _SUBRESOURCE_KINDS.get(sub, rt.kind),
                        "verbs": _SUBRESOURCE_VERBS.get(sub, ["create"])})
    return entries


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = list(registry.in_group_version(group, version))
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for rt in types:
        resources.extend(_resource_entries(rt))
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


def api_versions() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.group_versions().get(group)
    if not group or not versions:
        return None
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = []
    for group in registry.group_versions():
        doc = api_group(registry, group)
        if doc is not None:
            doc = dict(doc)
            doc.pop("kind")
            doc.pop("apiVersion")
            groups.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

