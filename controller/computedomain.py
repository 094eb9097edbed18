"""The ComputeDomain controller (NVIDIA's compute-domain-controller): for each ComputeDomain, the channel
ResourceClaimTemplate its workload pods claim (allocationMode Single or All), the per-domain IMEX daemon
DaemonSet (on the nodes the kubelet plugin labels with the domain) with its daemon ResourceClaimTemplate, and the
domain's status from its ComputeDomainCliques: every daemon's node, clique and readiness, and Ready when numNodes
daemons are (or, with numNodes 0, when every daemon that joined is). A deleted domain's objects are removed before
its finalizer is.

`desired_objects` and `domain_status` are pure; `ComputeDomainController` is the loop around them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.ganggroups import gang_label, gang_size_label, gang_topology_label
from gpudra import DEFAULT_DRIVER_NAME
from gpudra import computedomain as cd
from gpudra.kubeapi import AlreadyExists, ApiError, Conflict, KubeApi, NotFound

log = logging.getLogger("gpu-dra.compute-domain-controller")

# The IMEX daemon pods run our own image's `gpu-dra compute-domain-daemon` (NVIDIA's run its compute-domain-daemon).
# This default serves a controller run outside a Pod; the manifests give it its own Pod's image
# (--compute-domain-daemon-image-from-pod), which kustomize's `images:` sets.
DAEMON_IMAGE = "ghcr.io/gpu-dra/gpu-dra:v0.1.0"
DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
MAX_NODES_PER_IMEX_DOMAIN = 18  # NVIDIA's chart default: one NVL72 rack's compute trays
_CHECK = ["gpu-dra", "compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "check"]
_DAEMON_TOLERATIONS = [{"operator": "Exists", "effect": e} for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def daemon_name(domain: Mapping[str, Any]) -> str:
    meta = _meta(domain)
    return f"{str(meta.get('name'))[:40]}-{str(meta.get('uid'))[:8]}"


def _labels(uid: str) -> dict[str, str]:
    return {cd.DOMAIN_LABEL: uid}


def gang_labels(domain: Mapping[str, Any], driver: str) -> dict[str, str]:
    """The labels that make the claims of a domain with numNodes N one gang placed within one NVLink clique
    (controller.gang): all N channels at once, on one rack, or none. numNodes 0 (unknown size): no gang."""
    nodes = int((domain.get("spec") or {}).get("numNodes") or 0)
    if nodes <= 0:
        return {}
    return {gang_label(driver): f"computedomain-{_meta(domain).get('name')}"[:63], gang_size_label(driver): str(nodes),
            gang_topology_label(driver): "clique"}


def channel_template(domain: Mapping[str, Any], driver: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    meta = _meta(domain)
    channel = (domain.get("spec") or {}).get("channel") or {}
    uid = str(meta.get("uid"))
    claim_labels = {**_labels(uid), **gang_labels(domain, driver)}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": channel["resourceClaimTemplate"]["name"], "namespace": meta.get("namespace"),
                     "labels": _labels(uid),
                     "ownerReferences": [{"apiVersion": cd.API_VERSION, "kind": "ComputeDomain", "name": meta["name"],
                                          "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"metadata": {"labels": claim_labels}, "spec": {"devices": {
            "requests": [{"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}],
            "config": [{"requests": ["channel"], "opaque": {"driver": cd.DRIVER, "parameters": {
                "apiVersion": cd.API_VERSION, "kind": cd.CHANNEL_CONFIG_KIND, "domainID": uid,
                "allocationMode": channel.get("allocationMode") or "Single"}}}]}}},
    }


def daemon_template(domain: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    uid = str(_meta(domain).get("uid"))
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": daemon_name(domain) + "-daemon", "namespace": namespace, "labels": _labels(uid)},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "daemon", "exactly": {"deviceClassName": cd.DAEMON_CLASS}}],
            "config": [{"requests": ["daemon"], "opaque": {"driver": cd.DRIVER, "parameters": {
                "apiVersion": cd.API_VERSION, "kind": cd.DAEMON_CONFIG_KIND, "domainID": uid}}}]}}},
    }


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def daemon_set(domain: Mapping[str, Any], namespace: str, image: str = DAEMON_IMAGE,
               pull_secrets: Sequence[str] = ()) -> dict[str, Any]:
    """One IMEX daemon pod per node the domain's workload landed on, as NVIDIA's template has it: the pod holds
    the node's daemon claim (whose CDI spec gives it /imexd, the domain's env, the node's GPU, control and
    fabric-imex-mgmt device nodes and the driver's files with nvidia-imex: driver.computedomain.imex) and runs
    `gpu-dra compute-domain-daemon run` (driver.computedomain.daemon), which runs nvidia-imex; the probes run its
    `check` (nvidia-imex-ctl -q), the startup probe every second for up to 20 minutes. It tolerates every taint
    (the node agent's `nvidia.com/gpu` among them) and is pulled with `pull_secrets`."""
    uid = str(_meta(domain).get("uid"))
    name = daemon_name(domain)
    env = [{"name": "LOG_VERBOSITY", "value": "0"},
           {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": str(MAX_NODES_PER_IMEX_DOMAIN)},
           {"name": "NODE_NAME", "valueFrom": _field("spec.nodeName")},
           {"name": "POD_IP", "valueFrom": _field("status.podIP")},
           {"name": "POD_UID", "valueFrom": _field("metadata.uid")},
           {"name": "POD_NAME", "valueFrom": _field("metadata.name")},
           {"name": "POD_NAMESPACE", "valueFrom": _field("metadata.namespace")},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    probe = {"exec": {"command": list(_CHECK)}, "timeoutSeconds": 10, "successThreshold": 1}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(uid)},
        "spec": {
            "selector": {"matchLabels": _labels(uid)},
            "template": {
                "metadata": {"labels": _labels(uid)},
                "spec": {
                    "serviceAccountName": DAEMON_ACCOUNT,
                    **({"imagePullSecrets": [{"name": n} for n in pull_secrets]} if pull_secrets else {}),
                    "nodeSelector": _labels(uid),
                    "tolerations": list(_DAEMON_TOLERATIONS),
                    "containers": [{
                        "name": "compute-domain-daemon", "image": image,
                        "command": ["gpu-dra", "compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run"],
                        "env": env,
                        "resources": {"claims": [{"name": "compute-domain-daemon"}]},
                        "startupProbe": {**probe, "initialDelaySeconds": 0, "periodSeconds": 1,
                                         "failureThreshold": 1200},
                        "livenessProbe": {**probe, "periodSeconds": 60, "failureThreshold": 20},
                        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 1},
                    }],
                    "resourceClaims": [{"name": "compute-domain-daemon",
                                        "resourceClaimTemplateName": name + "-daemon"}],
                },
            },
        },
    }


def domain_status(domain: Mapping[str, Any], cliques: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    nodes = []
    for clique in cliques:
        for d in clique.get("daemons") or []:
            nodes.append({"name": d.get("nodeName"), "ipAddress": d.get("ipAddress"), "cliqueID": d.get("cliqueID"),
                          "index": d.get("index"), "status": d.get("status") or "NotReady"})
    nodes.sort(key=lambda n: str(n["name"]))
    want = int((domain.get("spec") or {}).get("numNodes") or 0)
    ready = sum(1 for n in nodes if n["status"] == "Ready")
    ok = ready >= want if want > 0 else (bool(nodes) and ready == len(nodes))
    return {"status": "Ready" if ok else "NotReady", "nodes": nodes}


class ComputeDomainController:
    def __init__(self, api: KubeApi, namespace: str = "gpu-dra-system", *, image: str = DAEMON_IMAGE,
                 pull_secrets: Sequence[str] = (), driver: str = DEFAULT_DRIVER_NAME,
                 may_write: Callable[[], bool] = lambda: True, interval: float = 1.0) -> None:
        self.api = api
        self.driver = driver
        self.namespace = namespace
        self.image = image
        self.pull_secrets = tuple(pull_secrets)
        self.may_write = may_write
        self.interval = interval
        self._served = True

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        current = self.api.try_get(kind, meta["name"], namespace=meta.get("namespace"))
        if current is None:
            try:
                self.api.create(kind, obj, namespace=meta.get("namespace"))
                log.info("event=created kind=%s object=%s/%s", kind, meta.get("namespace"), meta["name"])
            except AlreadyExists:
                pass
            return
        theirs = (_meta(current).get("labels") or {}).get(cd.DOMAIN_LABEL)
        if theirs != meta["labels"][cd.DOMAIN_LABEL]:
            raise ApiError(409, "Conflict", f"{kind} {meta.get('namespace')}/{meta['name']} exists and does not belong "
                                            f"to ComputeDomain {meta['labels'][cd.DOMAIN_LABEL]}")
        if kind == "DaemonSet" and current.get("spec") != obj["spec"]:
            self.api.replace(kind, {**current, "spec": obj["spec"]})

    def _ensure_namespace(self) -> None:
        if self.api.try_get("Namespace", self.namespace) is None:
            try:
                self.api.create("Namespace", {"metadata": {"name": self.namespace}})
            except AlreadyExists:
                pass

    def _cleanup(self, domain: Mapping[str, Any]) -> None:
        meta = _meta(domain)
        uid = str(meta.get("uid"))
        selector = f"{cd.DOMAIN_LABEL}={uid}"
        for kind, ns in (("DaemonSet", self.namespace), ("ResourceClaimTemplate", self.namespace),
                         ("ComputeDomainClique", self.namespace), ("ResourceClaimTemplate", meta.get("namespace"))):
            for obj in self.api.list(kind, namespace=ns, label_selector=selector)[0]:
                self.api.delete(kind, obj["metadata"]["name"], namespace=ns)
        finalizers = [f for f in meta.get("finalizers") or [] if f != cd.FINALIZER]
        self.api.patch("ComputeDomain", str(meta["name"]), [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers}],
            namespace=meta.get("namespace"), patch_type="json")
        log.info("event=domain-removed domain=%s/%s", meta.get("namespace"), meta.get("name"))

    def reconcile_domain(self, domain: Mapping[str, Any], cliques: Sequence[Mapping[str, Any]]) -> None:
        meta = _meta(domain)
        ns, name = meta.get("namespace"), str(meta["name"])
        if meta.get("deletionTimestamp"):
            if cd.FINALIZER in (meta.get("finalizers") or []):
                self._cleanup(domain)
            return
        if cd.validate_compute_domain(domain):
            return  # admission refuses these; one written before the CRD's validation cannot be acted on
        if cd.FINALIZER not in (meta.get("finalizers") or []):
            self.api.patch("ComputeDomain", name, {"metadata": {"finalizers": [*(meta.get("finalizers") or []),
                                                                                cd.FINALIZER]}}, namespace=ns)
        self._apply("ResourceClaimTemplate", channel_template(domain, self.driver))
        self._apply("ResourceClaimTemplate", daemon_template(domain, self.namespace))
        self._apply("DaemonSet", daemon_set(domain, self.namespace, self.image, self.pull_secrets))
        status = domain_status(domain, cliques)
        if (domain.get("status") or {}) != status:
            self.api.patch("ComputeDomain", name, {"status": status}, namespace=ns, subresource="status")
            if (domain.get("status") or {}).get("status") != status["status"]:
                log.info("event=domain-status domain=%s/%s status=%s nodes=%d", ns, name, status["status"],
                         len(status["nodes"]))

    def reconcile(self) -> None:
        if not self.may_write():
            return
        try:
            domains = self.api.list("ComputeDomain")[0]
        except NotFound:
            self._served = False  # NVIDIA's CRDs are not installed: nothing to do until they are
            return
        self._served = True
        if not domains:
            return
        self._ensure_namespace()
        cliques = self.api.list("ComputeDomainClique", namespace=self.namespace)[0]
        for domain in domains:
            uid = str(_meta(domain).get("uid"))
            mine = [c for c in cliques if (_meta(c).get("labels") or {}).get(cd.DOMAIN_LABEL) == uid]
            try:
                self.reconcile_domain(domain, mine)
            except (Conflict, NotFound):
                continue  # changed meanwhile: the next pass sees the new state
            except ApiError as exc:
                log.warning("event=domain-reconcile-failed domain=%s/%s error=%r", _meta(domain).get("namespace"),
                            _meta(domain).get("name"), str(exc))

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.reconcile()
            except (ApiError, OSError) as exc:
                log.warning("event=compute-domain-pass-failed error=%r", str(exc))
