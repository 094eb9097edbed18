"""`gpu-dra bench differential [--size N] [--seed S] [-o json]`: our allocator against the real kube-scheduler.

A control plane of real Kubernetes (sim/upstream: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
no kubelets) runs the seeded scenarios of bench/scenarios.py one after another. Per scenario: Node objects made
Ready by a status patch, the DeviceClasses and ResourceSlices, then the pods one at a time, each with its
ResourceClaims; kube-scheduler decides each pod (bound, with its claims' status.allocation, or PodScheduled=False)
before the next is created. Then `gpu-dra allocate`'s session runs on the same objects as read back from the API
(the claims allocated so far hold their devices; the pod's own claims pending): with `--node` set to the node
kube-scheduler chose, or over every node where kube-scheduler found none.

Compared per pod: whether it fits, and which devices each claim got (request, pool, device, adminAccess, in
result order). 1.37's allocator (the "incubating" one its default gates select) searches pools sorted by driver
and pool name, a pool's slices sorted by name and a slice's devices in order, and stops at the first solution,
so on a given node the devices are defined; the node itself is not (equal scores are broken at random), hence
the pinning. The scenarios that disagree are written out (`--keep DIR`) as `gpu-dra allocate -f` input.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.report import emit
from bench.scenarios import ADMIN_LABEL, Scenario, generate, node_object, pod_object
from controller.cel import CelEnvironment
from controller.offline import ClaimResult, Session
from gpudra.features import Features
from gpudra.kubeapi import AlreadyExists, ApiError, KubeApi, NotFound

POD_TIMEOUT = 30.0


class DifferentialFailed(Exception):
    pass


@dataclass(frozen=True)
class KubeDecision:
    """What kube-scheduler did with one pod."""

    pod: str
    outcome: str  # allocated | unschedulable | error
    node: str | None
    message: str
    allocations: dict[str, dict[str, Any]]  # claim name -> status.allocation


@dataclass
class PodCheck:
    scenario: int
    pod: str
    kube: str
    ours: str
    node: str | None
    agree: bool
    devices_compared: bool
    detail: str = ""
    known: str = ""  # a difference docs/kubernetes-versions.md explains (empty: unexplained)


@dataclass
class Report:
    checks: list[PodCheck] = field(default_factory=list)
    features: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self, seed: int) -> dict[str, Any]:
        agreed = sum(c.agree for c in self.checks)
        disagreements = [c.__dict__ for c in self.checks if not c.agree]
        unexplained = [d for d in disagreements if not d["known"]]
        outcomes = Counter(c.kube for c in self.checks)
        return {
            "benchmark": "differential",
            "kubernetes": "v1.37.2 kube-scheduler",
            "scenarios": len({c.scenario for c in self.checks}),
            "pods": len(self.checks),
            "agreed": agreed,
            "agreementRate": round(agreed / len(self.checks), 4) if self.checks else 0.0,
            "devicesCompared": sum(c.devices_compared for c in self.checks),
            "knownDifferences": len(disagreements) - len(unexplained),
            "unexplained": len(unexplained),
            "kubeOutcomes": dict(sorted(outcomes.items())),
            "exercised": dict(sorted(self.features.items())),
            "disagreements": disagreements,
            "seconds": round(self.seconds, 1),
            "seed": seed,
        }


# ---- kube-scheduler's side ---------------------------------------------------------------------------------------

def _ensure(api: KubeApi, kind: str, obj: dict[str, Any], namespace: str | None = None) -> None:
    try:
        api.create(kind, obj, namespace=namespace)
    except AlreadyExists:
        pass


def setup(api: KubeApi, scenario: Scenario) -> None:
    ns = scenario.namespace
    api.create("Namespace", {"metadata": {"name": ns, "labels": {ADMIN_LABEL: "true"}}})
    # The ServiceAccount admission plugin wants the namespace's default account (the controller-manager makes it
    # too, a moment later).
    _ensure(api, "ServiceAccount", {"metadata": {"name": "default", "namespace": ns}}, namespace=ns)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in scenario.nodes:
        api.create("Node", node_object(name))
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "no kubelet: set by the check",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        api.patch("Node", name, {"status": {"conditions": [ready]}}, patch_type="strategic", subresource="status")
    for cls in scenario.classes:
        api.create("DeviceClass", cls)
    for piece in scenario.slices:
        api.create("ResourceSlice", piece)
    for claim in scenario.claims:
        api.create("ResourceClaim", claim, namespace=ns)


def teardown(api: KubeApi, scenario: Scenario) -> None:
    """Remove what the scenario made; its pods at once (no kubelet confirms a graceful deletion)."""
    ns = scenario.namespace
    for pod in scenario.pods:
        api.delete("Pod", pod.name, namespace=ns, grace_period_seconds=0)
    for piece in scenario.slices:
        api.delete("ResourceSlice", piece["metadata"]["name"])
    for name in scenario.nodes:
        api.delete("Node", name)
    for cls in scenario.classes:
        api.delete("DeviceClass", cls["metadata"]["name"])
    api.delete("Namespace", ns)


def _scheduled_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return dict(cond)
    return None


def schedule_one(api: KubeApi, scenario: Scenario, index: int) -> KubeDecision:
    """Create the pod and wait for kube-scheduler's decision."""
    ns, spec = scenario.namespace, scenario.pods[index]
    api.create("Pod", pod_object(ns, spec), namespace=ns)
    deadline = time.monotonic() + POD_TIMEOUT
    while time.monotonic() < deadline:
        try:
            pod = api.get("Pod", spec.name, namespace=ns)
        except NotFound:
            # Bound, then evicted at once by the device-taint-eviction controller (a NoExecute taint tolerated
            # without naming the effect): the claims keep their allocation until the claim controller runs.
            pod = {"spec": {"nodeName": _allocated_node(api, scenario, index)}}
        node = (pod.get("spec") or {}).get("nodeName")
        cond = _scheduled_condition(pod)
        if node:
            allocations = {}
            for claim in spec.claims:
                alloc = (api.get("ResourceClaim", claim, namespace=ns).get("status") or {}).get("allocation")
                if not alloc:
                    raise DifferentialFailed(f"pod {ns}/{spec.name} is bound to {node} but claim {claim} has no "
                                             "allocation")
                allocations[claim] = alloc
            return KubeDecision(spec.name, "allocated", node, "", allocations)
        if cond is not None and cond.get("status") == "False":
            outcome = "unschedulable" if cond.get("reason") == "Unschedulable" else "error"
            # Off the queue: a pod left pending would be retried onto the next scenario's nodes.
            api.delete("Pod", spec.name, namespace=ns, grace_period_seconds=0)
            return KubeDecision(spec.name, outcome, None, str(cond.get("message") or cond.get("reason")), {})
        time.sleep(0.1)
    raise DifferentialFailed(f"kube-scheduler decided nothing about pod {ns}/{spec.name} within {POD_TIMEOUT:.0f} s")


def _allocated_node(api: KubeApi, scenario: Scenario, index: int) -> str:
    """The node a vanished pod was bound to, from its first claim's allocation (matchFields metadata.name)."""
    spec = scenario.pods[index]
    alloc = (api.get("ResourceClaim", spec.claims[0], namespace=scenario.namespace).get("status") or {}).get("allocation")
    for term in ((alloc or {}).get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and field_.get("values"):
                return str(field_["values"][0])
    raise DifferentialFailed(f"pod {scenario.namespace}/{spec.name} was deleted before kube-scheduler's decision "
                             "could be read")


# ---- our side ----------------------------------------------------------------------------------------------------

def _clean(obj: dict[str, Any], *, keep_status: bool) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("name", "namespace", "labels", "uid")}
    out = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    out["metadata"] = meta
    if keep_status and obj.get("status"):
        out["status"] = obj["status"]
    return out


def our_inputs(api: KubeApi, scenario: Scenario, index: int, held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects as kube-scheduler saw them: nodes, classes, slices (in the order the scenario wrote them),
    the claims allocated so far, and the pod with its claims pending."""
    ns, spec = scenario.namespace, scenario.pods[index]
    objects: list[dict[str, Any]] = []
    for name in scenario.nodes:
        objects.append({**_clean(api.get("Node", name), keep_status=True), "kind": "Node", "apiVersion": "v1"})
    for cls in scenario.classes:
        objects.append({**_clean(api.get("DeviceClass", cls["metadata"]["name"]), keep_status=False),
                        "kind": "DeviceClass", "apiVersion": "resource.k8s.io/v1"})
    for piece in scenario.slices:
        objects.append({**_clean(api.get("ResourceSlice", piece["metadata"]["name"]), keep_status=False),
                        "kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1"})
    objects += held
    for claim in spec.claims:
        objects.append({**_clean(api.get("ResourceClaim", claim, namespace=ns), keep_status=False),
                        "kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1"})
    pod = pod_object(ns, spec)
    objects.append(pod)
    return objects


def ours(objects: list[dict[str, Any]], node: str | None) -> list[ClaimResult]:
    """What `gpu-dra allocate -f INPUT [--node NODE]` answers (the same session, in this process)."""
    features = Features()
    session = Session(objects, features, CelEnvironment(features=features))
    return session.allocate_on(node) if node is not None else session.place_all()


def _devices(allocation: dict[str, Any] | None) -> list[tuple[str, str, str, bool]]:
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return [(r.get("request", ""), r.get("pool", ""), r.get("device", ""), bool(r.get("adminAccess"))) for r in results]


def compare(scenario: Scenario, decision: KubeDecision, results: list[ClaimResult]) -> PodCheck:
    ns = scenario.namespace
    spec = next(p for p in scenario.pods if p.name == decision.pod)
    mine = {r.claim: r for r in results}
    missing = [c for c in spec.claims if f"{ns}/{c}" not in mine]
    if missing:
        return PodCheck(scenario.index, decision.pod, decision.outcome, "missing", decision.node, False, False,
                        f"no result for claims {missing}")
    outcomes = {mine[f"{ns}/{c}"].outcome for c in spec.claims}
    our_outcome = "allocated" if outcomes == {"allocated"} else "error" if "error" in outcomes else "unschedulable"
    messages = "; ".join(sorted({mine[f"{ns}/{c}"].message for c in spec.claims}))
    if decision.outcome != our_outcome:
        return PodCheck(scenario.index, decision.pod, decision.outcome, our_outcome, decision.node, False, False,
                        f"kube-scheduler: {decision.message or 'bound to ' + str(decision.node)}; ours: {messages}")
    if decision.outcome != "allocated":
        return PodCheck(scenario.index, decision.pod, decision.outcome, our_outcome, None, True, False, decision.message)
    for claim in spec.claims:
        theirs, own = _devices(decision.allocations[claim]), _devices(mine[f"{ns}/{claim}"].allocation)
        if theirs != own:
            return PodCheck(scenario.index, decision.pod, "allocated", "allocated", decision.node, False, True,
                            f"claim {claim}: kube-scheduler {theirs}; ours {own}")
    return PodCheck(scenario.index, decision.pod, "allocated", "allocated", decision.node, True, True)


def unvisited_error(scenario: Scenario, objects: list[dict[str, Any]]) -> str:
    """kube-scheduler runs Filter on every node of a small cluster and fails the pod when one node's allocation
    fails fatally; our placer stops at a node that fits. Confirmed when ours, pinned to each node, errs on one."""
    for node in scenario.nodes:
        errors = [r.message for r in ours(objects, node) if r.outcome == "error"]
        if errors:
            return f"fatal error on node {node}, which our placer did not need to visit: {errors[0]}"
    return ""


# ---- the run -----------------------------------------------------------------------------------------------------

def run_scenario(api: KubeApi, scenario: Scenario, keep: Path | None) -> list[PodCheck]:
    setup(api, scenario)
    checks: list[PodCheck] = []
    held: list[dict[str, Any]] = []
    try:
        for index in range(len(scenario.pods)):
            decision = schedule_one(api, scenario, index)
            objects = our_inputs(api, scenario, index, held)
            check = compare(scenario, decision, ours(objects, decision.node))
            if not check.agree and check.kube == "error" and check.ours == "allocated":
                check.known = unvisited_error(scenario, objects)
            checks.append(check)
            if not check.agree and keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                target = keep / f"{scenario.namespace}-p{index}.yaml"
                target.write_text(f"# kube-scheduler: {decision.outcome} {decision.node or ''} {decision.message}\n"
                                  f"# {check.detail}\n" + yaml.safe_dump_all(objects, sort_keys=False))
            for claim in scenario.pods[index].claims:
                obj = api.get("ResourceClaim", claim, namespace=scenario.namespace)
                if (obj.get("status") or {}).get("allocation"):
                    held.append({**_clean(obj, keep_status=True), "kind": "ResourceClaim",
                                 "apiVersion": "resource.k8s.io/v1"})
    finally:
        teardown(api, scenario)
    return checks


def run_all(api: KubeApi, seed: int, count: int, keep: Path | None = None) -> Report:
    report = Report()
    start = time.monotonic()
    _wait_for_scheduler(api)
    for index in range(count):
        scenario = generate(seed, index)
        report.features.update(scenario.features)
        report.checks += run_scenario(api, scenario, keep)
    report.seconds = time.monotonic() - start
    return report


def _wait_for_scheduler(api: KubeApi, timeout: float = 60.0) -> None:
    """The default namespace exists and the API serves resource.k8s.io/v1 (the control plane just started)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.list("DeviceClass")
            api.get("Namespace", "default")
            return
        except (ApiError, NotFound, OSError):
            if time.monotonic() > deadline:
                raise DifferentialFailed(f"the control plane did not serve DeviceClasses within {timeout:.0f} s") from None
            time.sleep(0.5)


class ControlPlane:
    """A control plane of real Kubernetes (no nodes) for the length of a `with` block."""

    def __init__(self, name: str, wait: float = 240.0) -> None:
        self.name, self.wait = name, wait
        self.state = Path(tempfile.mkdtemp(prefix=f"gpu-dra-{name}-"))
        self.api: KubeApi | None = None
        self.scheduler_pid = 0

    def __enter__(self) -> ControlPlane:
        from sim.upstream import commands

        try:
            _, kubeconfig = commands.up(self.name, self.state, [], self.wait)
        except commands.UpstreamError:
            commands.stop(self.state)
            raise
        self.api = KubeApi.connect(kubeconfig=str(kubeconfig))
        for proc in commands.read_status(self.state).get("processes") or []:
            if proc.get("role") == "kube-scheduler" and proc.get("pid"):
                self.scheduler_pid = int(proc["pid"])
        return self

    def __exit__(self, *exc: object) -> None:
        from sim.upstream import commands

        if self.api is not None:
            self.api.close()
        commands.stop(self.state)


def run(args: argparse.Namespace) -> int:
    seed = int(getattr(args, "seed", 1) or 1)
    count = int(getattr(args, "size", None) or 30)
    keep = getattr(args, "keep", None)
    from sim.upstream import commands

    try:
        with ControlPlane(f"diff{seed}") as plane:
            assert plane.api is not None
            report = run_all(plane.api, seed, count, Path(keep) if keep else None)
    except (commands.UpstreamError, DifferentialFailed) as err:
        print(f"bench differential FAILED: {err}", file=sys.stderr)
        return 1
    doc = report.summary(seed)
    emit("differential", doc, getattr(args, "output", "table"))
    return 0 if doc["unexplained"] == 0 else 1
