"""Strategic merge patch as apimachinery applies it, with the 1.37 API's patch strategies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane import patchmeta
from controlplane.patch import PatchError
from controlplane.strategicmerge import strategic_merge

POD_SPEC = "io.k8s.api.core.v1.PodSpec"
DEPLOYMENT = "io.k8s.api.apps.v1.Deployment"


def smp(original: Any, patch: Any, type_name: str = POD_SPEC) -> Any:
    return strategic_merge(original, patch, patchmeta.load(), type_name)


def test_the_table_is_current() -> None:
    pytest.importorskip("kubernetes_validate")
    generated = patchmeta.render(patchmeta.build_table(patchmeta.source_definitions()))
    assert patchmeta.TABLE.read_text() == generated, (
        "controlplane/patch_strategies.json is stale; regenerate it with `python -m controlplane.patchmeta`")


def test_the_table_knows_the_struct_tags() -> None:
    meta = patchmeta.load()
    containers = meta.field(POD_SPEC, "containers")
    assert containers.merges and containers.merge_key == "name" and containers.ref == "io.k8s.api.core.v1.Container"
    assert meta.field(POD_SPEC, "volumes").strategies == {"merge", "retainKeys"}
    assert meta.field("io.k8s.api.core.v1.Container", "ports").merge_key == "containerPort"
    assert meta.field("io.k8s.api.apps.v1.DeploymentSpec", "strategy").retains_keys
    assert meta.type_of("apps", "v1", "Deployment") == DEPLOYMENT
    assert meta.type_of("resource.k8s.io", "v1beta1", "ResourceClaim") == "io.k8s.api.resource.v1beta1.ResourceClaim"
    assert meta.type_of("example.com", "v1", "Widget") is None


def test_containers_merge_by_name_and_keep_unpatched_fields() -> None:
    original = {"containers": [{"name": "app", "image": "a:1", "command": ["sleep"],
                                "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}},
                               {"name": "side", "image": "s:1"}]}
    out = smp(original, {"containers": [{"name": "app", "image": "a:2"}]})
    assert out["containers"][0] == {**original["containers"][0], "image": "a:2"}
    assert out["containers"][1] == {"name": "side", "image": "s:1"}
    assert original["containers"][0]["image"] == "a:1"  # the original is not modified


def test_set_element_order_orders_the_merged_list() -> None:
    original = {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}
    patch = {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}], "containers": [{"name": "a", "image": "2"}]}
    assert smp(original, patch)["containers"] == [{"name": "b", "image": "1"}, {"name": "a", "image": "2"}]


def test_new_items_are_added_and_server_only_items_keep_their_place() -> None:
    original = {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    patch = {"$setElementOrder/containers": [{"name": "a"}, {"name": "c"}, {"name": "d"}],
             "containers": [{"name": "d", "image": "x"}]}
    assert [c["name"] for c in smp(original, patch)["containers"]] == ["a", "b", "c", "d"]


def test_patch_delete_in_a_list_removes_the_item() -> None:
    original = {"containers": [{"name": "a"}, {"name": "b"}]}
    assert smp(original, {"containers": [{"name": "a", "$patch": "delete"}]})["containers"] == [{"name": "b"}]


def test_patch_replace_in_a_list_replaces_it() -> None:
    original = {"containers": [{"name": "a", "image": "1"}, {"name": "b"}]}
    out = smp(original, {"containers": [{"name": "c"}, {"$patch": "replace"}]})
    assert out["containers"] == [{"name": "c"}]


def test_patch_replace_and_delete_in_a_map() -> None:
    original = {"nodeSelector": {"a": "1", "b": "2"}, "securityContext": {"runAsUser": 1}}
    out = smp(original, {"nodeSelector": {"c": "3", "$patch": "replace"}, "securityContext": {"$patch": "delete"}})
    assert out == {"nodeSelector": {"c": "3"}}


def test_retain_keys_drops_what_is_not_listed() -> None:
    original = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}
    assert smp(original, patch, DEPLOYMENT)["spec"]["strategy"] == {"type": "Recreate"}


def test_primitive_merge_lists_union_and_delete_from_primitive_list() -> None:
    original = {"metadata": {"finalizers": ["a", "b"]}}
    assert sorted(smp(original, {"metadata": {"finalizers": ["c"]}}, DEPLOYMENT)["metadata"]["finalizers"]) == ["a", "b", "c"]
    ordered = {"metadata": {"$setElementOrder/finalizers": ["a", "b", "c"], "finalizers": ["c"]}}
    assert smp(original, ordered, DEPLOYMENT)["metadata"]["finalizers"] == ["a", "b", "c"]
    out = smp(original, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, DEPLOYMENT)
    assert out["metadata"]["finalizers"] == ["b"]


def test_lists_without_a_strategy_are_replaced_and_null_deletes() -> None:
    original = {"containers": [{"name": "a", "command": ["x", "y"], "args": ["1"]}]}
    out = smp(original, {"containers": [{"name": "a", "command": ["z"], "args": None}]})
    assert out["containers"] == [{"name": "a", "command": ["z"]}]


def test_env_merges_by_name_and_ports_by_container_port() -> None:
    original = {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "1"}],
                                "ports": [{"containerPort": 80, "name": "http"}]}]}
    patch = {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}],
                             "ports": [{"containerPort": 443, "name": "https"}]}]}
    c = smp(original, patch)["containers"][0]
    assert c["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert sorted(p["containerPort"] for p in c["ports"]) == [80, 443]


@pytest.mark.parametrize("patch, message", [
    ({"containers": [{"image": "x"}]}, "does not contain declared merge key: name"),
    ({"nodeSelector": {"$patch": "bogus"}}, "unknown patch type 'bogus'"),
    ({"$retainKeys": "type"}, "$retainKeys must be a list"),
])
def test_malformed_patches_are_refused(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(PatchError, match=message.replace("$", r"\$")):
        smp({"containers": [{"name": "a"}]}, patch)


def test_round_trip_through_the_server(apiserver: Any) -> None:
    api = apiserver.api
    api.create("Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": {"containers": [{"name": "a", "image": "i:1", "command": ["sleep", "1"]}]}}, "default")
    out = api.patch("Pod", "p", {"spec": {"containers": [{"name": "a", "image": "i:2"}]}}, "default",
                    patch_type="strategic")
    assert out["spec"]["containers"][0]["command"] == ["sleep", "1"]
    assert out["spec"]["containers"][0]["image"] == "i:2"
    assert json.dumps(out).count("$") == 0


def test_a_kind_the_built_in_api_does_not_define_answers_415() -> None:
    from controlplane.resources import Registry, ResourceType
    from controlplane.status import StatusError
    from controlplane.store import Store

    widget = ResourceType("example.com", "v1", "widgets", "Widget", False)
    store = Store(Registry(types=(widget,)))
    store.create(widget, "", {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    with pytest.raises(StatusError) as err:
        store.patch(widget, "", "w", "strategic", {"metadata": {"labels": {"a": "b"}}})
    assert err.value.code == 415 and "application/merge-patch+json" in str(err.value)
    merged = store.patch(widget, "", "w", "merge", {"metadata": {"labels": {"a": "b"}}})
    assert merged["metadata"]["labels"] == {"a": "b"}
