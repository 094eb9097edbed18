"""The attributes every authorizer decides on, and kube-apiserver's 403 for a refusal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from controlplane import status as st
from controlplane.authn import UserInfo


class Decision(Enum):
    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


_WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_TRUE = ("true", "1", "True", "TRUE", "t", "T")  # Go's strconv.ParseBool, as kube-apiserver reads ?watch=


def request_verb(method: str, query: Mapping[str, str], named: bool) -> str:
    """A resource request's verb as kube-apiserver's RequestInfoFactory derives it (`named`: the path names an
    object)."""
    if method == "GET":
        return "watch" if query.get("watch") in _TRUE else ("get" if named else "list")
    if method == "DELETE" and not named:
        return "deletecollection"
    return _WRITE_VERBS.get(method, method.lower())


@dataclass(slots=True)
class Attributes:
    """authorizer.Attributes: a resource request (group, resource, subresource, namespace, name) or a
    non-resource request (path). Built for every request: slots and no freezing keep that cheap."""
    user: UserInfo
    verb: str
    resource_request: bool = True
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    # Equality requirements of the request's field selector (field, value), for the node authorizer.
    field_equals: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOW


ALLOW = Verdict(Decision.ALLOW)
NO_OPINION = Verdict(Decision.NO_OPINION)


def forbidden_message(attrs: Attributes) -> str:
    """responsewriters.forbiddenMessage's text."""
    user = attrs.user.name
    if not attrs.resource_request:
        return f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    if attrs.namespace:
        return (f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" '
                f'in the namespace "{attrs.namespace}"')
    return f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" at the cluster scope'


def forbidden(attrs: Attributes, reason: str) -> st.StatusError:
    """The 403 Status kube-apiserver writes (apierrors.NewForbidden with the authorizer's reason appended)."""
    message = forbidden_message(attrs)
    if reason:
        message = f"{message}: {reason}"
    if not attrs.resource_request:
        return st.StatusError(403, "Forbidden", f"forbidden: {message}", {})
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    details: dict[str, str] = {"kind": attrs.resource}
    if attrs.api_group:
        details["group"] = attrs.api_group
    if attrs.name:
        details = {"name": attrs.name, **details}
        return st.StatusError(403, "Forbidden", f'{qualified} "{attrs.name}" is forbidden: {message}', details)
    return st.StatusError(403, "Forbidden", f"{qualified} is forbidden: {message}", details)
