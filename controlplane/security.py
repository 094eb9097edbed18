"""The server's authentication, authorization and admission stages, built over its store: what the request
handler runs before the registry (kube-apiserver's filter chain, then its admission chain)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane import status as st
from controlplane.admission.adminaccess import AdminAccessPlugin
from controlplane.admission.chain import AdmissionChain
from controlplane.admission.claimstatus import ClaimStatusPlugin
from controlplane.admission.noderestriction import NodeRestrictionPlugin
from controlplane.admission.disruptionbudget import DisruptionBudgetPlugin
from controlplane.admission.podspec import PodSpecPlugin
from controlplane.admission.policy import Expressions, PolicyPlugin
from controlplane.admission.webhook import MutatingWebhookPlugin, WebhookPlugin
from controlplane.authn import TokenAuthenticator
from controlplane.authz.bootstrap import bootstrap_policy
from controlplane.authz.chain import AuthorizerChain
from controlplane.authz.node import NodeAuthorizer
from controlplane.authz.rbac import RbacAuthorizer
from controlplane.resources import Registry, ResourceType
from controlplane.store import Filter, Store
from controlplane.tls import ClientIdentities
from gpudra.features import Features


@dataclass
class Security:
    authenticator: TokenAuthenticator
    authorizer: AuthorizerChain
    rbac: RbacAuthorizer
    admission: AdmissionChain
    webhooks: WebhookPlugin
    mutating_webhooks: MutatingWebhookPlugin
    accounts: AccountLookup
    # kube-apiserver's old insecure port: a request with no credentials is the admin (tests and library use);
    # every program (apiserver, demo, cluster) runs with it off, where such a request is system:anonymous.
    unauthenticated_as_admin: bool
    # AuthorizePodWebsocketUpgradeCreatePermission: connecting to a pod needs `create` whatever the method.
    connect_requires_create: bool = False
    # The verified client certificates of the connections the TLS front relays (controlplane.tls).
    client_identities: ClientIdentities = field(default_factory=ClientIdentities)


def _types(registry: Registry, *kinds: str) -> list[ResourceType]:
    out = []
    for kind in kinds:
        rt = registry.by_kind(kind)
        if rt is not None:
            out.append(rt)
    return out


def build_security(store: Store, registry: Registry, features: Features, *,
                   expressions: Expressions | None = None, unauthenticated_as_admin: bool = True,
                   token_key: bytes | None = None, admin_token: str | None = None) -> Security:

    def lister(*kinds: str) -> Any:
        rts = tuple(_types(registry, *kinds))
        counter = store.change_counter(rts)

        def version() -> int:
            return counter.value

        def load() -> tuple[Any, ...]:
            return (version(), *(store.list(Filter(rt))[0] for rt in rts))
        return version, load

    def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        rt = registry.by_kind(kind)
        if rt is None:
            return None
        try:
            return store.get(rt, namespace if rt.namespaced else "", name)
        except st.StatusError:
            return None

    def list_all(kind: str) -> list[dict[str, Any]]:
        rt = registry.by_kind(kind)
        return store.list(Filter(rt))[0] if rt is not None else []

    def namespace(name: str) -> dict[str, Any] | None:
        return get("Namespace", "", name) if name else None

    def params(api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        rt = registry.by_kind(kind)
        if rt is None or rt.group != api_version.rpartition("/")[0]:
            return None
        return get(kind, ns, name)

    rbac_version, rbac_load = lister("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    rbac = RbacAuthorizer(rbac_version, rbac_load)
    authorizer = AuthorizerChain([NodeAuthorizer(get, list_all), rbac])
    plugins: list[Any] = [NodeRestrictionPlugin(), AdminAccessPlugin(namespace, features.admin_access),
                          ClaimStatusPlugin(features.granular_status_authorization),
                          PodSpecPlugin(), DisruptionBudgetPlugin()]
    if expressions is not None:
        vap_version, vap_load = lister("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        plugins.append(PolicyPlugin(expressions, vap_version, vap_load, namespace, params))
    hook_version, hook_load = lister("ValidatingWebhookConfiguration")
    webhooks = WebhookPlugin(hook_version, hook_load, namespace, expressions)
    plugins.append(webhooks)
    mutating_version, mutating_load = lister("MutatingWebhookConfiguration")
    mutating = MutatingWebhookPlugin(mutating_version, mutating_load, namespace, expressions)
    return Security(TokenAuthenticator(token_key, admin_token), authorizer, rbac,
                    AdmissionChain(plugins, [mutating]), webhooks, mutating, AccountLookup(store, registry),
                    unauthenticated_as_admin, features.pod_websocket_create_permission)


def ensure_bootstrap_policy(store: Store, registry: Registry) -> None:
    """Store kube-apiserver's bootstrap roles and bindings that are absent (an applied change is kept)."""
    for obj in bootstrap_policy():
        rt = registry.by_kind(obj["kind"])
        assert rt is not None
        try:
            store.get(rt, "", obj["metadata"]["name"])
        except st.StatusError:
            store.create(rt, "", obj)


def ensure_default_account(store: Store, registry: Registry, namespace: str) -> None:
    """kube-controller-manager's serviceaccount controller: every namespace has a `default` ServiceAccount."""
    rt = registry.by_kind("ServiceAccount")
    if rt is None:
        return
    try:
        store.get(rt, namespace, "default")
    except st.StatusError as err:
        if err.code != 404:
            raise
        try:
            store.create(rt, namespace, {"metadata": {"name": "default", "namespace": namespace}})
        except st.StatusError:
            pass  # created meanwhile, or the namespace is terminating


class AccountLookup:
    """ServiceAccount uids by (namespace, name) for the token authenticator, looked up again only after a
    ServiceAccount changed (every authenticated request asks)."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self._store = store
        self._rt = registry.by_kind("ServiceAccount")
        self._changes = store.change_counter((self._rt,)) if self._rt is not None else None
        self._version = -1
        self._uids: dict[tuple[str, str], str | None] = {}

    def __call__(self, namespace: str, name: str) -> str | None:
        if self._rt is None or self._changes is None:
            return None
        version = self._changes.value
        if version != self._version:
            self._uids, self._version = {}, version
        key = (namespace, name)
        if key in self._uids:
            return self._uids[key]
        try:
            uid: str | None = str(self._store.get(self._rt, namespace, name)["metadata"]["uid"])
        except st.StatusError:
            uid = None
        self._uids[key] = uid
        return uid

