"""The generated stubs match the kubelet wire tables field for field (reference/kubelet-wire.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from gpudra.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpudra.kubeletapi.dra.v1 import api_pb2 as dra_v1
from gpudra.kubeletapi.dra.v1 import api_pb2_grpc as dra_v1_grpc
from gpudra.kubeletapi.dra.v1beta1 import api_pb2 as dra_v1beta1
from gpudra.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from gpudra.kubeletapi.drahealth.v1 import api_pb2 as health_v1
from gpudra.kubeletapi.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from gpudra.kubeletapi.drahealth.v1alpha1 import api_pb2 as health
from gpudra.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from gpudra.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

T = FieldDescriptor
STRING, BOOL, INT64, INT32, MSG, ENUM = T.TYPE_STRING, T.TYPE_BOOL, T.TYPE_INT64, T.TYPE_INT32, T.TYPE_MESSAGE, T.TYPE_ENUM

# (message, field, number, type, label, message/enum type name, or the value type for maps, or None); label: "-", "repeated", "map", "optional"
Row = tuple[str, str, int, int, str, str | None]

DRA_COMMON: list[Row] = [
    ("NodePrepareResourcesRequest", "claims", 1, MSG, "repeated", "Claim"),
    ("NodePrepareResourcesResponse", "claims", 1, MSG, "map", "NodePrepareResourceResponse"),
    ("NodePrepareResourceResponse", "devices", 1, MSG, "repeated", "Device"),
    ("NodePrepareResourceResponse", "error", 2, STRING, "-", None),
    ("Device", "request_names", 1, STRING, "repeated", None),
    ("Device", "pool_name", 2, STRING, "-", None),
    ("Device", "device_name", 3, STRING, "-", None),
    ("Device", "cdi_device_ids", 4, STRING, "repeated", None),
    ("NodeUnprepareResourcesRequest", "claims", 1, MSG, "repeated", "Claim"),
    ("NodeUnprepareResourcesResponse", "claims", 1, MSG, "map", "NodeUnprepareResourceResponse"),
    ("NodeUnprepareResourceResponse", "error", 1, STRING, "-", None),
    ("Claim", "namespace", 1, STRING, "-", None),
    ("Claim", "uid", 2, STRING, "-", None),
    ("Claim", "name", 3, STRING, "-", None),
]

REGISTRATION: list[Row] = [
    ("PluginInfo", "type", 1, STRING, "-", None),
    ("PluginInfo", "name", 2, STRING, "-", None),
    ("PluginInfo", "endpoint", 3, STRING, "-", None),
    ("PluginInfo", "supported_versions", 4, STRING, "repeated", None),
    ("RegistrationStatus", "plugin_registered", 1, BOOL, "-", None),
    ("RegistrationStatus", "error", 2, STRING, "-", None),
]

DEVICE_PLUGIN: list[Row] = [
    ("DevicePluginOptions", "pre_start_required", 1, BOOL, "-", None),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, BOOL, "-", None),
    ("RegisterRequest", "version", 1, STRING, "-", None),
    ("RegisterRequest", "endpoint", 2, STRING, "-", None),
    ("RegisterRequest", "resource_name", 3, STRING, "-", None),
    ("RegisterRequest", "options", 4, MSG, "-", "DevicePluginOptions"),
    ("ListAndWatchResponse", "devices", 1, MSG, "repeated", "Device"),
    ("TopologyInfo", "nodes", 1, MSG, "repeated", "NUMANode"),
    ("NUMANode", "ID", 1, INT64, "-", None),
    ("Device", "ID", 1, STRING, "-", None),
    ("Device", "health", 2, STRING, "-", None),
    ("Device", "topology", 3, MSG, "-", "TopologyInfo"),
    ("PreStartContainerRequest", "devices_ids", 1, STRING, "repeated", None),
    ("PreferredAllocationRequest", "container_requests", 1, MSG, "repeated", "ContainerPreferredAllocationRequest"),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, STRING, "repeated", None),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, STRING, "repeated", None),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, INT32, "-", None),
    ("PreferredAllocationResponse", "container_responses", 1, MSG, "repeated", "ContainerPreferredAllocationResponse"),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, STRING, "repeated", None),
    ("AllocateRequest", "container_requests", 1, MSG, "repeated", "ContainerAllocateRequest"),
    ("ContainerAllocateRequest", "devices_ids", 1, STRING, "repeated", None),
    ("CDIDevice", "name", 1, STRING, "-", None),
    ("AllocateResponse", "container_responses", 1, MSG, "repeated", "ContainerAllocateResponse"),
    ("ContainerAllocateResponse", "envs", 1, MSG, "map", "string"),
    ("ContainerAllocateResponse", "mounts", 2, MSG, "repeated", "Mount"),
    ("ContainerAllocateResponse", "devices", 3, MSG, "repeated", "DeviceSpec"),
    ("ContainerAllocateResponse", "annotations", 4, MSG, "map", "string"),
    ("ContainerAllocateResponse", "cdi_devices", 5, MSG, "repeated", "CDIDevice"),
    ("Mount", "container_path", 1, STRING, "-", None),
    ("Mount", "host_path", 2, STRING, "-", None),
    ("Mount", "read_only", 3, BOOL, "-", None),
    ("DeviceSpec", "container_path", 1, STRING, "-", None),
    ("DeviceSpec", "host_path", 2, STRING, "-", None),
    ("DeviceSpec", "permissions", 3, STRING, "-", None),
]

# dra-health v1alpha1 (1.34+, `health_check_timeout_seconds` 1.35, `message` 1.36) and v1 (1.37): the same fields.
HEALTH: list[Row] = [
    ("DeviceIdentifier", "pool_name", 1, STRING, "-", None),
    ("DeviceIdentifier", "device_name", 2, STRING, "-", None),
    ("DeviceHealth", "device", 1, MSG, "-", "DeviceIdentifier"),
    ("DeviceHealth", "health", 2, ENUM, "-", "HealthStatus"),
    ("DeviceHealth", "last_updated_time", 3, INT64, "-", None),
    ("DeviceHealth", "health_check_timeout_seconds", 4, INT64, "-", None),
    ("DeviceHealth", "message", 5, STRING, "-", None),
    ("NodeWatchResourcesResponse", "devices", 1, MSG, "repeated", "DeviceHealth"),
]


def _label(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return "map"
    if field.is_repeated:
        return "repeated"
    if field.has_presence and field.containing_oneof is not None and field.type != MSG:
        return "optional"  # proto3 `optional` is a synthetic one-field oneof
    return "-"


def _assert_rows(file: FileDescriptor, rows: list[Row]) -> None:
    expected_messages = {r[0] for r in rows}
    for message, name, number, ftype, label, type_name in rows:
        desc = file.message_types_by_name[message]
        field = desc.fields_by_name[name]
        assert field.number == number, f"{message}.{name} number"
        assert field.type == ftype, f"{message}.{name} type"
        assert _label(field) == label, f"{message}.{name} label"
        if label == "map":
            # map<string, V>: check the entry's key and value types.
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            assert key.type == STRING, f"{message}.{name} map key"
            value_name = value.message_type.name if value.message_type is not None else ("string" if value.type == STRING else "?")
            assert value_name == type_name, f"{message}.{name} map value"
        elif type_name is not None:
            target = field.message_type or field.enum_type
            assert target is not None and target.name == type_name, f"{message}.{name} type name"
    # No extra fields beyond the reference in the messages the reference lists.
    for message in expected_messages:
        names = {f.name for f in file.message_types_by_name[message].fields}
        assert names == {r[1] for r in rows if r[0] == message}, message


@pytest.mark.parametrize("module,package", [(dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1"), (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1")])
def test_dra_messages(module: object, package: str) -> None:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert file.package == package
    rows = list(DRA_COMMON)
    if module is dra_v1:
        rows.append(("Device", "share_id", 5, STRING, "optional", None))
    _assert_rows(file, rows)


def test_share_id_has_explicit_presence_in_v1_only() -> None:
    d = dra_v1.Device(pool_name="p", device_name="d")
    assert not d.HasField("share_id")
    d.share_id = ""
    assert d.HasField("share_id")
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name


def test_empty_messages() -> None:
    for module, names in [
        (reg, ["InfoRequest", "RegistrationStatusResponse"]),
        (dp, ["Empty", "PreStartContainerResponse"]),
        (health, ["NodeWatchResourcesRequest"]),
    ]:
        for name in names:
            assert module.DESCRIPTOR.message_types_by_name[name].fields == []


def test_registration_messages() -> None:
    assert reg.DESCRIPTOR.package == "pluginregistration"
    _assert_rows(reg.DESCRIPTOR, REGISTRATION)


def test_device_plugin_messages() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    _assert_rows(dp.DESCRIPTOR, DEVICE_PLUGIN)


@pytest.mark.parametrize("module,package", [(health, "v1alpha1"), (health_v1, "v1")])
def test_health_messages_and_enum(module: object, package: str) -> None:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert file.package == package
    assert file.GetOptions().go_package == f"k8s.io/kubelet/pkg/apis/dra-health/{package}"
    _assert_rows(file, HEALTH)
    enum = file.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert file.message_types_by_name["NodeWatchResourcesRequest"].fields == []


def _methods(file: FileDescriptor, service: str) -> dict[str, tuple[str, str, bool, bool]]:
    svc = file.services_by_name[service]
    out = {}
    for m in svc.methods:
        path = f"/{svc.full_name}/{m.name}"
        out[path] = (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
    return out


def test_method_paths() -> None:
    for version, module in [("v1", dra_v1), ("v1beta1", dra_v1beta1)]:
        assert _methods(module.DESCRIPTOR, "DRAPlugin") == {
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False, False),
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse", False, False),
        }
    assert _methods(reg.DESCRIPTOR, "Registration") == {
        "/pluginregistration.Registration/GetInfo": ("InfoRequest", "PluginInfo", False, False),
        "/pluginregistration.Registration/NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False, False),
    }
    assert _methods(dp.DESCRIPTOR, "Registration") == {"/v1beta1.Registration/Register": ("RegisterRequest", "Empty", False, False)}
    assert _methods(dp.DESCRIPTOR, "DevicePlugin") == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False, False),
        "/v1beta1.DevicePlugin/ListAndWatch": ("Empty", "ListAndWatchResponse", False, True),
        "/v1beta1.DevicePlugin/GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False, False),
        "/v1beta1.DevicePlugin/Allocate": ("AllocateRequest", "AllocateResponse", False, False),
        "/v1beta1.DevicePlugin/PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False, False),
    }
    for version, module in [("v1alpha1", health), ("v1", health_v1)]:
        assert _methods(module.DESCRIPTOR, "DRAResourceHealth") == {
            f"/{version}.DRAResourceHealth/NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", False, True),
        }


def test_grpc_stub_modules_expose_services() -> None:
    # The generated servicer/stub helpers exist for every service we serve or call.
    for attr, module in [
        ("add_DRAPluginServicer_to_server", dra_v1_grpc),
        ("add_DRAPluginServicer_to_server", dra_v1beta1_grpc),
        ("add_RegistrationServicer_to_server", reg_grpc),
        ("add_DevicePluginServicer_to_server", dp_grpc),
        ("RegistrationStub", dp_grpc),
        ("add_DRAResourceHealthServicer_to_server", health_grpc),
        ("add_DRAResourceHealthServicer_to_server", health_v1_grpc),
    ]:
        assert hasattr(module, attr), (module.__name__, attr)


def test_descriptor_file_names_are_distinct() -> None:
    names = {m.DESCRIPTOR.name for m in (dra_v1, dra_v1beta1, reg, dp, health, health_v1)}
    assert names == {
        "gpudra/kubeletapi/dra/v1/api.proto",
        "gpudra/kubeletapi/dra/v1beta1/api.proto",
        "gpudra/kubeletapi/pluginregistration/v1/api.proto",
        "gpudra/kubeletapi/deviceplugin/v1beta1/api.proto",
        "gpudra/kubeletapi/drahealth/v1alpha1/api.proto",
        "gpudra/kubeletapi/drahealth/v1/api.proto",
    }


def _load_generator() -> ModuleType:
    """proto/generate.py is a script beside the .proto sources, not an installed module."""
    path = Path(__file__).resolve().parent.parent / "proto" / "generate.py"
    spec = importlib.util.spec_from_file_location("gpu_dra_proto_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_committed_stubs_are_current() -> None:
    generate = _load_generator()

    assert [str(d) for d in generate.check()] == []
