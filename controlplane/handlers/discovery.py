"""Discovery and OpenAPI documents: /version, /api, /apis, their group and resource lists, /openapi/v2 and v3."""

from __future__ import annotations

from typing import Any

from controlplane import resources as res
from controlplane import status as st
from controlplane.routing import RequestHandler
from controlplane.crds import openapi as crd_openapi
from controlplane.openapi import openapi_group_version, openapi_root, openapi_v2, openapi_v2_protobuf

# kube-openapi answers the "...spec.v2@v1.0+protobuf" Accept with this Content-Type (no "@": mime would refuse it).
_OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


def document(h: RequestHandler, parts: list[str], reg: res.Registry) -> dict[str, Any] | bytes | tuple[bytes, str] | None:
    if parts == ["version"]:
        return res.server_version(h.ctx.kubernetes_version)
    if parts == ["openapi", "v2"]:
        if "protobuf" in (h.headers.get("Accept") or ""):
            return openapi_v2_protobuf(reg), _OPENAPI_V2_PROTOBUF
        return openapi_v2(reg)
    if parts[:2] == ["openapi", "v3"]:
        if len(parts) == 2:
            return openapi_root(reg)
        gv_path = "/".join(parts[2:])
        return (crd_openapi.group_version(reg, gv_path) or openapi_group_version(reg, gv_path)
                or not_found(parts))
    if parts == ["api"]:
        return res.api_versions()
    if parts == ["apis"]:
        return res.api_group_list(reg)
    if len(parts) == 2 and parts[0] == "api":
        return res.api_resource_list(reg, "", parts[1]) or not_found(parts)
    if len(parts) == 2 and parts[0] == "apis":
        return res.api_group(reg, parts[1]) or not_found(parts)
    if len(parts) == 3 and parts[0] == "apis":
        return res.api_resource_list(reg, parts[1], parts[2]) or not_found(parts)
    return None


def not_found(parts: list[str]) -> dict[str, Any]:
    raise st.StatusError(404, "NotFound", f"the server could not find the requested resource (/{'/'.join(parts)})")
