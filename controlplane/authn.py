"""Authentication, the first stage of the chain: who sent a request.

As kube-apiserver with `--anonymous-auth=true`, a token authenticator and the ServiceAccount token authenticator:
- a bearer token that no authenticator accepts is 401 (it is never downgraded to anonymous);
- no credentials at all is `system:anonymous` in `system:unauthenticated`;
- ServiceAccount tokens are signed JWTs (HS256 here: the server both issues and checks them, so one secret key
  serves as kube-apiserver's signing key pair), bound to the account's uid: a token of a deleted (or deleted
  and re-created) account is refused, as the legacy-token and bound-token lookups refuse it;
- the person's token is `kubernetes-admin` in `system:masters` (kubeadm's admin.conf identity), and kubelets
  carry node tokens for `system:node:<name>` in `system:nodes` (what their client certificates say on a cluster);
- a client certificate the client CA verified (controlplane.tls) comes first, as kube-apiserver's x509
  authenticator precedes the token ones: its CN is the user and each O a group.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ISSUER = "https://kubernetes.default.svc.cluster.local"
API_AUDIENCE = ISSUER
SA_PREFIX = "system:serviceaccount:"
NODE_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
MASTERS_GROUP = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS_USER = "system:anonymous"
ADMIN_USER = "kubernetes-admin"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
# userInfo.extra keys of bound ServiceAccount tokens (k8s.io/apiserver/pkg/authentication/serviceaccount).
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"
EXTRA_NODE_UID = "authentication.kubernetes.io/node-uid"
EXTRA_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
# kube-apiserver's default --service-account-max-token-expiration is unset; TokenRequest defaults to 1 h and
# refuses less than 10 min.
DEFAULT_TOKEN_SECONDS = 3600
MIN_TOKEN_SECONDS = 600


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_api(self) -> dict[str, Any]:
        """authentication.k8s.io/v1 UserInfo (SelfSubjectReview, AdmissionReview)."""
        out: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out

    @property
    def node_name(self) -> str | None:
        """The node of a kubelet identity (`system:node:<name>` in `system:nodes`), as nodeidentifier reads it."""
        if NODES_GROUP in self.groups and self.name.startswith(NODE_PREFIX):
            return self.name[len(NODE_PREFIX):]
        return None


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED,))


class Unauthorized(Exception):
    """A credential was presented and refused: 401."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class BoundObject:
    """What a TokenRequest binds its token to besides the account (a Pod, a Secret or a Node)."""
    kind: str
    name: str
    uid: str


# (namespace, name) -> the ServiceAccount's uid, or None when it does not exist.
AccountLookup = Callable[[str, str], "str | None"]


class TokenAuthenticator:
    """Issues and checks the server's tokens. `key` signs them; keep it to keep tokens valid across restarts.
    The admin's token is derived from the key too (unless given), so the person's kubeconfig and every
    component holding the admin credential stay valid when the server restarts with the same key."""

    def __init__(self, key: bytes | None = None, admin_token: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = key or secrets.token_bytes(32)
        self.admin_token = admin_token or _b64(hmac.new(self._key, b"admin-token:" + ADMIN_USER.encode(),
                                                        hashlib.sha256).digest())
        self._clock = clock
        # Verified tokens (signature and claims checked once); the account is still looked up every request.
        self._verified: dict[str, tuple[UserInfo, float, tuple[str, str, str] | None]] = {}

    # ----- issuing -------------------------------------------------------------------------------------------

    def _sign(self, claims: dict[str, Any]) -> str:
        header = _b64(json.dumps({"alg": "HS256", "kid": self._key_id(), "typ": "JWT"},
                                 separators=(",", ":")).encode())
        payload = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        signature = hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(signature)}"

    def _key_id(self) -> str:
        return _b64(hashlib.sha256(self._key).digest()[:16])

    def service_account_token(self, namespace: str, name: str, account_uid: str, *,
                              expiration_seconds: int = DEFAULT_TOKEN_SECONDS,
                              audiences: list[str] | None = None, bound: BoundObject | None = None,
                              node: BoundObject | None = None) -> tuple[str, int]:
        """A bound ServiceAccount token (TokenRequest) and its expiry (unix seconds)."""
        now = int(self._clock())
        exp = now + expiration_seconds
        k8s: dict[str, Any] = {"namespace": namespace, "serviceaccount": {"name": name, "uid": account_uid}}
        if bound is not None:
            k8s[bound.kind.lower()] = {"name": bound.name, "uid": bound.uid}
        if node is not None:
            k8s["node"] = {"name": node.name, "uid": node.uid}
        claims = {"iss": ISSUER, "sub": f"{SA_PREFIX}{namespace}:{name}", "aud": audiences or [API_AUDIENCE],
                  "iat": now, "nbf": now, "exp": exp, "jti": str(uuid.uuid4()), "kubernetes.io": k8s}
        return self._sign(claims), exp

    def node_token(self, node: str) -> str:
        """The credential a kubelet simulator presents: `system:node:<node>` in `system:nodes`."""
        return self._sign({"iss": ISSUER, "sub": NODE_PREFIX + node, "gpu-dra/kind": "node"})

    def kubelet_client_token(self) -> str:
        """What the server presents to kubelets when it relays pods/exec, attach and portforward (kube-apiserver's
        --kubelet-client-certificate, `kube-apiserver-kubelet-client` on kubeadm clusters). It authenticates
        nothing on the server itself."""
        return self._sign({"iss": ISSUER, "sub": KUBELET_CLIENT_USER, "gpu-dra/kind": "kubelet-client"})

    def is_kubelet_client(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries this server's kubelet client credential (a kubelet's check,
        with the key as its trust anchor, as a kubelet checks client certificates against its --client-ca-file)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.kubelet_client_token())

    # ----- checking ------------------------------------------------------------------------------------------

    def authenticate(self, authorization: str | None, accounts: AccountLookup) -> UserInfo:
        """The request's user from its Authorization header; Unauthorized when a credential is refused."""
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("unsupported Authorization scheme")
        if hmac.compare_digest(token, self.admin_token):
            return ADMIN
        cached = self._verified.get(token)
        if cached is None:
            cached = self._verify(token)
            if len(self._verified) > 10000:
                self._verified.clear()
            self._verified[token] = cached
        user, exp, account = cached
        if exp and self._clock() >= exp:
            self._verified.pop(token, None)
            raise Unauthorized("token has expired")
        if account is not None:
            namespace, name, uid = account
            if accounts(namespace, name) != uid:
                raise Unauthorized(f"service account {namespace}/{name} has been deleted")
        return user

    def _verify(self, token: str) -> tuple[UserInfo, float, tuple[str, str, str] | None]:
        parts = token.split(".")
        if len(parts) != 3:
            raise Unauthorized("invalid bearer token")
        try:
            expected = hmac.new(self._key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
            if not hmac.compare_digest(expected, _unb64(parts[2])):
                raise Unauthorized("invalid bearer token")
            claims = json.loads(_unb64(parts[1]))
        except (ValueError, TypeError) as exc:
            raise Unauthorized("invalid bearer token") from exc
        if not isinstance(claims, dict) or claims.get("iss") != ISSUER:
            raise Unauthorized("invalid bearer token")
        sub = str(claims.get("sub") or "")
        if claims.get("gpu-dra/kind") == "node" and sub.startswith(NODE_PREFIX):
            return UserInfo(sub, groups=(NODES_GROUP, AUTHENTICATED)), 0.0, None
        k8s = claims.get("kubernetes.io") or {}
        aud = claims.get("aud") or []
        if not sub.startswith(SA_PREFIX) or not isinstance(k8s, dict) or API_AUDIENCE not in aud:
            raise Unauthorized("invalid bearer token")
        namespace = str(k8s.get("namespace") or "")
        account = k8s.get("serviceaccount") or {}
        name, uid = str(account.get("name") or ""), str(account.get("uid") or "")
        if sub != f"{SA_PREFIX}{namespace}:{name}":
            raise Unauthorized("invalid bearer token")
        extra: dict[str, tuple[str, ...]] = {EXTRA_CREDENTIAL_ID: (f"JTI={claims.get('jti')}",)}
        for kind, name_key, uid_key in (("pod", EXTRA_POD_NAME, EXTRA_POD_UID),
                                        ("node", EXTRA_NODE_NAME, EXTRA_NODE_UID)):
            ref = k8s.get(kind)
            if isinstance(ref, dict):
                extra[name_key] = (str(ref.get("name") or ""),)
                extra[uid_key] = (str(ref.get("uid") or ""),)
        user = UserInfo(sub, uid=uid, groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                              AUTHENTICATED), extra=extra)
        return user, float(claims.get("exp") or 0), (namespace, name, uid)


ADMIN = UserInfo(ADMIN_USER, groups=(MASTERS_GROUP, AUTHENTICATED))


def certificate_user(common_name: str, organizations: tuple[str, ...]) -> UserInfo:
    """The user of a verified client certificate (x509's CommonNameUserConversion, then the authenticated
    group every authenticated user is in)."""
    return UserInfo(common_name, groups=tuple(dict.fromkeys((*organizations, AUTHENTICATED))))
