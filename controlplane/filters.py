"""The request side of the filter chain: who is asking (authentication, 401) and what they ask for, as
authorization attributes (kube-apiserver's RequestInfo: verb from the method, list/watch/get from the path and
query)."""

from __future__ import annotations

from controlplane import status as st
from controlplane.authn import ADMIN, TokenAuthenticator, Unauthorized, UserInfo
from controlplane.authz.attributes import Attributes
from controlplane.resources import ResourceType

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
UNAUTHORIZED = st.StatusError(401, "Unauthorized", "Unauthorized")


def authenticate(authorization: str | None, tokens: TokenAuthenticator, accounts: object,
                 unauthenticated_as_admin: bool) -> UserInfo:
    """The user of a request; 401 when it presents a credential that is refused."""
    if not authorization and unauthenticated_as_admin:
        return ADMIN
    try:
        return tokens.authenticate(authorization, accounts)  # type: ignore[arg-type]
    except Unauthorized:
        raise UNAUTHORIZED from None


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
    if method == "GET":
        watch = query.get("watch") in ("true", "1", "True", "TRUE", "t", "T")
        verb = "watch" if watch else ("get" if name is not None else "list")
    elif method == "DELETE" and name is None:
        verb = "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    return Attributes(user, verb, api_group=rt.group, resource=rt.plural, subresource=subresource or "",
                      namespace=namespace, name=name or "", field_equals=_field_equals(query.get("fieldSelector")))


def path_attributes(user: UserInfo, method: str, path: str) -> Attributes:
    return Attributes(user, method.lower(), resource_request=False, path=path)
