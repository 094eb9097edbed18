"""A pod's ResourceClaims by name: the claims kube-controller-manager's resourceclaim controller generates from a
pod's `spec.resourceClaims[].resourceClaimTemplateName` (named from `generateName: <pod>-<podClaimName>-`,
annotated with `resource.kubernetes.io/pod-claim-name`, owned by the pod, recorded in
`pod.status.resourceClaimStatuses`), and how a pod's claim references resolve to them. Pure: the controller's
explanations and the offline tools read them; the testbed's stand-in for that controller
(sim.roles.claimlifecycle) writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller import objects as o
from controller.objects import DELETE_PROTECTION_FINALIZER, POD_CLAIM_NAME_ANNOTATION, Obj

# A generated name is at most 63 characters: the base plus five random characters.
_MAX_BASE_LEN = 57


def generate_name(pod_name: str, pod_claim_name: str) -> str:
    """Kubernetes' generateName for a claim made from a template (long names are cut proportionally)."""
    base = f"{pod_name}-{pod_claim_name}-"
    if len(base) <= _MAX_BASE_LEN:
        return base
    total = len(base)
    return f"{pod_name[: len(pod_name) * _MAX_BASE_LEN // total]}-{pod_claim_name[: len(pod_claim_name) * _MAX_BASE_LEN // total]}"


def claim_from_template(pod: Mapping[str, Any], pod_claim_name: str, template: Mapping[str, Any], *,
                        protected: bool = False) -> Obj:
    """The ResourceClaim the resourceclaim controller creates for one pod claim; `protected` when the caller
    allocates it next (the embedded scheduler): it then carries the delete-protection finalizer from the start,
    which saves kube-scheduler's separate update that adds it (one that finds it there goes on, as upstream's
    does; a claim that stays unallocated has it removed by the release pass)."""
    tspec = o.section(template, "spec")
    tmeta = o.section(tspec, "metadata")
    annotations = dict(tmeta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim_name
    metadata: dict[str, Any] = {
        "generateName": generate_name(o.name(pod), pod_claim_name),
        "namespace": o.namespace(pod),
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": o.name(pod),
                "uid": o.uid(pod),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if tmeta.get("labels"):
        metadata["labels"] = dict(tmeta["labels"])
    if protected:
        metadata["finalizers"] = [DELETE_PROTECTION_FINALIZER]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": dict(o.section(tspec, "spec")),
    }


@dataclass(frozen=True)
class PodClaim:
    """One entry of pod.spec.resourceClaims, resolved against the pod's status and existing claims."""

    pod_claim_name: str
    template: str | None  # resourceClaimTemplateName
    claim_name: str | None  # the ResourceClaim to use, None while a template's claim is not created yet


def generated_claim_for(pod: Mapping[str, Any], pod_claim_name: str, claims: Iterable[Mapping[str, Any]]) -> Obj | None:
    """A claim already generated for this pod claim (covers a crash between create and the pod status update)."""
    found = GeneratedClaims(claims).find(pod, pod_claim_name)
    return dict(found) if found is not None else None


class GeneratedClaims:
    """Claims generated from templates, by (namespace, owning pod UID, pod claim name).

    Built once (per pass, or kept current with `add`/`discard` as claims change) so that resolving every
    pending pod does not scan every claim (O(pods x claims)). The first claim seen for a key wins, as a linear
    scan in the same order would pick it.
    """

    def __init__(self, claims: Iterable[Mapping[str, Any]] = ()) -> None:
        self._by_owner: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self._entry_of: dict[str, tuple[str, str, str]] = {}  # claim key -> the entry it holds
        for claim in claims:
            self.add(claim)

    def add(self, claim: Mapping[str, Any]) -> None:
        owner = o.controller_owner_uid(claim)
        pcn = o.annotations(claim).get(POD_CLAIM_NAME_ANNOTATION)
        if owner and isinstance(pcn, str):
            entry = (o.namespace(claim), owner, pcn)
            if entry not in self._by_owner:
                self._by_owner[entry] = claim
                self._entry_of[o.key(claim)] = entry

    def discard(self, claim_key: str) -> None:
        """Forget the claim of this key (deleted, or about to be added again as changed)."""
        entry = self._entry_of.pop(claim_key, None)
        if entry is not None:
            del self._by_owner[entry]

    def find(self, pod: Mapping[str, Any], pod_claim_name: str) -> Mapping[str, Any] | None:
        pod_uid = o.uid(pod)
        if not pod_uid:
            return None
        return self._by_owner.get((o.namespace(pod), pod_uid, pod_claim_name))


def resolve_pod_claims(pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]] | GeneratedClaims) -> list[PodClaim]:
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in o.list_field(o.section(pod, "status"), "resourceClaimStatuses")
        if isinstance(s, Mapping)
    }
    index: GeneratedClaims | None = claims if isinstance(claims, GeneratedClaims) else None
    pending_claims = claims if not isinstance(claims, GeneratedClaims) else None
    out: list[PodClaim] = []
    for entry in o.list_field(o.section(pod, "spec"), "resourceClaims"):
        if not isinstance(entry, Mapping):
            continue
        pcn = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            out.append(PodClaim(pcn, None, str(entry["resourceClaimName"])))
            continue
        template = entry.get("resourceClaimTemplateName")
        if not template:
            continue
        generated = statuses.get(pcn)
        if not generated:
            if index is None:
                # Indexed lazily: pods whose status already names their claims never need it.
                index = GeneratedClaims(pending_claims or ())
            found = index.find(pod, pcn)
            generated = o.name(found) if found else None
        out.append(PodClaim(pcn, str(template), str(generated) if generated else None))
    return out
