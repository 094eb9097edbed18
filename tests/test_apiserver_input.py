"""Hostile and malformed requests get kube-apiserver's status codes with a Status body, never a 500 or a hang."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import RESOURCE_BETAS
from controlplane import EmbeddedApiServer

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _addr(srv: EmbeddedApiServer) -> tuple[str, int]:
    u = urlsplit(srv.url)
    assert u.hostname and u.port
    return u.hostname, u.port


def _call(srv: EmbeddedApiServer, method: str, path: str, body: Any = None, raw: bytes | None = None,
          content_type: str = "application/json") -> tuple[int, Any, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(*_addr(srv), timeout=30)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": content_type})
    resp = conn.getresponse()
    text = resp.read()
    conn.close()
    return resp.status, json.loads(text) if text else None, resp


def _raw(srv: EmbeddedApiServer, request: bytes, timeout: float = 30) -> bytes:
    """Send raw bytes, half-close, and read the whole answer."""
    with socket.create_connection(_addr(srv), timeout=timeout) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _status_of(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _lease(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
            "spec": {"holderIdentity": "a"}, **extra}


def _assert_status(body: Any, code: int) -> None:
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == code


def test_nan_and_infinity_are_400_and_nothing_is_stored(server: EmbeddedApiServer) -> None:
    for token in (b"NaN", b"Infinity", b"-Infinity"):
        raw = b'{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n"},"data":{"k":' + token + b"}}"
        code, body, _ = _call(server, "POST", LEASES, raw=raw)
        assert code == 400, token
        _assert_status(body, 400)
    code, listed, _ = _call(server, "GET", LEASES)
    assert code == 200 and listed["items"] == []


def test_body_over_3_mib_is_413(server: EmbeddedApiServer) -> None:
    big = json.dumps(_lease("big", metadata={"name": "big", "annotations": {"a": "x" * (3 * 1024 * 1024)}})).encode()
    code, body, _ = _call(server, "POST", LEASES, raw=big)
    assert code == 413
    _assert_status(body, 413)
    assert body["reason"] == "RequestEntityTooLarge" and "limit is 3145728" in body["message"]


def test_a_60_mb_body_is_413_and_the_client_reads_the_answer(server: EmbeddedApiServer) -> None:
    big = b'{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"huge"},"data":"' + \
        b"x" * (60 * 1024 * 1024) + b'"}'
    code, body, _ = _call(server, "POST", LEASES, raw=big)
    assert code == 413 and body["reason"] == "RequestEntityTooLarge"
    assert _call(server, "GET", f"{LEASES}/huge")[0] == 404


def test_object_over_etcd_limit_is_413_and_not_stored(server: EmbeddedApiServer) -> None:
    # (annotations that large are refused by validation first: a big spec field reaches storage)
    obj = _lease("large", spec={"holderIdentity": "x" * (2 * 1024 * 1024)})
    code, body, _ = _call(server, "POST", LEASES, obj)
    assert code == 413
    assert body["reason"] == "RequestEntityTooLarge" and "request is too large" in body["message"]
    assert _call(server, "GET", f"{LEASES}/large")[0] == 404
    # An update growing an object past the limit is refused the same way and leaves it unchanged.
    assert _call(server, "POST", LEASES, _lease("grows"))[0] == 201
    code, _, _ = _call(server, "PUT", f"{LEASES}/grows", obj | {"metadata": {"name": "grows"}})
    assert code == 413
    assert _call(server, "GET", f"{LEASES}/grows")[1]["spec"]["holderIdentity"] == "a"


def test_deep_nesting_is_400_not_500(server: EmbeddedApiServer) -> None:
    for depth in (300, 100_000):
        raw = b'{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"d"},"x":' + \
            b"[" * depth + b"]" * depth + b"}"
        code, body, _ = _call(server, "POST", LEASES, raw=raw)
        assert code == 400 and "max depth" in body["message"], depth


def test_field_validation_strict_warn_ignore(server: EmbeddedApiServer) -> None:
    raw = (b'{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"f","bogus":1},'
           b'"spec":{"holderIdentity":"a","holderIdentity":"b","extra":{"k":1}},"data":{"k":"v"}}')
    code, body, _ = _call(server, "POST", LEASES + "?fieldValidation=Strict", raw=raw)
    assert code == 400
    assert body["message"] == ('Lease in version "v1" cannot be handled as a Lease: strict decoding error: '
                               'unknown field "metadata.bogus", unknown field "spec.extra", unknown field "data", '
                               'duplicate field "spec.holderIdentity"')
    assert _call(server, "GET", f"{LEASES}/f")[0] == 404

    code, obj, resp = _call(server, "POST", LEASES, raw=raw)  # Warn is the default
    assert code == 201
    warnings = resp.headers.get_all("Warning") or []
    assert 'Warning' not in obj and warnings == [
        '299 - "unknown field \\"metadata.bogus\\""', '299 - "unknown field \\"spec.extra\\""',
        '299 - "unknown field \\"data\\""', '299 - "duplicate field \\"spec.holderIdentity\\""']
    assert "data" not in obj and "bogus" not in obj["metadata"] and obj["spec"] == {"holderIdentity": "b"}
    stored = _call(server, "GET", f"{LEASES}/f")[1]
    assert "data" not in stored and stored["spec"] == {"holderIdentity": "b"}

    raw2 = raw.replace(b'"name":"f"', b'"name":"g"')
    code, obj, resp = _call(server, "POST", LEASES + "?fieldValidation=Ignore", raw=raw2)
    assert code == 201 and resp.headers.get("Warning") is None and "data" not in obj

    # Unknown fields arriving by patch are treated the same way.
    code, body, _ = _call(server, "PATCH", f"{LEASES}/g?fieldValidation=Strict", {"spec": {"nope": 1}},
                          content_type="application/merge-patch+json")
    assert code == 400 and 'unknown field "spec.nope"' in body["message"]
    code, obj, resp = _call(server, "PATCH", f"{LEASES}/g", {"spec": {"nope": 1}},
                            content_type="application/merge-patch+json")
    assert code == 200 and "nope" not in obj["spec"] and "spec.nope" in (resp.headers.get("Warning") or "")

    code, body, _ = _call(server, "POST", LEASES + "?fieldValidation=Sometimes", _lease("h"))
    assert code == 400 and "fieldValidation" in body["message"]


def test_unknown_fields_deep_in_a_dra_object_are_dropped(server: EmbeddedApiServer) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                            "colour": "red"}}],
                                  "config": [{"opaque": {"driver": "gpu.nvidia.com",
                                                         "parameters": {"anything": {"goes": 1}}}}]}}}
    code, body, _ = _call(server, "POST", CLAIMS + "?fieldValidation=Strict", claim)
    assert code == 400 and body["message"].endswith('unknown field "spec.devices.requests[0].exactly.colour"')
    code, obj, _ = _call(server, "POST", CLAIMS, claim)
    assert code == 201
    exactly = obj["spec"]["devices"]["requests"][0]["exactly"]
    assert "colour" not in exactly and exactly["deviceClassName"] == "gpu.nvidia.com"
    # Opaque driver parameters are free-form (RawExtension): kept as sent.
    assert obj["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {"anything": {"goes": 1}}


def test_values_of_the_wrong_type_are_400_in_every_mode(server: EmbeddedApiServer) -> None:
    for mode in ("Strict", "Warn", "Ignore"):
        code, body, _ = _call(server, "POST", f"{LEASES}?fieldValidation={mode}",
                              _lease("t", spec={"leaseDurationSeconds": "15"}))
        assert code == 400 and body["message"] == (
            'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal string into Go struct field '
            "LeaseSpec.spec.leaseDurationSeconds of type int64")
    code, body, _ = _call(server, "POST", LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                   "metadata": "t"})
    assert code == 400 and "Lease.metadata of type ObjectMeta" in body["message"]
    # Quantities may be JSON numbers, as Kubernetes accepts them.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"},
           "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": 1}}}]}}
    assert _call(server, "POST", "/api/v1/namespaces/default/pods", pod)[0] == 201


def test_dry_run_checks_everything_and_stores_nothing(server: EmbeddedApiServer) -> None:
    code, obj, _ = _call(server, "POST", f"{LEASES}?dryRun=All", _lease("dry"))
    assert code == 201 and obj["metadata"]["name"] == "dry" and "resourceVersion" not in obj["metadata"]
    assert _call(server, "GET", f"{LEASES}/dry")[0] == 404
    assert _call(server, "POST", f"{LEASES}?dryRun=All&fieldValidation=Strict", _lease("dry", data=1))[0] == 400
    code, obj, _ = _call(server, "POST", LEASES, _lease("real"))
    rv = obj["metadata"]["resourceVersion"]
    code, upd, _ = _call(server, "PUT", f"{LEASES}/real?dryRun=All", _lease("real") | {"spec": {"holderIdentity": "z"}})
    assert code == 200 and upd["spec"]["holderIdentity"] == "z" and upd["metadata"]["resourceVersion"] == rv
    assert _call(server, "DELETE", f"{LEASES}/real?dryRun=All")[0] == 200
    code, now, _ = _call(server, "GET", f"{LEASES}/real")
    assert code == 200 and now["spec"]["holderIdentity"] == "a" and now["metadata"]["resourceVersion"] == rv
    assert _call(server, "DELETE", "/api/v1/namespaces/default?dryRun=All")[0] in (403, 200)
    assert _call(server, "POST", f"{LEASES}?dryRun=Some", _lease("x"))[0] == 400


def test_malformed_delete_options_and_nameless_updates_are_400(server: EmbeddedApiServer) -> None:
    assert _call(server, "POST", LEASES, _lease("del"))[0] == 201
    for raw in (b'{"preconditions":"x"}', b"[]", b'{"gracePeriodSeconds":"soon"}', b"{not json"):
        code, body, _ = _call(server, "DELETE", f"{LEASES}/del", raw=raw)
        assert code == 400, raw
        _assert_status(body, 400)
    code, body, _ = _call(server, "PUT", f"{LEASES}/del", raw=b'{"metadata":null}')
    assert code == 400 and "does not match the name on the URL" in body["message"]
    assert _call(server, "GET", f"{LEASES}/del")[0] == 200


@pytest.mark.apiserver_options(runtime_config=RESOURCE_BETAS)
def test_fields_of_an_older_served_version_are_checked_in_that_version(server: EmbeddedApiServer) -> None:
    url = "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims"
    claim = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "old"},
             "spec": {"devices": {"requests": [{"name": "r", "deviceClassName": "c", "bogus": 1}]}}}
    code, body, _ = _call(server, "POST", f"{url}?fieldValidation=Strict", claim)
    assert code == 400 and body["message"] == (
        'ResourceClaim in version "v1beta1" cannot be handled as a ResourceClaim: strict decoding error: '
        'unknown field "spec.devices.requests[0].bogus"')
    code, obj, resp = _call(server, "POST", url, claim)
    assert code == 201 and "bogus" not in json.dumps(obj)
    assert 'unknown field \\"spec.devices.requests[0].bogus\\"' in (resp.headers.get("Warning") or "")


def test_kind_or_api_version_not_matching_the_url_is_400(server: EmbeddedApiServer) -> None:
    code, body, _ = _call(server, "POST", LEASES, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    assert code == 400 and "does not match the expected API version (coordination.k8s.io/v1)" in body["message"]
    code, body, _ = _call(server, "POST", LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Pod",
                                                   "metadata": {"name": "p"}})
    assert code == 400 and "kind in the data (Pod)" in body["message"]
    assert _call(server, "POST", LEASES, _lease("ok"))[0] == 201
    code, body, _ = _call(server, "PUT", f"{LEASES}/ok", {"apiVersion": "v1", "kind": "Lease",
                                                          "metadata": {"name": "ok"}})
    assert code == 400


def test_immutable_metadata_on_update(server: EmbeddedApiServer) -> None:
    code, obj, _ = _call(server, "POST", LEASES, _lease("m"))
    assert code == 201
    changed = json.loads(json.dumps(obj))
    changed["metadata"]["uid"] = "00000000-0000-4000-8000-000000000000"
    code, body, _ = _call(server, "PUT", f"{LEASES}/m", changed)
    assert code == 422 and "metadata.uid" in body["message"] and "field is immutable" in body["message"]
    # creationTimestamp is silently kept, as kube-apiserver's update strategy does.
    changed = json.loads(json.dumps(obj))
    changed["metadata"]["creationTimestamp"] = "2000-01-01T00:00:00Z"
    changed["spec"]["holderIdentity"] = "b"
    code, updated, _ = _call(server, "PUT", f"{LEASES}/m", changed)
    assert code == 200 and updated["metadata"]["creationTimestamp"] == obj["metadata"]["creationTimestamp"]
    # An omitted uid keeps the stored one.
    del changed["metadata"]["uid"]
    del changed["metadata"]["resourceVersion"]
    code, updated, _ = _call(server, "PUT", f"{LEASES}/m", changed)
    assert code == 200 and updated["metadata"]["uid"] == obj["metadata"]["uid"]
    changed["metadata"]["name"] = "other"
    assert _call(server, "PUT", f"{LEASES}/m", changed)[0] == 400


@pytest.mark.parametrize("query", [
    "watch=true&timeoutSeconds=abc", "timeoutSeconds=abc", "limit=abc", "limit=-1", "resourceVersion=abc",
    "watch=true&resourceVersion=abc", "watch=maybe", "watch=true&allowWatchBookmarks=perhaps",
    "watch=true&timeoutSeconds=99999999999999999999999",
])
def test_bad_query_parameters_are_400(server: EmbeddedApiServer, query: str) -> None:
    code, body, _ = _call(server, "GET", f"{LEASES}?{query}")
    assert code == 400
    _assert_status(body, 400)


@pytest.mark.parametrize("length", [b"abc", b"-5", b"1e3", b"0x10"])
def test_bad_content_length_is_400_without_hanging(server: EmbeddedApiServer, length: bytes) -> None:
    answer = _raw(server, b"POST " + LEASES.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + length + b"\r\n\r\n{}", timeout=20)
    code, body = _status_of(answer)
    assert code == 400 and "Content-Length" in body["message"]


@pytest.mark.parametrize("request_bytes,code", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /api HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"GET /api HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
    (b"BREW /api HTTP/1.1\r\n\r\n", 501),
    (b"GET /api HTTP/9.9\r\n\r\n", 505),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
])
def test_protocol_errors_get_a_status_body(server: EmbeddedApiServer, request_bytes: bytes, code: int) -> None:
    got, body = _status_of(_raw(server, request_bytes))
    assert got == code and body["kind"] == "Status" and body["code"] == code


def test_truncated_body_times_out_and_frees_the_worker(server: EmbeddedApiServer) -> None:
    assert server._httpd is not None
    server._httpd.request_timeout = 1.0
    with socket.create_connection(_addr(server), timeout=30) as s:
        s.sendall(b"POST " + LEASES.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        s.settimeout(30)
        assert s.recv(65536) == b""  # closed by the server once the request deadline passed
    assert _call(server, "GET", LEASES)[0] == 200


def test_chunked_body_is_read(server: EmbeddedApiServer) -> None:
    body = json.dumps(_lease("chunked")).encode()
    answer = _raw(server, b"POST " + LEASES.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/json\r\nConnection: close\r\n\r\n" + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 201")


def test_http_1_0_and_1_1_keep_alive(server: EmbeddedApiServer) -> None:
    get = b"GET " + LEASES.encode() + b" HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    with socket.create_connection(_addr(server), timeout=30) as s:
        f = s.makefile("rb")
        for _ in range(3):
            s.sendall(get)
            status = f.readline()
            headers = {}
            while (line := f.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.lower()] = v.strip()
            assert status.startswith(b"HTTP/1.1 200") and headers["connection"] == "keep-alive"
            f.read(int(headers["content-length"]))
    # HTTP/1.1: two pipelined requests on one connection, both answered.
    get11 = b"GET " + LEASES.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(server, get11 + get11.replace(b"Host: x", b"Host: x\r\nConnection: close"))
    assert answer.count(b"HTTP/1.1 200 OK") == 2


@pytest.mark.slow
def test_idle_connection_flood_does_not_stop_service(server: EmbeddedApiServer) -> None:
    assert server._httpd is not None
    server._httpd.first_request_timeout = 2.0
    idle: list[socket.socket] = []
    try:
        for _ in range(1500):
            idle.append(socket.create_connection(_addr(server), timeout=30))
        # During the flood: a new client is served.
        assert _call(server, "GET", LEASES)[0] == 200
        assert _call(server, "POST", LEASES, _lease("during"))[0] == 201
        # Connections that never send a request are closed by the server.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server._httpd.stats()["open"] > 5:
            time.sleep(0.2)
        assert server._httpd.stats()["open"] <= 5
    finally:
        for s in idle:
            s.close()
    # After the flood: served at once.
    assert _call(server, "GET", f"{LEASES}/during")[0] == 200


def test_flood_beyond_the_connection_cap_evicts_the_oldest_idle(server: EmbeddedApiServer) -> None:
    assert server._httpd is not None
    server._httpd.max_connections = 200
    idle = [socket.create_connection(_addr(server), timeout=30) for _ in range(400)]
    try:
        assert _call(server, "GET", LEASES)[0] == 200
        assert server._httpd.stats()["open"] <= 201
    finally:
        for s in idle:
            s.close()


def test_watchers_are_woken_only_by_their_resource_and_dropped_when_gone(server: EmbeddedApiServer) -> None:
    store = server.store
    lease_rt = server.registry.by_kind("Lease")
    assert lease_rt is not None
    wakes = []
    cond = store._rt_conds[lease_rt]
    real_notify = cond.notify_all
    cond.notify_all = lambda: (wakes.append(1), real_notify())[1]  # type: ignore[method-assign]
    assert _call(server, "POST", LEASES, _lease("v"))[0] == 201
    assert wakes == []  # no watch thread waits on leases: nobody to wake
    cond.waiting += 1  # as a watch thread in wait_events
    assert _call(server, "POST", "/api/v1/namespaces/default/pods",
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}})[0] == 201
    assert wakes == []
    assert _call(server, "POST", LEASES, _lease("w"))[0] == 201
    assert wakes == [1]
    cond.waiting -= 1

    # The event is encoded once and the same bytes go to every watcher.
    ev = store._history[-1]
    assert ev.obj_json is store.json_of(store.get(lease_rt, "default", "w"))
    assert json.loads(ev.line("MODIFIED")) == {"type": "MODIFIED", "object": ev.obj}

    assert server._httpd is not None
    socks = []
    for _ in range(3):
        s = socket.create_connection(_addr(server), timeout=30)
        s.sendall(b"GET " + LEASES.encode() + b"?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        socks.append(s)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server._httpd.stats()["watches"] < 3:
        time.sleep(0.05)
    assert server._httpd.stats()["watches"] == 3
    for s in socks:
        s.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server._httpd.stats()["watches"] > 0:
        time.sleep(0.05)
    assert server._httpd.stats()["watches"] == 0


@pytest.mark.slow
def test_many_concurrent_clients_with_slow_ones(server: EmbeddedApiServer) -> None:
    """Slow senders hold at most a worker each until their deadline; the rest are still served."""
    assert server._httpd is not None
    server._httpd.request_timeout = 2.0
    slow = []
    for _ in range(40):  # more than the worker pool
        s = socket.create_connection(_addr(server), timeout=30)
        s.sendall(b"GET " + LEASES.encode() + b" HTTP/1.1\r\nHo")  # never finishes its headers
        slow.append(s)
    results: list[int] = []

    def client() -> None:
        results.append(_call(server, "GET", LEASES)[0])

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for s in slow:
        s.close()
    assert results == [200] * 8
