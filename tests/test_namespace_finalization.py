"""Namespace finalization as kube-apiserver and the namespace controller do it, driven with kubectl 1.37:
`spec.finalizers` defaulted to hold `kubernetes`, changed only through the /finalize subresource (PUT), content
held by a finalizer keeping the namespace Terminating with the controller's conditions naming it, `kubernetes`
removed once the namespace is empty, another spec finalizer holding it until it is finalized away, and creation
in a Terminating namespace refused with kube-apiserver's 403."""

from __future__ import annotations

import functools
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controlplane import EmbeddedApiServer
from gpudra.kubeapi import ApiError, KubeApi, NotFound
from tests.polling import until
from tests.conftest import RunningApiServer

KUBECTL = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")
T = TypeVar("T")


_until = functools.partial(until, timeout=30.0)


class Kubectl:
    def __init__(self, apiserver: RunningApiServer) -> None:
        if not Path(KUBECTL).exists():
            pytest.skip("kubectl is installed by `make install-test`")
        self.base = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig)]

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=60, input=stdin)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self(*args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def ns(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.ok("get", "ns", name, "-o", "json")))

    def finalize(self, name: str, finalizers: list[str]) -> subprocess.CompletedProcess[str]:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
                "spec": {"finalizers": finalizers}}
        return self("replace", "--raw", f"/api/v1/namespaces/{name}/finalize", "-f", "-", stdin=json.dumps(body))


def _when(value: T, check: Callable[[T], Any]) -> T | None:
    return value if check(value) else None


def _conditions(ns: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in ns["status"].get("conditions") or []}


pytestmark = pytest.mark.process  # kubectl


def test_spec_finalizers_are_defaulted_validated_and_changed_only_by_finalize(apiserver: RunningApiServer) -> None:
    kubectl = Kubectl(apiserver)
    kubectl.ok("create", "ns", "plain")
    assert kubectl.ns("plain")["spec"]["finalizers"] == ["kubernetes"]
    kubectl.ok("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "held"}, "spec": {"finalizers": ["example.com/hold"]}}))
    assert kubectl.ns("held")["spec"]["finalizers"] == ["example.com/hold", "kubernetes"]
    bad = kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "bad"}, "spec": {"finalizers": ["hold"]}}))
    assert bad.returncode != 0
    assert ('The Namespace "bad" is invalid: spec.finalizers: Invalid value: "hold": name is neither a standard '
            'finalizer name nor is it fully qualified') in bad.stderr
    # An update or a patch leaves spec.finalizers as it is, as kube-apiserver's namespace strategy does.
    kubectl.ok("patch", "ns", "plain", "--type=merge", "-p", '{"spec":{"finalizers":[]},"metadata":{"labels":{"a":"b"}}}')
    patched = kubectl.ns("plain")
    assert patched["spec"]["finalizers"] == ["kubernetes"] and patched["metadata"]["labels"]["a"] == "b"
    # /finalize changes it, and only it; it answers PUT only.
    done = kubectl.finalize("plain", ["example.com/other"])
    assert done.returncode == 0, done.stderr
    assert kubectl.ns("plain")["spec"]["finalizers"] == ["example.com/other"]
    refused = kubectl("get", "--raw", "/api/v1/namespaces/plain/finalize")
    assert refused.returncode != 0 and "the server does not allow this method on the requested resource" in refused.stderr
    discovered = {r["name"]: r for r in json.loads(kubectl.ok("get", "--raw", "/api/v1"))["resources"]}
    assert discovered["namespaces/finalize"]["verbs"] == ["update"]


def test_content_held_by_a_finalizer_keeps_the_namespace_terminating_with_the_controllers_conditions(
        apiserver: RunningApiServer) -> None:
    kubectl = Kubectl(apiserver)
    api = apiserver.api
    kubectl.ok("create", "ns", "team")
    kubectl.ok("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "kept", "namespace": "team", "finalizers": ["example.com/hold"]}}))
    kubectl.ok("create", "configmap", "plain", "-n", "team")
    kubectl.ok("delete", "ns", "team", "--wait=false")
    ns = kubectl.ns("team")
    assert ns["status"]["phase"] == "Terminating" and "conditions" not in ns["status"]
    # Creation in a Terminating namespace: kube-apiserver's 403 with its NamespaceTerminating cause.
    with pytest.raises(ApiError) as refused:
        api.create("ConfigMap", {"metadata": {"name": "late"}}, namespace="team")
    assert refused.value.status == 403
    assert refused.value.message == ('configmaps "late" is forbidden: unable to create new content in '
                                                  'namespace team because it is being terminated')
    assert refused.value.causes == [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                                        "message": "namespace team is being terminated"}]
    # The controller's pass: the plain content goes, the held one stays, and the conditions say why.
    held = _until("the controller's conditions", lambda: _when(kubectl.ns("team"), _conditions))
    assert _conditions(held) == {
        "NamespaceDeletionDiscoveryFailure": ("False", "ResourcesDiscovered", "All resources successfully discovered"),
        "NamespaceDeletionGroupVersionParsingFailure": ("False", "ParsedGroupVersions",
                                                        "All legacy kube types successfully parsed"),
        "NamespaceDeletionContentFailure": ("False", "ContentDeleted",
                                            "All content successfully deleted, may be waiting on finalization"),
        "NamespaceContentRemaining": ("True", "SomeResourcesRemain",
                                      "Some resources are remaining: configmaps. has 1 resource instances"),
        "NamespaceFinalizersRemaining": ("True", "SomeFinalizerRemain",
                                         "Some finalizers are remaining: example.com/hold in 1 resource instances"),
    }
    assert held["spec"]["finalizers"] == ["kubernetes"]
    with pytest.raises(NotFound):
        api.get("ConfigMap", "plain", namespace="team")
    assert api.get("ConfigMap", "kept", namespace="team")["metadata"]["deletionTimestamp"]
    # Its finalizer removed, the held content goes, and with it the namespace.
    kubectl.ok("patch", "configmap", "kept", "-n", "team", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    _until("the namespace to go", lambda: kubectl("get", "ns", "team").returncode != 0)


def test_another_spec_finalizer_holds_an_empty_namespace_until_finalize_removes_it(apiserver: RunningApiServer) -> None:
    kubectl = Kubectl(apiserver)
    kubectl.ok("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "vault"}, "spec": {"finalizers": ["example.com/backup"]}}))
    kubectl.ok("create", "configmap", "data", "-n", "vault")
    kubectl.ok("delete", "ns", "vault", "--wait=false")
    # The controller empties it and removes its own finalizer; the other one keeps it Terminating.
    ns = _until("kubernetes finalized away", lambda: _when(kubectl.ns("vault"), lambda n: n["spec"]["finalizers"] ==
                                                                 ["example.com/backup"]))
    assert ns["status"]["phase"] == "Terminating"
    assert {t: c[0] for t, c in _conditions(ns).items()} == dict.fromkeys(
        ("NamespaceDeletionDiscoveryFailure", "NamespaceDeletionGroupVersionParsingFailure",
         "NamespaceDeletionContentFailure", "NamespaceContentRemaining", "NamespaceFinalizersRemaining"), "False")
    assert kubectl("get", "configmap", "data", "-n", "vault").returncode != 0
    time.sleep(0.5)
    assert kubectl.ns("vault")["status"]["phase"] == "Terminating"  # still held
    done = kubectl.finalize("vault", [])
    assert done.returncode == 0, done.stderr
    assert kubectl("get", "ns", "vault").returncode != 0  # gone with its last finalizer


def test_a_namespace_finalized_before_deletion_goes_at_once_and_its_content_is_not_touched(
        apiserver: RunningApiServer) -> None:
    kubectl = Kubectl(apiserver)
    kubectl.ok("create", "ns", "orphans")
    kubectl.ok("create", "configmap", "left", "-n", "orphans")
    assert kubectl.finalize("orphans", []).returncode == 0
    kubectl.ok("delete", "ns", "orphans", "--wait=false")
    assert kubectl("get", "ns", "orphans").returncode != 0  # no finalizer: no Terminating phase
    # Without the `kubernetes` finalizer the controller never emptied it: its content outlives it, as upstream.
    assert apiserver.api.get("ConfigMap", "left", namespace="orphans")


def test_the_controller_resumes_a_terminating_namespace_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with EmbeddedApiServer(state_file=state) as first:
        api = KubeApi.connect(url=first.url)
        api.create("Namespace", {"metadata": {"name": "team"}})
        api.create("ConfigMap", {"metadata": {"name": "kept", "finalizers": ["example.com/hold"]}}, namespace="team")
        api.delete("Namespace", "team")
        api.close()
    with EmbeddedApiServer(state_file=state) as second:  # stopped before its controller's first pass
        api = KubeApi.connect(url=second.url)
        assert api.get("Namespace", "team")["status"]["phase"] == "Terminating"
        _until("the controller's pass", lambda: api.get("ConfigMap", "kept", namespace="team")["metadata"]
               .get("deletionTimestamp"))
        api.patch("ConfigMap", "kept", {"metadata": {"finalizers": None}}, namespace="team")
        _until("the namespace to go", lambda: not api.list("Namespace", field_selector="metadata.name=team")[0])
        api.close()
