"""The review and token endpoints that are answered, not stored: SelfSubjectAccessReview and
SubjectAccessReview (`kubectl auth can-i`), SelfSubjectReview (`kubectl auth whoami`), and TokenRequest on
serviceaccounts/NAME/token (`kubectl create token`)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from controlplane import status as st
from controlplane.authn import MIN_TOKEN_SECONDS, BoundObject, TokenAuthenticator, UserInfo
from controlplane.authz.attributes import Attributes
from controlplane.authz.chain import AuthorizerChain
from controlplane.authz.rbac import RbacAuthorizer

_MAX_TOKEN_SECONDS = 1 << 32
Get = Callable[[str, str, str], "dict[str, Any] | None"]


def _attributes(user: UserInfo, spec: dict[str, Any]) -> Attributes:
    ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if isinstance(ra, dict):
        return Attributes(user, str(ra.get("verb") or ""), api_group=str(ra.get("group") or ""),
                          resource=str(ra.get("resource") or ""), subresource=str(ra.get("subresource") or ""),
                          namespace=str(ra.get("namespace") or ""), name=str(ra.get("name") or ""))
    if isinstance(nra, dict):
        return Attributes(user, str(nra.get("verb") or ""), resource_request=False, path=str(nra.get("path") or ""))
    raise st.StatusError(422, "Invalid", 'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: '
                                         "spec.resourceAttributes: Invalid value: \"null\": exactly one of "
                                         "nonResourceAttributes or resourceAttributes must be specified")


def _answer(kind: str, body: dict[str, Any], authorizer: AuthorizerChain, user: UserInfo) -> dict[str, Any]:
    raw = body.get("spec")
    spec: dict[str, Any] = raw if isinstance(raw, dict) else {}
    verdict = authorizer.authorize(_attributes(user, spec))
    status: dict[str, Any] = {"allowed": verdict.allowed}
    if verdict.reason:
        status["reason"] = verdict.reason
    return {"kind": kind, "apiVersion": "authorization.k8s.io/v1", "metadata": {"creationTimestamp": None},
            "spec": spec, "status": status}


def self_subject_access_review(body: Any, user: UserInfo, authorizer: AuthorizerChain) -> dict[str, Any]:
    return _answer("SelfSubjectAccessReview", body if isinstance(body, dict) else {}, authorizer, user)


def subject_access_review(body: Any, authorizer: AuthorizerChain) -> dict[str, Any]:
    body = body if isinstance(body, dict) else {}
    spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    extra = {k: tuple(v) for k, v in (spec.get("extra") or {}).items()}
    subject = UserInfo(str(spec.get("user") or ""), str(spec.get("uid") or ""), tuple(spec.get("groups") or ()), extra)
    return _answer("SubjectAccessReview", body, authorizer, subject)


def self_subject_rules_review(body: Any, user: UserInfo, rbac: RbacAuthorizer) -> dict[str, Any]:
    """What RBAC grants the user in spec.namespace (`kubectl auth can-i --list`); `incomplete` for kubelets,
    whose rights the Node authorizer decides per object, as upstream's rule resolvers say."""
    raw = body.get("spec") if isinstance(body, dict) else None
    spec: dict[str, Any] = raw if isinstance(raw, dict) else {}
    namespace = str(spec.get("namespace") or "")
    resource_rules: list[dict[str, Any]] = []
    url_rules: list[dict[str, Any]] = []
    for rule in rbac.index().rules_for(user, namespace):
        if rule.non_resource_urls:
            url_rules.append({"verbs": sorted(rule.verbs), "nonResourceURLs": list(rule.non_resource_urls)})
        else:
            entry: dict[str, Any] = {"verbs": sorted(rule.verbs), "apiGroups": sorted(rule.api_groups),
                                     "resources": sorted(rule.resources)}
            if rule.resource_names:
                entry["resourceNames"] = sorted(rule.resource_names)
            resource_rules.append(entry)
    return {"kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "spec": spec,
            "status": {"resourceRules": resource_rules, "nonResourceRules": url_rules,
                       "incomplete": user.node_name is not None}}


def self_subject_review(user: UserInfo) -> dict[str, Any]:
    return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "status": {"userInfo": user.as_api()}}


def token_request(namespace: str, name: str, account: dict[str, Any], body: Any, tokens: TokenAuthenticator,
                  get: Get) -> dict[str, Any]:
    """A TokenRequest answered with a token bound to `account` (and the object of spec.boundObjectRef)."""
    body = body if isinstance(body, dict) else {}
    spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    seconds = spec.get("expirationSeconds") or 3600
    invalid = f'TokenRequest.authentication.k8s.io "{name}" is invalid: '
    if not isinstance(seconds, int) or seconds < MIN_TOKEN_SECONDS:
        raise st.StatusError(422, "Invalid", f"{invalid}spec.expirationSeconds: Invalid value: {seconds}: may not "
                                             "specify a duration less than 10 minutes")
    if seconds > _MAX_TOKEN_SECONDS:
        raise st.StatusError(422, "Invalid", f"{invalid}spec.expirationSeconds: Invalid value: {seconds}: may not "
                                             "specify a duration larger than 2^32 seconds")
    bound = node = None
    ref = spec.get("boundObjectRef")
    if isinstance(ref, dict) and ref:
        kind = str(ref.get("kind") or "")
        if kind not in ("Pod", "Secret", "Node"):
            raise st.StatusError(422, "Invalid", f'{invalid}spec.boundObjectRef.kind: Unsupported value: "{kind}": '
                                                 'supported values: "Node", "Pod", "Secret"')
        target = get(kind, "" if kind == "Node" else namespace, str(ref.get("name") or ""))
        if target is None or (ref.get("uid") and ref["uid"] != target["metadata"].get("uid")):
            raise st.StatusError(404, "NotFound", f'{kind.lower()}s "{ref.get("name")}" not found')
        bound = BoundObject(kind, target["metadata"]["name"], str(target["metadata"].get("uid")))
        if kind == "Node":
            node, bound = bound, None
        elif kind == "Pod":
            node_name = (target.get("spec") or {}).get("nodeName")
            found = get("Node", "", node_name) if node_name else None
            if found is not None:
                node = BoundObject("Node", str(node_name), str(found["metadata"].get("uid")))
    token, exp = tokens.service_account_token(namespace, name, str(account["metadata"]["uid"]),
                                              expiration_seconds=seconds, audiences=spec.get("audiences") or None,
                                              bound=bound, node=node)
    expires = datetime.datetime.fromtimestamp(exp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out_spec = {**spec, "expirationSeconds": seconds, "audiences": spec.get("audiences") or
                ["https://kubernetes.default.svc.cluster.local"]}
    return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": out_spec, "status": {"token": token, "expirationTimestamp": expires}}
