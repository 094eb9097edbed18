"""KubeApi's requests on the official ApiClient's pool: configuration (headers, auth), query encoding, bodies with
values JSON lacks, errors and streams behave as through the generated client's path."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpudra.kubeapi import Invalid, KubeApi, NotFound


def test_auth_and_default_headers_come_from_the_client_configuration(apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib3

    from gpudra import http1

    api = KubeApi.connect(url=apiserver.url)
    try:
        token = apiserver.server.admin_token  # the server checks tokens: a made-up one is 401
        api.client.configuration.api_key["BearerToken"] = token
        api.client.configuration.api_key_prefix["BearerToken"] = "Bearer"
        api.client.default_headers["X-Test"] = "yes"
        sent: list[bytes] = []
        pools: list[Any] = []
        exchange, get_conn = http1.exchange, urllib3.HTTPConnectionPool._get_conn

        def spy_exchange(sock: Any, request: bytes, **kwargs: Any) -> Any:
            sent.append(request)
            return exchange(sock, request, **kwargs)

        def spy_get_conn(self: Any, *args: Any, **kwargs: Any) -> Any:
            pools.append(self)
            return get_conn(self, *args, **kwargs)

        monkeypatch.setattr(http1, "exchange", spy_exchange)
        monkeypatch.setattr(urllib3.HTTPConnectionPool, "_get_conn", spy_get_conn)
        api.list("Node", label_selector="a in (x,y)")
        request_line, *header_lines = sent[0].decode("latin-1").split("\r\n\r\n")[0].split("\r\n")
        headers = dict(line.split(": ", 1) for line in header_lines)
        assert headers["authorization"] == f"Bearer {token}"
        assert headers["X-Test"] == "yes" and headers["User-Agent"] == api.client.user_agent
        assert request_line == "GET /api/v1/nodes?labelSelector=a+in+%28x%2Cy%29 HTTP/1.1"
        assert headers["Host"] == apiserver.url.split("//", 1)[1]
        # The connection is the ApiClient's own, from the pool its PoolManager holds for the host.
        assert pools == [api.client.rest_client.pool_manager.connection_from_url(apiserver.url)]
    finally:
        api.close()


def test_a_closed_pool_is_taken_again_from_the_client(apiserver: Any) -> None:
    api = KubeApi.connect(url=apiserver.url)
    try:
        api.list("Node")
        api.client.rest_client.pool_manager.clear()  # closes every pool it holds
        assert api.list("Node")[0] == []
    finally:
        api.close()


def test_yaml_timestamps_in_bodies_are_sent_as_rfc3339(apiserver: Any) -> None:
    api = apiserver.api
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    event = {"metadata": {"name": "e1", "namespace": "default"}, "involvedObject": {"kind": "Pod", "name": "p"},
             "reason": "Test", "message": "m", "type": "Normal", "firstTimestamp": when}
    created = api.create("Event", event, namespace="default")
    assert created["firstTimestamp"].startswith("2026-01-02T03:04:05")


def test_errors_and_streams(apiserver: Any) -> None:
    api = apiserver.api
    with pytest.raises(NotFound):
        api.get("Node", "missing")
    with pytest.raises(Invalid):
        api.create("Node", {"metadata": {"name": "Not_A_Valid_Name"}})
    api.create("Node", {"metadata": {"name": "n1"}})
    stream = api.watch("Node")
    kind, obj = next(stream)
    assert (kind, obj["metadata"]["name"]) == ("ADDED", "n1")
    stream.close()


def test_behind_a_proxy_requests_go_through_the_clients_proxy_manager() -> None:
    """With `proxy` configured, KubeApi keeps using the ApiClient's ProxyManager (absolute-URI requests to the
    proxy), for whole responses and errors alike."""
    import socket
    import threading

    from kubernetes import client as k8s_client

    from gpudra.kubeapi import NotFound

    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def proxy() -> None:
        for body, status in ((b'{"kind": "NodeList", "items": [], "metadata": {"resourceVersion": "7"}}', "200 OK"),
                             (b'{"kind": "Status", "reason": "NotFound", "message": "nodes \\"x\\" not found", "code": 404}',
                              "404 Not Found")):
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as rfile:
                seen.append(rfile.readline().decode().strip())
                while rfile.readline() not in (b"\r\n", b""):
                    pass
                conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                             "Connection: close\r\n\r\n".encode() + body)

    threading.Thread(target=proxy, daemon=True).start()
    cfg = k8s_client.Configuration()
    cfg.host = "http://api.example:6443"
    cfg.proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
    api = KubeApi(k8s_client.ApiClient(cfg))
    try:
        assert api.list("Node") == ([], "7")
        with pytest.raises(NotFound, match='nodes "x" not found'):
            api.get("Node", "x")
        assert seen == ["GET http://api.example:6443/api/v1/nodes HTTP/1.1",
                        "GET http://api.example:6443/api/v1/nodes/x HTTP/1.1"]
    finally:
        api.close()
        listener.close()
