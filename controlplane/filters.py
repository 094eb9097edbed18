"""The request side of the filter chain: who is asking (authentication, 401) and what they ask for, as
authorization attributes (kube-apiserver's RequestInfo: verb from the method, list/watch/get from the path and
query)."""

from __future__ import annotations

from controlplane import status as st
from controlplane.authn import (
    ADMIN,
    ANONYMOUS_USER,
    AUTHENTICATED,
    SA_PREFIX,
    UNAUTHENTICATED,
    TokenAuthenticator,
    Unauthorized,
    UserInfo,
    certificate_user,
)
from controlplane.authn import AccountLookup
from controlplane.admission.request import AuditAnnotations
from controlplane.authz.attributes import Attributes, forbidden, request_verb
from controlplane.authz.chain import AuthorizerChain
from controlplane.httphead import Headers
from controlplane.resources import ResourceType
from controlplane.tls import PeerIdentity

UNAUTHORIZED = st.StatusError(401, "Unauthorized", "Unauthorized")


def authenticate(authorization: str | None, tokens: TokenAuthenticator, accounts: AccountLookup,
                 unauthenticated_as_admin: bool, peer: PeerIdentity | None = None) -> UserInfo:
    """The user of a request; 401 when it presents a credential that is refused. `peer` is the connection's
    client certificate: a verified one wins over a token, as x509 precedes the token authenticators; a refused
    one is 401 unless a token authenticates (kube-apiserver's union, then fail-on-error before anonymous)."""
    if peer is not None and not peer.refused:
        return certificate_user(peer.common_name, peer.organizations)
    if peer is not None and not authorization:
        raise UNAUTHORIZED
    if not authorization and unauthenticated_as_admin:
        return ADMIN
    try:
        return tokens.authenticate(authorization, accounts)
    except Unauthorized:
        raise UNAUTHORIZED from None


def impersonate(user: UserInfo, headers: Headers, authorizer: AuthorizerChain) -> UserInfo:
    """The impersonation filter (`kubectl --as`, `--as-group`): the requester needs `impersonate` on users (or
    serviceaccounts) and groups; the request then runs as that user, in system:authenticated."""
    names = headers.get_all("Impersonate-User") or []
    if not names:
        return user
    name = names[0]
    groups = tuple(headers.get_all("Impersonate-Group") or ())
    require = authorizer.require
    if name.startswith(SA_PREFIX) and name.count(":") == 3:
        _, _, ns, sa = name.split(":")
        require(Attributes(user, "impersonate", resource="serviceaccounts", namespace=ns, name=sa))
    else:
        require(Attributes(user, "impersonate", resource="users", name=name))
    for group in groups:
        require(Attributes(user, "impersonate", resource="groups", name=group))
    if name.startswith(SA_PREFIX) and not groups:
        ns = name.split(":")[2] if name.count(":") == 3 else ""
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{ns}")
    if name == ANONYMOUS_USER:
        return UserInfo(name, groups=groups or (UNAUTHENTICATED,))
    return UserInfo(name, groups=tuple(dict.fromkeys((*groups, AUTHENTICATED))))


def authorize(authorizer: AuthorizerChain, a: Attributes, audit: AuditAnnotations | None) -> None:
    """The authorization filter: kube-apiserver's 403 unless `a` is allowed, and the decision and its reason
    as the request's audit annotations."""
    verdict = authorizer.authorize(a)
    if audit is not None:
        audit.annotate("authorization.k8s.io/decision", "allow" if verdict.allowed else "forbid")
        audit.annotate("authorization.k8s.io/reason", verdict.reason)
    if not verdict.allowed:
        raise forbidden(a, verdict.reason)


def _field_equals(text: str | None) -> tuple[tuple[str, str], ...]:
    out = []
    for part in (text or "").split(","):
        if "!=" in part:
            continue
        name, sep, value = part.replace("==", "=").partition("=")
        if sep:
            out.append((name.strip(), value.strip()))
    return tuple(out)


def resource_attributes(user: UserInfo, method: str, rt: ResourceType, namespace: str, name: str | None,
                        subresource: str | None, query: dict[str, str]) -> Attributes:
    verb = request_verb(method, query, name is not None)
    selector = query.get("fieldSelector") if query else None
    return Attributes(user, verb, True, rt.group, rt.plural, subresource or "", namespace, name or "", "",
                      _field_equals(selector) if selector else ())


def path_attributes(user: UserInfo, method: str, path: str) -> Attributes:
    return Attributes(user, method.lower(), resource_request=False, path=path)
