"""DRAResourceClaimGranularStatusAuthorization (beta and on from 1.36): a status write that changes
status.allocation or status.reservedFor also needs `<verb>` on the synthetic subresource
`resourceclaims/binding` (cluster-wide), and one that changes a driver's entries in status.devices needs
`associated-node:<verb>` (a service account on the claim's node) or `arbitrary-node:<verb>` on
`resourceclaims/driver` named after that driver, in the claim's namespace (pkg/registry/resource)."""

from __future__ import annotations

from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest
from controlplane.authn import EXTRA_NODE_NAME
from controlplane.authz.attributes import Attributes


def _modified_drivers(new: list[Any], old: list[Any]) -> set[str]:
    def by_device(entries: list[Any]) -> dict[tuple[str, str, str], Any]:
        return {(e.get("driver", ""), e.get("pool", ""), e.get("device", "")): e for e in entries if isinstance(e, dict)}
    a, b = by_device(new), by_device(old)
    return {key[0] for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def _single_node(allocation: Any) -> str | None:
    """The node of an allocation whose node selector names exactly one node by metadata.name."""
    terms = (((allocation or {}).get("nodeSelector") or {}).get("nodeSelectorTerms") or []) if isinstance(allocation, dict) else []
    if len(terms) != 1 or terms[0].get("matchExpressions"):
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) == 1 and fields[0].get("key") == "metadata.name" and fields[0].get("operator") == "In" \
            and len(fields[0].get("values") or []) == 1:
        return str(fields[0]["values"][0])
    return None


class ClaimStatusPlugin:
    kinds = frozenset({("resource.k8s.io", "ResourceClaim")})

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        if (not self._enabled or req.rt.kind != "ResourceClaim" or req.rt.group != "resource.k8s.io"
                or req.subresource != "status" or obj is None or old is None):
            return
        new_s, old_s = obj.get("status") or {}, old.get("status") or {}
        errors = []
        if new_s.get("allocation") != old_s.get("allocation") or new_s.get("reservedFor") != old_s.get("reservedFor"):
            a = Attributes(req.user, req.verb, api_group="resource.k8s.io", resource="resourceclaims",
                           subresource="binding")
            if not req.authorizer.authorize(a).allowed:
                errors.append("status: Forbidden: changing status.allocation or status.reservedFor requires extra "
                              f"permission: {req.verb} on resourceclaims/binding")
        drivers = _modified_drivers(new_s.get("devices") or [], old_s.get("devices") or [])
        if drivers:
            user_node = (req.user.extra.get(EXTRA_NODE_NAME) or ("",))[0]
            claim_node = _single_node(new_s.get("allocation") or old_s.get("allocation"))
            for driver in sorted(drivers):
                verbs = ([f"associated-node:{req.verb}"] if user_node and user_node == claim_node else []) \
                    + [f"arbitrary-node:{req.verb}"]
                if not any(req.authorizer.authorize(Attributes(
                        req.user, v, api_group="resource.k8s.io", resource="resourceclaims", subresource="driver",
                        namespace=req.namespace, name=driver)).allowed for v in verbs):
                    errors.append(f"status.devices: Forbidden: changing status.devices requires extra permission: "
                                  f"{' or '.join(verbs)} on resourceclaims/driver {driver!r}")
        if errors:
            raise st.invalid(req.rt, req.name, errors)
