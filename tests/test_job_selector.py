"""The embedded API server generates a Job's selector and pod-template labels on create, as kube-apiserver's Job
strategy does (generateSelector), and refuses what its validation refuses: a selector of the client's own unless
manualSelector is true, template labels that contradict the generated ones, a manual selector that does not
select the template."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from controlplane import jobstrategy
from gpudra.kubeapi import ApiError

POD_SPEC = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
UID, NAME = "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name"


def _job(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": POD_SPEC}
    if labels is not None:
        template["metadata"] = {"labels": labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {**spec, "template": template}}


def _refusal(api: Any, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        api.create("Job", body)
    assert refused.value.status == 422 and refused.value.reason == "Invalid"
    return refused.value


def test_selector_and_template_labels_are_generated(apiserver: Any) -> None:
    api = apiserver.api
    job = api.create("Job", _job("train", {"app": "train"}))
    uid = job["metadata"]["uid"]
    assert job["spec"]["manualSelector"] is False
    assert job["spec"]["selector"] == {"matchLabels": {UID: uid}}
    assert job["spec"]["template"]["metadata"]["labels"] == {
        "app": "train", UID: uid, NAME: "train", "controller-uid": uid, "job-name": "train"}
    # The Job's own labels, which it had none of, are its template's (generated ones included).
    assert job["metadata"]["labels"] == job["spec"]["template"]["metadata"]["labels"]
    assert api.get("Job", "train", "default")["spec"]["selector"] == job["spec"]["selector"]
    # `kubectl get job -o wide`: the SELECTOR column.
    req = urllib.request.Request(apiserver.url + "/apis/batch/v1/namespaces/default/jobs", headers={"Accept": TABLE})
    with urllib.request.urlopen(req) as resp:
        table = json.loads(resp.read())
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert table["rows"][0]["cells"][columns.index("Selector")] == f"{UID}={uid}"


def test_generated_labels_without_template_labels_and_own_labels_kept(apiserver: Any) -> None:
    api = apiserver.api
    body = _job("bare")
    body["metadata"]["labels"] = {"team": "ml"}
    job = api.create("Job", body)
    uid = job["metadata"]["uid"]
    assert job["spec"]["template"]["metadata"]["labels"] == {
        UID: uid, NAME: "bare", "controller-uid": uid, "job-name": "bare"}
    assert job["metadata"]["labels"] == {"team": "ml"}


def test_generate_name_jobs_label_the_generated_name(apiserver: Any) -> None:
    body = _job("")
    body["metadata"] = {"generateName": "run-", "namespace": "default"}
    job = apiserver.api.create("Job", body)
    name = job["metadata"]["name"]
    assert name.startswith("run-") and len(name) == 9
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert (labels[NAME], labels["job-name"]) == (name, name)


def test_manual_selector_is_left_alone(apiserver: Any) -> None:
    api = apiserver.api
    job = api.create("Job", _job("manual", {"app": "manual"}, manualSelector=True,
                                 selector={"matchLabels": {"app": "manual"}}))
    assert job["spec"]["selector"] == {"matchLabels": {"app": "manual"}}
    assert job["spec"]["template"]["metadata"]["labels"] == {"app": "manual"}
    assert job["metadata"]["labels"] == {"app": "manual"}


def test_manual_selector_must_select_the_template(apiserver: Any) -> None:
    api = apiserver.api
    err = _refusal(api, _job("other", {"app": "a"}, manualSelector=True, selector={"matchLabels": {"app": "b"}}))
    assert err.message == ('Job.batch "other" is invalid: spec.template.metadata.labels: Invalid value: '
                           '{"app":"a"}: `selector` does not match template `labels`')
    err = _refusal(api, _job("none", manualSelector=True))
    assert err.message == ('Job.batch "none" is invalid: [spec.selector: Required value, '
                           'spec.template.metadata.labels: Invalid value: null: `selector` does not match template '
                           '`labels`]')


def test_own_selector_without_manual_selector_is_refused(apiserver: Any) -> None:
    api = apiserver.api
    err = _refusal(api, _job("mine", {"app": "mine"}, selector={"matchLabels": {"app": "mine"}}))
    (cause,) = err.causes
    assert cause["field"] == "spec.selector" and cause["reason"] == "FieldValueInvalid"
    assert cause["message"].startswith('Invalid value: {"matchLabels":{"app":"mine","batch.kubernetes.io/'
                                       'controller-uid":"')
    assert cause["message"].endswith('"}}: `selector` not auto-generated')
    with pytest.raises(ApiError):
        api.get("Job", "mine", "default")
    # manualSelector false says the same as leaving it out.
    _refusal(api, _job("mine", {"app": "mine"}, manualSelector=False, selector={"matchLabels": {"app": "mine"}}))


def test_template_labels_contradicting_the_generated_ones_are_refused(apiserver: Any) -> None:
    err = _refusal(apiserver.api, _job("clash", {"job-name": "other"}))
    assert [c["field"] for c in err.causes] == ["spec.template.metadata.labels[job-name]"]
    assert err.causes[0]["message"].startswith('Invalid value: {"batch.kubernetes.io/controller-uid":"')
    assert err.causes[0]["message"].endswith(""""job-name":"other"}: must be 'clash'""")


def test_cronjob_jobs_and_the_simulated_job_controller_still_work(apiserver: Any) -> None:
    from sim.cluster.workloads import WorkloadController

    api = apiserver.api
    api.create("CronJob", {"metadata": {"name": "nightly", "namespace": "default"},
                           "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": {
                               "metadata": {"labels": {"app": "nightly"}}, "spec": POD_SPEC}}}}})
    workloads = WorkloadController(api)
    for _ in range(3):
        workloads.reconcile()
    (job,) = api.list("Job", namespace="default")[0]
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {UID: uid}}
    pods = api.list("Pod", namespace="default", label_selector=f"{UID}={uid}")[0]
    assert len(pods) == 1 and pods[0]["metadata"]["labels"]["app"] == "nightly"


def test_prepare_create_is_pure_and_keeps_what_is_there() -> None:
    job: dict[str, Any] = {"metadata": {"name": "j", "uid": "u"}, "spec": {"template": {"metadata": {"labels": {
        "controller-uid": "u"}}}, "selector": {"matchExpressions": [{"key": "job-name", "operator": "Exists"}]}}}
    assert jobstrategy.prepare_create(job) == []
    assert job["spec"]["selector"] == {"matchExpressions": [{"key": "job-name", "operator": "Exists"}],
                                       "matchLabels": {UID: "u"}}
    bad: dict[str, Any] = {"metadata": {"name": "j", "uid": "u"}, "spec": {
        "template": {}, "selector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}}
    assert jobstrategy.prepare_create(bad) == [
        "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"]
