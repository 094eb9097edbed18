"""KubeApi's requests on the official ApiClient's pool: configuration (headers, auth), query encoding, bodies with
values JSON lacks, errors and streams behave as through the generated client's path."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpudra.kubeapi import Invalid, KubeApi, NotFound


def test_auth_and_default_headers_come_from_the_client_configuration(apiserver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib3

    api = KubeApi.connect(url=apiserver.url)
    try:
        api.client.configuration.api_key["BearerToken"] = "secret-token"
        api.client.configuration.api_key_prefix["BearerToken"] = "Bearer"
        api.client.default_headers["X-Test"] = "yes"
        seen: dict[str, Any] = {}
        original = urllib3.HTTPConnectionPool.urlopen

        def spy(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            seen.update(kwargs["headers"], url=url, pool=self)
            return original(self, method, url, *args, **kwargs)

        monkeypatch.setattr(urllib3.HTTPConnectionPool, "urlopen", spy)
        api.list("Node", label_selector="a in (x,y)")
        assert seen["authorization"] == "Bearer secret-token"
        assert seen["X-Test"] == "yes" and seen["User-Agent"] == api.client.user_agent
        assert seen["url"] == "/api/v1/nodes?labelSelector=a+in+%28x%2Cy%29"
        # The pool is the ApiClient's own, the one its PoolManager holds for the host.
        assert seen["pool"] is api.client.rest_client.pool_manager.connection_from_url(apiserver.url)
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
