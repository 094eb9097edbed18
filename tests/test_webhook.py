"""`gpu-dra webhook` end to end: a real HTTPS client (certificate checked against a test CA) posts AdmissionReview
v1 requests to the running subcommand, which judges them as `gpu-dra validate` does."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.validationhooks import validation_admission
from controller.webhook import BadReview, review_response
from tests.plugin_helpers import stop_process

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make test certificates")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(d: Path, cn: str = "gpu-dra-webhook.gpu-dra-system.svc") -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 and the Service name it signs."""
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
             "-days", "1", "-subj", "/CN=test-ca")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}")
    ext = d / "san.ext"
    ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:{cn}\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return ca, cert, key


def _claim(params: dict[str, Any] | None = None, class_name: str = "gpu.nvidia.com") -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name}}]}}
    if params is not None:
        spec["devices"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team-a"}, "spec": spec}


def _review(obj: dict[str, Any] | None, operation: str = "CREATE", old: dict[str, Any] | None = None,
            uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002") -> dict[str, Any]:
    kind = obj["kind"] if obj else "ResourceClaim"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": kind.lower() + "s"},
        "operation": operation, "object": obj, "oldObject": old, "namespace": "team-a", "name": "c",
        "userInfo": {"username": "alice"}, "dryRun": False}}


GOOD = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
BAD = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
       "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, ssl.SSLContext, Path, Path]]:
    d = tmp_path_factory.mktemp("webhook")
    ca, cert, key = make_certs(d)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "webhook", "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
         "--port", "0", "--bind-address", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:") and url.endswith("/validate"), (url, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        context = ssl.create_default_context(cafile=str(ca))
        yield "127.0.0.1", port, context, cert, key
    finally:
        stop_process(proc)


def _post(webhook: tuple[str, int, ssl.SSLContext, Path, Path], body: Any, path: str = "/validate",
          content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
    host, port, context, _, _ = webhook
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=30)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.process
def test_valid_config_is_allowed(webhook) -> None:  # type: ignore[no-untyped-def]
    status, answer = _post(webhook, _review(_claim(GOOD)))
    assert status == 200 and answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.process
def test_bad_opaque_config_is_refused_with_the_field(webhook) -> None:  # type: ignore[no-untyped-def]
    status, answer = _post(webhook, _review(_claim(BAD), uid="u-bad"))
    r = answer["response"]
    assert status == 200 and r["uid"] == "u-bad" and r["allowed"] is False
    assert r["status"]["code"] == 422 and r["status"]["reason"] == "Invalid"
    assert "ResourceClaim team-a/c is invalid" in r["status"]["message"]
    assert "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval" in r["status"]["message"]
    assert "Forever" in r["status"]["message"]


@pytest.mark.process
def test_refused_classes(webhook) -> None:  # type: ignore[no-untyped-def]
    _, answer = _post(webhook, _review(_claim(class_name="vfio.gpu.nvidia.com")))
    assert answer["response"]["allowed"] is False
    assert "does not support VFIO passthrough" in answer["response"]["status"]["message"]
    imex = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "imex.nvidia.com"}, "spec": {}}
    _, answer = _post(webhook, _review(imex))
    assert answer["response"]["allowed"] is False and "IMEX" in answer["response"]["status"]["message"]


@pytest.mark.process
def test_update_and_delete(webhook) -> None:  # type: ignore[no-untyped-def]
    old = _claim(GOOD)
    _, answer = _post(webhook, _review(None, operation="DELETE", old=old))
    assert answer["response"]["allowed"] is True
    # A DeviceClass is validated in full on update: a bad config added to it is refused.
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}, "spec": {}}
    changed = {**cls, "spec": {"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": BAD}}]}}
    _, answer = _post(webhook, _review(cls, operation="UPDATE", old=cls))
    assert answer["response"]["allowed"] is True
    _, answer = _post(webhook, _review(changed, operation="UPDATE", old=cls))
    assert answer["response"]["allowed"] is False and "interval" in answer["response"]["status"]["message"]


@pytest.mark.process
def test_bad_requests_are_400_with_a_reason(webhook) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(webhook, b"{not json")
    assert status == 400 and body["error"].startswith("AdmissionReview: ")
    status, body = _post(webhook, {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}})
    assert status == 400 and "admission.k8s.io/v1" in body["error"]
    status, body = _post(webhook, _review(_claim(GOOD)), content_type="text/plain")
    assert status == 415
    status, body = _post(webhook, _review(_claim(GOOD)), path="/mutate")
    assert status == 404 and "/validate" in body["error"]


@pytest.mark.process
def test_an_oversized_review_is_answered_413(webhook) -> None:  # type: ignore[no-untyped-def]
    # The client sends all of it before reading (as http.client does): the answer must still reach it.
    status, body = _post(webhook, b" " * (50 * 1024 * 1024))
    assert status == 413 and body["error"] == f"body of {50 * 1024 * 1024} bytes; at most {8 * 1024 * 1024}"
    status, _ = _post(webhook, _review(_claim(GOOD)))  # and the server goes on
    assert status == 200


@pytest.mark.process
def test_untrusted_client_sees_a_certificate_error(webhook) -> None:  # type: ignore[no-untyped-def]
    host, port, _, _, _ = webhook
    conn = http.client.HTTPSConnection(host, port, context=ssl.create_default_context(), timeout=30)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/healthz")
    conn.close()
    # ... and the server keeps answering trusted clients.
    status, answer = _post(webhook, _review(_claim(GOOD)))
    assert status == 200 and answer["response"]["allowed"] is True


@pytest.mark.process
def test_renewed_certificate_is_served_without_restart(webhook, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host, port, _, cert, key = webhook
    ca2, cert2, key2 = make_certs(tmp_path)
    time.sleep(0.01)
    shutil.copy(key2, key)
    shutil.copy(cert2, cert)
    status, answer = _post((host, port, ssl.create_default_context(cafile=str(ca2)), cert, key), _review(_claim(GOOD)))
    assert status == 200 and answer["response"]["allowed"] is True


def test_review_core_matches_validate() -> None:
    admit = validation_admission()
    with pytest.raises(BadReview, match="request.uid"):
        review_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}, admit)
    # Kinds the webhook does not judge are let through.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    assert review_response(_review(pod), admit)["response"]["allowed"] is True


@pytest.mark.process
def test_unusable_key_is_refused_at_start(tmp_path: Path) -> None:
    _, cert, _ = make_certs(tmp_path)
    other = tmp_path / "other.key"
    _openssl("genrsa", "-out", str(other), "2048")
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "webhook", "--tls-cert-file", str(cert), "--tls-private-key-file", str(other),
         "--port", "0"], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.returncode == 2 and "not a usable PEM certificate and key" in proc.stderr


@pytest.mark.process  # the webhook and openssl
def test_the_shipped_configuration_refuses_bad_configs_through_the_control_plane(webhook, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """manifests/webhook's ValidatingWebhookConfiguration, applied to a control plane that has none of our own
    validation (as kube-apiserver has none), makes it call `gpu-dra webhook` over HTTPS through the Service
    reference: a bad GpuConfig and NVIDIA's refused VFIO class are refused at create, a good claim is stored."""
    import base64

    import yaml

    from controlplane import EmbeddedApiServer
    from gpudra.kubeapi import ApiError, KubeApi

    host, port, _, cert, key = webhook
    # A certificate of a CA of this test's own (the module's webhook may have been renewed by another test).
    ca_file, cert2, key2 = make_certs(tmp_path)
    time.sleep(0.01)
    shutil.copy(key2, key)
    shutil.copy(cert2, cert)
    ca = ca_file.read_bytes()
    config = next(d for d in yaml.safe_load_all((Path(__file__).parent.parent / "manifests/webhook/webhook.yaml")
                                                .read_text()) if d and d["kind"] == "ValidatingWebhookConfiguration")
    service = config["webhooks"][0]["clientConfig"]["service"]
    config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()  # what cert-manager injects
    server = EmbeddedApiServer()
    server.start()
    server.service_endpoints[(service["namespace"], service["name"])] = (host, port)
    api = KubeApi.connect(url=server.url)
    try:
        api.create("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        api.create("ValidatingWebhookConfiguration", config)
        with pytest.raises(ApiError) as refused:
            api.create("ResourceClaim", _claim(BAD), namespace="team-a")
        assert refused.value.status == 422  # the webhook's own status code, passed on as kube-apiserver does
        assert 'admission webhook "validate.resource.gpu.nvidia.com" denied the request' in str(refused.value)
        assert "timeSlicingConfig.interval" in str(refused.value)
        with pytest.raises(ApiError):
            api.create("ResourceClaim", {**_claim(None, "vfio.gpu.nvidia.com"), "metadata": {"name": "v", "namespace": "team-a"}},
                       namespace="team-a")
        assert api.create("ResourceClaim", _claim(GOOD), namespace="team-a")["metadata"]["name"] == "c"
    finally:
        api.close()
        server.stop()


def test_an_outage_of_the_shipped_webhook_stops_only_what_names_gpu_dra() -> None:
    """manifests/webhook's configuration with no replica answering: another driver's claims, templates and classes
    are created and updated untouched, and so is every claim's update (the scheduler's and controller-manager's
    finalizers); only objects the webhook judges (gpu-dra's opaque configs, NVIDIA's refused classes) are refused,
    per failurePolicy Fail."""
    import socket

    import yaml

    from controller.cel.policyenv import PolicyEnvironment
    from controlplane import EmbeddedApiServer
    from gpudra.kubeapi import ApiError, KubeApi

    config = next(d for d in yaml.safe_load_all((Path(__file__).parent.parent / "manifests/webhook/webhook.yaml")
                                                .read_text()) if d and d["kind"] == "ValidatingWebhookConfiguration")
    assert config["webhooks"][0]["failurePolicy"] == "Fail"
    service = config["webhooks"][0]["clientConfig"]["service"]
    with socket.socket() as s:  # a port nobody listens on: the webhook is down
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    server = EmbeddedApiServer(expressions=PolicyEnvironment())  # matchConditions are CEL, as `gpu-dra apiserver` runs
    server.start()
    server.service_endpoints[(service["namespace"], service["name"])] = ("127.0.0.1", down)
    api = KubeApi.connect(url=server.url)
    api.retries = 0  # a refusal is the answer here, not a hiccup to retry

    def claim(name: str, class_name: str, driver: str | None = None, first_available: bool = False) -> dict[str, Any]:
        request: dict[str, Any] = (
            {"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": class_name}]} if first_available
            else {"name": "r", "exactly": {"deviceClassName": class_name}})
        spec: dict[str, Any] = {"devices": {"requests": [request]}}
        if driver is not None:
            spec["devices"]["config"] = [{"opaque": {"driver": driver, "parameters": {"x": 1}}}]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "team-a"}, "spec": spec}

    def refused(kind: str, obj: dict[str, Any], namespace: str | None = "team-a") -> str:
        with pytest.raises(ApiError) as err:
            api.create(kind, obj, namespace=namespace)
        assert err.value.status == 500 and "failed calling webhook" in str(err.value), err.value
        return str(err.value)

    try:
        api.create("Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        api.create("ValidatingWebhookConfiguration", config)
        # Another driver: its class, its claims (with its own opaque config), its templates, created and updated.
        other_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "fpga.example.com"},
                       "spec": {"config": [{"opaque": {"driver": "fpga.example.com", "parameters": {"x": 1}}}]}}
        api.create("DeviceClass", other_class)
        api.patch("DeviceClass", "fpga.example.com", {"metadata": {"labels": {"tier": "a"}}})
        other = api.create("ResourceClaim", claim("fpga", "fpga.example.com", "fpga.example.com"), namespace="team-a")
        other["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        assert api.replace("ResourceClaim", other)["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "fpga", "namespace": "team-a"}, "spec": {"spec": claim("t", "fpga.example.com")["spec"]}}
        api.create("ResourceClaimTemplate", template, namespace="team-a")
        # A gpu-dra claim without opaque config has nothing for the webhook to judge: created, and updated.
        plain = api.create("ResourceClaim", claim("plain", "gpu.nvidia.com"), namespace="team-a")
        plain["metadata"]["labels"] = {"team": "a"}
        api.replace("ResourceClaim", plain)

        # What the webhook judges is refused while it is down (failurePolicy Fail).
        assert 'failed calling webhook "validate.resource.gpu.nvidia.com"' in refused(
            "ResourceClaim", claim("ours", "gpu.nvidia.com", "gpu.nvidia.com"))
        refused("ResourceClaim", claim("cd", "compute-domain-default-channel.nvidia.com", "compute-domain.nvidia.com"))
        refused("ResourceClaim", claim("vfio", "vfio.gpu.nvidia.com", first_available=True))
        refused("ResourceClaimTemplate", {**template, "metadata": {"name": "ours", "namespace": "team-a"},
                                          "spec": {"spec": claim("t", "imex.nvidia.com")["spec"]}})
        refused("DeviceClass", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                "metadata": {"name": "shared.gpu.nvidia.com"},
                                "spec": {"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}]}},
                namespace=None)
        refused("DeviceClass", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                "metadata": {"name": "vfio.gpu.nvidia.com"}, "spec": {}}, namespace=None)
    finally:
        api.close()
        server.stop()


def test_match_condition_errors_are_handled_as_kube_apiserver_does() -> None:
    """A false condition skips the webhook even when another errs; an error alone rejects the request under
    failurePolicy Fail without calling the webhook, and skips the webhook under Ignore."""
    import socket

    from controller.cel.policyenv import PolicyEnvironment
    from controlplane import EmbeddedApiServer
    from gpudra.kubeapi import ApiError, KubeApi

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    server = EmbeddedApiServer(expressions=PolicyEnvironment())
    server.start()
    server.service_endpoints[("hooks", "hook")] = ("127.0.0.1", down)
    api = KubeApi.connect(url=server.url)
    api.retries = 0

    def config(name: str, policy: str, conditions: list[str]) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name}, "webhooks": [{
                    "name": f"{name}.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": policy, "clientConfig": {"service": {"name": "hook", "namespace": "hooks"}},
                    "objectSelector": {"matchLabels": {"hook": name}},
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["configmaps"]}],
                    "matchConditions": [{"name": f"c{i}", "expression": e} for i, e in enumerate(conditions)]}]}

    def configmap(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"hook": name}}}

    erring = "object.data.missing == 'x'"  # no such key: an evaluation error
    try:
        api.create("ValidatingWebhookConfiguration", config("false-wins", "Fail", [erring, "false"]))
        api.create("ValidatingWebhookConfiguration", config("fails", "Fail", [erring]))
        api.create("ValidatingWebhookConfiguration", config("ignores", "Ignore", [erring]))
        assert api.create("ConfigMap", configmap("false-wins"), namespace="default")
        with pytest.raises(ApiError) as err:
            api.create("ConfigMap", configmap("fails"), namespace="default")
        assert err.value.status == 500
        assert 'failed calling webhook "fails.example.com": failed evaluating match conditions: c0: ' in str(err.value)
        assert api.create("ConfigMap", configmap("ignores"), namespace="default")
    finally:
        api.close()
        server.stop()
