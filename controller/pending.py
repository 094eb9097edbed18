"""What a pending pod waits on, as the controller explains it beside kube-scheduler.

kube-scheduler allocates; a pod it cannot place gets only its terse FailedScheduling. PendingExplainer finds the
pods that wait on ResourceClaims (a claim missing or being deleted, a gang still forming or not fitting, devices
no node can give) and says which, as an Event and the explanation annotation on the pending claims; a pod that
asks for an extended resource a DeviceClass backs (`nvidia.com/gpu` under KEP-5004) is explained through the claim
kube-scheduler would make for it. The testbed's embedded scheduler (sim.roles.scheduler) reads pods' claims the
same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.allocator import AllocationError, ClusterSnapshot, Node, NodeSelector, parse_claim
from controller.cel import CelEnvironment
from controller.claims import GeneratedClaims, resolve_pod_claims
from controller.diagnosis import NodeReason, explain, summarize
from controller.extended import class_for_resource, dra_extended_requests, extended_resource_claim
from controller.explanation_writer import REASON_GANG_WAITING, REASON_UNSCHEDULABLE, ExplanationWriter
from controller.ganggroups import gang_label, gang_size_label, is_gang_claim
from controller.metrics import ControllerMetrics
from controller.objects import Obj
from controller.scoring import NoPlacement, Placer
from controller.snapshots import build_snapshot
from controller.view import View
from gpudra.features import Features

# Pods for other schedulers are left alone; in embedded mode we are the default scheduler.
OUR_SCHEDULERS = ("", "default-scheduler")


def is_pending(pod: Mapping[str, Any]) -> bool:
    spec = o.section(pod, "spec")
    return (
        not spec.get("nodeName")
        and not o.pod_done(pod)
        and not o.deleting(pod)
        and str(spec.get("schedulerName") or "") in OUR_SCHEDULERS
    )


def unavailable_message(total_nodes: int, reasons: Iterable[NodeReason]) -> str:
    """kube-scheduler's shape: `0/N nodes are available: <why, grouped>`."""
    return f"0/{total_nodes} nodes are available: {summarize(list(reasons))}"


def allocation_rejects(claims: Iterable[Mapping[str, Any]], node: Node) -> str | None:
    """An allocated claim pins its pod to the nodes its allocation's nodeSelector matches."""
    for claim in claims:
        alloc = o.allocation(claim)
        if alloc is None or alloc.get("nodeSelector") is None:
            continue
        try:
            selector = NodeSelector.parse(alloc["nodeSelector"], f"ResourceClaim {o.key(claim)}: status.allocation.nodeSelector")
        except AllocationError as err:
            return str(err)
        if not selector.matches(node):
            return f"claim {o.key(claim)} is allocated on devices that this node cannot reach"
    return None


@dataclass(frozen=True)
class PodClaims:
    """A pod's claims in spec order, or why the pod must wait before placement is even tried."""

    claims: list[Obj]
    wait_reason: str = ""
    wait_event: str = REASON_UNSCHEDULABLE
    silent: bool = False  # waiting for something this pass itself is creating: no event
    warning: bool = True  # False while a gang is still forming: progress, not a failure


def gather_pod_claims(
    pod: Mapping[str, Any],
    claims_by_key: Mapping[str, Obj],
    driver: str,
    templates: Mapping[str, Obj] | None = None,
    generated: GeneratedClaims | None = None,
    verdict_annotation: str | None = None,
) -> PodClaims:
    """`verdict_annotation`: the claims' explanation annotation, where the gang controller says why a complete
    gang was not allocated; that is then the pod's reason."""
    ns = o.namespace(pod)
    out: list[Obj] = []
    for pc in resolve_pod_claims(pod, generated if generated is not None else claims_by_key.values()):
        if pc.claim_name is None:
            if templates is not None and f"{ns}/{pc.template}" not in templates:
                return PodClaims(
                    [],
                    f"spec.resourceClaims[{pc.pod_claim_name}].resourceClaimTemplateName: "
                    f'resourceclaimtemplate "{pc.template}" not found in namespace {ns}',
                )
            return PodClaims([], f"waiting for the ResourceClaim of pod claim {pc.pod_claim_name} to be created", silent=True)
        claim = claims_by_key.get(f"{ns}/{pc.claim_name}")
        if claim is None:
            return PodClaims([], f'resourceclaim "{pc.claim_name}" not found')
        if o.deleting(claim):
            return PodClaims([], f'resourceclaim "{pc.claim_name}" is being deleted')
        if o.allocation(claim) is None and is_gang_claim(claim, driver):
            return _gang_wait(claim, claims_by_key, driver, verdict_annotation)
        out.append(claim)
    return PodClaims(out)


def _gang_wait(claim: Obj, claims_by_key: Mapping[str, Obj], driver: str, verdict_annotation: str | None) -> PodClaims:
    """A pod whose claim belongs to a label gang that is not allocated: still forming (Normal), or the gang
    controller's reason why the complete gang does not fit (Warning). One event either way, whose type and
    message follow the gang."""
    ns, labels = o.namespace(claim), o.labels(claim)
    gang, size = labels.get(gang_label(driver)), str(labels.get(gang_size_label(driver)))
    members = sum(1 for c in claims_by_key.values()
                  if o.namespace(c) == ns and o.labels(c).get(gang_label(driver)) == gang)
    verdict = o.annotations(claim).get(verdict_annotation) if verdict_annotation else None
    if size.isdigit() and members >= int(size) and verdict:
        return PodClaims([], f"claim {o.key(claim)} belongs to gang {ns}/{gang}: {verdict}", REASON_GANG_WAITING)
    return PodClaims([], f"claim {o.key(claim)} belongs to gang {ns}/{gang} ({members} of {size} claims exist), which is "
                         "allocated all-or-nothing once all its claims exist and fit", REASON_GANG_WAITING, warning=False)


class PendingExplainer:
    """Cluster mode: kube-scheduler allocates; we explain pods that wait on claims that cannot fit."""

    def __init__(self, explainer: ExplanationWriter, metrics: ControllerMetrics, *, features: Features, driver_name: str) -> None:
        self._explainer = explainer
        self._metrics = metrics
        self._features = features
        self.driver = driver_name
        self._cel = CelEnvironment(features=features)

    def reconcile(self, view: View) -> int:
        waiting = 0
        state: tuple[ClusterSnapshot, Placer] | None = None
        claims_by_key = dict(view.claims)
        backing: dict[str, str] | None = None
        for pod in sorted((p for p in view.pods.values() if is_pending(p)), key=o.key):
            if o.list_field(o.section(pod, "spec"), "resourceClaims"):
                gathered = gather_pod_claims(pod, claims_by_key, self.driver,
                                             verdict_annotation=self._explainer.annotation)
                if gathered.wait_reason:
                    if not gathered.silent:
                        waiting += 1
                        self._explainer.event(pod, gathered.wait_event, gathered.wait_reason, warning=gathered.warning)
                    continue
                claims = gathered.claims
                pending = [c for c in claims if o.allocation(c) is None]
                exists, preface = True, ""
            else:
                if backing is None:
                    backing = class_for_resource(view.classes.values()) if self._features.extended_resource else {}
                found = _extended_claim(pod, backing, view.nodes.values())
                if found is None:
                    continue
                extended, preface = found
                claims = pending = [extended]
                exists = False  # kube-scheduler makes it when the pod fits: nothing to annotate until then
            if not pending:
                continue
            if state is None:
                snapshot, _ = build_snapshot(view, view.allocated_claims())
                state = (snapshot, Placer(snapshot, self._features, self._cel))
            snapshot, placer = state
            nodes = [n for n in snapshot.node_names if allocation_rejects(claims, snapshot.node(n)) is None]
            try:
                parsed = [parse_claim(c) for c in pending]
                result = placer.place(parsed, nodes)
                if not isinstance(result, NoPlacement):
                    continue  # it fits somewhere: kube-scheduler will place it
                message = unavailable_message(len(snapshot.node_names), explain(snapshot, parsed, nodes, self._features, self._cel))
            except AllocationError as err:
                message = str(err)
            waiting += 1
            self._metrics.failures.labels(reason="unschedulable").inc()
            self._explainer.event(pod, REASON_UNSCHEDULABLE, preface + message)
            if exists:
                self._explainer.annotate(pending, message)
        return waiting


def _extended_claim(pod: Mapping[str, Any], backing: Mapping[str, str],
                    nodes: Iterable[Mapping[str, Any]]) -> tuple[Obj, str] | None:
    """The claim kube-scheduler would make for a pod's DRA-backed extended resources (KEP-5004), to explain why it
    cannot fit, and what the explanation says first (the claim does not exist yet); None when the pod asks for
    none, when its claim exists already, or when a node advertises one of the resources (a device plugin serves it
    there, and kube-scheduler's own fit message covers it)."""
    if o.section(o.section(pod, "status"), "extendedResourceClaimStatus"):
        return None
    requests, mappings = dra_extended_requests(pod, backing)
    if not requests:
        return None
    if any(m["resourceName"] in o.section(o.section(n, "status"), "allocatable") for n in nodes for m in mappings):
        return None
    name = f"{o.name(pod)}-extended-resources"
    asked = "; ".join(f"{m['resourceName']}: {r['exactly']['count']} (container {m['containerName']}) is served by "
                      f"DeviceClass {r['exactly']['deviceClassName']}" for m, r in zip(mappings, requests, strict=True))
    return (extended_resource_claim(pod, requests, name),
            f"{asked}, through the claim kube-scheduler makes for the pod ({name}-...): ")
