"""The known-field table is derived from the official `kubernetes` client's models, not written by hand."""

from __future__ import annotations

import json

import pytest

from gpudra.validation import schema
from controlplane.resources import DEFAULT_REGISTRY
from controlplane.schematable import served_kinds


@pytest.mark.slow
def test_table_equals_what_the_installed_client_gives() -> None:
    table, generated = json.loads(schema.TABLE.read_text()), schema.generate(schema.roots(served_kinds()))
    assert table == generated, (
        f"gpudra/validation/schema_fields.json is stale (models missing: {sorted(set(generated) - set(table))[:5]}, "
        f"extra: {sorted(set(table) - set(generated))[:5]}): after serving a new kind or upgrading the kubernetes "
        "client, regenerate it with `python -m controlplane.schematable`")


def test_every_served_kind_has_a_model_in_the_table() -> None:
    for rt in DEFAULT_REGISTRY.types:
        model = schema.model_name(rt.group, rt.version, rt.kind)
        assert model is not None and model in schema._table(), rt.kind
    assert schema.model_name("resource.k8s.io", "v1", "ResourceClaim") == "ResourceV1ResourceClaim"
    assert schema.model_name("", "v1", "Event") == "CoreV1Event"
    assert schema.model_name("resource.k8s.io", "v1beta2", "ResourceSlice") == "V1beta2ResourceSlice"


def test_unknown_fields_and_wrong_types_are_found_with_their_paths() -> None:
    report = schema.check_fields("V1Pod", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labelz": {}},
        "spec": {"containers": [{"name": "c", "limits": {}, "ports": [{"containerPort": "80"}]}],
                 "nodeSelector": {"a": "b"}},
    })
    assert report.unknown == ["metadata.labelz", "spec.containers[0].limits"]
    assert report.type_errors == ["cannot unmarshal string into Go struct field ContainerPort."
                                  "spec.containers[0].ports[0].containerPort of type int64"]
    assert report.pruned["metadata"] == {"name": "p"} and "limits" not in report.pruned["spec"]["containers"][0]
