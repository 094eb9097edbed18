"""pods/exec, pods/attach and pods/portforward over WebSocket (a GET) need `create` as well as `get`, as
kube-apiserver 1.35+ authorizes them (AuthorizePodWebsocketUpgradeCreatePermission): a role granting only get
cannot open a session, one granting both reaches the node (here: no kubelet, so the node's absence is the answer)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from controlplane import EmbeddedApiServer
from tests.test_apiserver_auth import Client, _account, _apply, _rbac, _token, admin, srv  # noqa: F401

WS_HEADERS = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def _get(c: Client, path: str, protocol: str) -> tuple[int, Any]:
    req = urllib.request.Request(c.url + path, headers={**WS_HEADERS, "Sec-WebSocket-Protocol": protocol,
                                                       "Authorization": f"Bearer {c.token}"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("sub,query,protocol", [("exec", "?command=true", "v5.channel.k8s.io"),
                                                ("attach", "?stdout=true", "v5.channel.k8s.io"),
                                                ("portforward", "", "SPDY/3.1+portforward.k8s.io")])
def test_a_websocket_session_needs_create_beside_get(srv: EmbeddedApiServer, sub: str, query: str,  # noqa: F811
                                                      protocol: str) -> None:
    c = admin(srv)
    code, body = c.call("POST", "/api/v1/namespaces/default/pods", {"metadata": {"name": "web"}, "spec": {
        "nodeName": "absent", "containers": [{"name": "main", "image": "busybox"}]}})
    assert code == 201, body
    _account(c, "default", "viewer")
    _apply(c, _rbac("viewer", [{"apiGroups": [""], "resources": ["pods", f"pods/{sub}"], "verbs": ["get"]}]))
    viewer = Client(srv.url, _token(c, "default", "viewer"))
    code, body = _get(viewer, f"/api/v1/namespaces/default/pods/web/{sub}{query}", protocol)
    assert code == 403, body
    assert body["message"] == (f'pods "web" is forbidden: User "system:serviceaccount:default:viewer" cannot create '
                               f'resource "pods/{sub}" in API group "" in the namespace "default"')
    _account(c, "default", "operator")
    _apply(c, _rbac("operator", [{"apiGroups": [""], "resources": [f"pods/{sub}"], "verbs": ["get", "create"]}]))
    operator = Client(srv.url, _token(c, "default", "operator"))
    code, body = _get(operator, f"/api/v1/namespaces/default/pods/web/{sub}{query}", protocol)
    assert code == 404 and body["message"] == 'nodes "absent" not found', body
