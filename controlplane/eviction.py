"""The `pods/eviction` subresource (policy/v1 Eviction), as kube-apiserver's eviction REST serves it.

A pod that is not running (Pending, Succeeded, Failed) or already terminating is deleted without looking at
budgets. Otherwise the PodDisruptionBudget selecting it decides: none, deleted; more than one, refused (500); one
whose status the disruption controller has not caught up with (observedGeneration behind), or that allows no
disruption, refused with 429 TooManyRequests, which `kubectl drain` retries; else the budget's
`disruptionsAllowed` goes down by one and the pod is recorded in its `disruptedPods` (the controller forgets it once
the pod is gone) before the pod is deleted with the Eviction's deleteOptions.
"""

from __future__ import annotations

from typing import Any

from controlplane import status as st
from gpudra.labelselector import selects
from controlplane.resources import Registry
from controlplane.selectors import labels_of
from controlplane.store import Filter, Store
from gpudra.timestamps import rfc3339

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
_CONFLICT_RETRIES = 5


def _too_many_requests(cause: str) -> st.StatusError:
    return st.StatusError(429, "TooManyRequests", REFUSED,
                          {"causes": [{"reason": "DisruptionBudget", "message": cause}]})


def _eviction_body(body: Any, name: str) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
        raise st.bad_request("the body of an eviction must be a policy/v1 Eviction")
    named = (body.get("metadata") or {}).get("name")
    if named and named != name:
        raise st.bad_request(f"name in URL does not match name in Eviction object: {name} != {named}")
    options = body.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise st.bad_request("deleteOptions: must be a DeleteOptions object")
    return options


def _disruptible(pod: dict[str, Any]) -> bool:
    """Whether budgets count this pod: running and not already terminating."""
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return phase == "Running" and not (pod.get("metadata") or {}).get("deletionTimestamp")


def evict(store: Store, registry: Registry, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """Evict the pod (or refuse); the Status kube-apiserver answers with (201)."""
    pods = registry.by_kind("Pod")
    budgets = registry.by_kind("PodDisruptionBudget")
    assert pods is not None
    options = _eviction_body(body, name)
    for _ in range(_CONFLICT_RETRIES):
        pod = store.get(pods, namespace, name)
        matching = [] if budgets is None or not _disruptible(pod) else [
            pdb for pdb in store.list(Filter(budgets, namespace))[0]
            if isinstance((pdb.get("spec") or {}).get("selector"), dict)
            and selects(pdb["spec"]["selector"], labels_of(pod))]
        if len(matching) > 1:
            raise st.StatusError(500, "InternalError",
                                 "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
                                 "not support.")
        if matching:
            assert budgets is not None
            pdb = matching[0]
            meta, status = pdb.get("metadata") or {}, pdb.get("status") or {}
            if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
                raise _too_many_requests(f"The disruption budget {meta.get('name')} is still being processed by the server.")
            allowed = int(status.get("disruptionsAllowed") or 0)
            if allowed <= 0:
                raise _too_many_requests(f"The disruption budget {meta.get('name')} needs "
                                         f"{int(status.get('desiredHealthy') or 0)} healthy pods and has "
                                         f"{int(status.get('currentHealthy') or 0)} currently")
            taken = {**pdb, "status": {**status, "disruptionsAllowed": allowed - 1,
                                       "disruptedPods": {**(status.get("disruptedPods") or {}), name: rfc3339()}}}
            try:
                store.update(budgets, namespace, str(meta.get("name")), taken, subresource="status")
            except st.StatusError as err:
                if err.code == 409:
                    continue  # another eviction took one: look again
                raise
        store.delete(pods, namespace, name, options)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    raise st.StatusError(429, "TooManyRequests", "the disruption budget is being updated too often; try again")
