"""A CustomResourceDefinition: its own validation (apiextensions' validation.go rules) and the custom kind it serves.

`validate_definition` is what admission checks on a CRD write. `served_type` turns an accepted CRD into the
ResourceType the registry routes, whose `custom` (a `CustomSchema`) defaults, prunes, validates and converts
(conversion strategy None: only apiVersion changes) the custom resources.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from controlplane.crds import schema as sc
from controlplane.crds.celrules import CelRules
from controlplane.resources import ResourceType
from gpudra.jsoncopy import copy_json
from gpudra.validation import schema as known_fields

KIND = "CustomResourceDefinition"
GROUP = "apiextensions.k8s.io"
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")
_COLUMN_TYPES = ("integer", "number", "string", "boolean", "date")
_RULES = CelRules()


def version_priority(name: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order (GA > beta > alpha, higher numbers first, then others alphabetically), as a
    sort key where smaller sorts first."""
    m = _VERSION.match(name)
    if m is None:
        return (3, 0, 0, name)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), name)


# ----- the CRD's own validation ---------------------------------------------------------------------------------

def _names_errors(names: Any, path: str) -> list[str]:
    if not isinstance(names, dict):
        return [f"{path}: Required value"]
    errors: list[str] = []
    plural, singular, kind = names.get("plural"), names.get("singular"), names.get("kind")
    if not plural:
        errors.append(f"{path}.plural: Required value")
    elif not _DNS_LABEL.match(str(plural)):
        errors.append(f"{path}.plural: Invalid value: {json.dumps(plural)}: a lowercase RFC 1123 label must "
                      "consist of lower case alphanumeric characters or '-', and must start and end with an "
                      "alphanumeric character")
    if singular and not _DNS_LABEL.match(str(singular)):
        errors.append(f"{path}.singular: Invalid value: {json.dumps(singular)}: a lowercase RFC 1123 label must "
                      "consist of lower case alphanumeric characters or '-', and must start and end with an "
                      "alphanumeric character")
    for key in ("kind", "listKind"):
        value = names.get(key)
        if key == "kind" and not value:
            errors.append(f"{path}.kind: Required value")
        elif value and not _DNS1035.match(str(value).lower()):
            errors.append(f"{path}.{key}: Invalid value: {json.dumps(value)}: may have mixed case, but should "
                          "otherwise match: ^[a-z]([-a-z0-9]*[a-z0-9])?$")
    if kind and names.get("listKind") and kind == names.get("listKind"):
        errors.append(f"{path}.listKind: Invalid value: {json.dumps(kind)}: kind and listKind may not be the same")
    for key in ("shortNames", "categories"):
        for i, item in enumerate(names.get(key) or []):
            if not isinstance(item, str) or not _DNS_LABEL.match(item):
                errors.append(f"{path}.{key}[{i}]: Invalid value: {json.dumps(item)}: a lowercase RFC 1123 label "
                              "must consist of lower case alphanumeric characters or '-'")
    return errors


def _version_errors(version: Any, path: str) -> list[str]:
    if not isinstance(version, dict):
        return [f"{path}: Invalid value: must be an object"]
    errors: list[str] = []
    name = version.get("name")
    if not name:
        errors.append(f"{path}.name: Required value")
    elif not _DNS1035.match(str(name)):
        errors.append(f"{path}.name: Invalid value: {json.dumps(name)}: a DNS-1035 label must consist of lower case "
                      "alphanumeric characters or '-', start with an alphabetic character, and end with an "
                      "alphanumeric character")
    for key in ("served", "storage"):
        if not isinstance(version.get(key), bool):
            errors.append(f"{path}.{key}: Required value: must be true or false")
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    if schema is None:
        errors.append(f"{path}.schema.openAPIV3Schema: Required value: schemas are required")
    else:
        errors.extend(sc.check_structural(schema, f"{path}.schema.openAPIV3Schema"))
        errors.extend(_rule_errors(schema, f"{path}.schema.openAPIV3Schema"))
    subresources = version.get("subresources") or {}
    scale = subresources.get("scale") if isinstance(subresources, dict) else None
    if isinstance(scale, dict):
        for key, prefix in (("specReplicasPath", ".spec."), ("statusReplicasPath", ".status.")):
            value = scale.get(key)
            if not value:
                errors.append(f"{path}.subresources.scale.{key}: Required value")
            elif not str(value).startswith(prefix):
                errors.append(f"{path}.subresources.scale.{key}: Invalid value: {json.dumps(value)}: should be a "
                              f"json path under {prefix.rstrip('.')}")
        selector = scale.get("labelSelectorPath")
        if selector and not (str(selector).startswith(".spec.") or str(selector).startswith(".status.")):
            errors.append(f"{path}.subresources.scale.labelSelectorPath: Invalid value: {json.dumps(selector)}: "
                          "should be a json path under either .spec or .status")
    for i, column in enumerate(version.get("additionalPrinterColumns") or []):
        cpath = f"{path}.additionalPrinterColumns[{i}]"
        if not isinstance(column, dict):
            errors.append(f"{cpath}: Invalid value: must be an object")
            continue
        if not column.get("name"):
            errors.append(f"{cpath}.name: Required value")
        if column.get("type") not in _COLUMN_TYPES:
            errors.append(f"{cpath}.type: Unsupported value: {json.dumps(column.get('type'))}: supported values: "
                          + ", ".join(f'"{t}"' for t in _COLUMN_TYPES))
        if not column.get("jsonPath"):
            errors.append(f"{cpath}.jsonPath: Required value")
    return errors


def _rule_errors(node: Any, path: str) -> list[str]:
    """CEL rules that do not compile, anywhere in the schema."""
    if not isinstance(node, dict):
        return []
    errors = []
    for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
        if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str) or not rule["rule"]:
            errors.append(f"{path}.x-kubernetes-validations[{i}].rule: Required value")
            continue
        problem = _RULES.compile_error(rule["rule"])
        if problem:
            errors.append(f"{path}.x-kubernetes-validations[{i}].rule: Invalid value: {json.dumps(rule['rule'])}: "
                          f"{problem}")
    for key, sub in (node.get("properties") or {}).items():
        errors.extend(_rule_errors(sub, f"{path}.properties[{key}]"))
    for key in ("items", "additionalProperties"):
        errors.extend(_rule_errors(node.get(key), f"{path}.{key}"))
    return errors


def validate_definition(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """A CustomResourceDefinition's errors, as apiextensions-apiserver's validation reports them."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    errors: list[str] = []
    group = spec.get("group")
    if not group:
        errors.append("spec.group: Required value")
    elif "." not in str(group) or not _DNS_SUBDOMAIN.match(str(group)):
        errors.append(f"spec.group: Invalid value: {json.dumps(group)}: should be a domain with at least one dot")
    names = spec.get("names")
    errors.extend(_names_errors(names, "spec.names"))
    name = (obj.get("metadata") or {}).get("name")
    if isinstance(names, dict) and names.get("plural") and group and name != f"{names['plural']}.{group}":
        errors.append(f"metadata.name: Invalid value: {json.dumps(name)}: must be spec.names.plural+\".\"+spec.group")
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        errors.append("spec.scope: Required value" if not scope else
                      f'spec.scope: Unsupported value: {json.dumps(scope)}: supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        errors.append("spec.versions: Invalid value: null: must have exactly one version marked as storage version")
    else:
        seen: set[str] = set()
        for i, version in enumerate(versions):
            errors.extend(_version_errors(version, f"spec.versions[{i}]"))
            vname = version.get("name") if isinstance(version, dict) else None
            if vname in seen:
                errors.append(f"spec.versions[{i}].name: Duplicate value: {json.dumps(vname)}")
            if isinstance(vname, str):
                seen.add(vname)
        storage = [v for v in versions if isinstance(v, dict) and v.get("storage") is True]
        if len(storage) != 1:
            errors.append(f"spec.versions: Invalid value: {json.dumps([v.get('name') for v in versions if isinstance(v, dict)])}"
                          ": must have exactly one version marked as storage version")
        if not any(isinstance(v, dict) and v.get("served") is True for v in versions):
            errors.append("spec.versions: Invalid value: must have at least one version marked as served")
    conversion = spec.get("conversion") or {}
    strategy = conversion.get("strategy", "None") if isinstance(conversion, dict) else "None"
    if strategy == "Webhook":
        errors.append('spec.conversion.strategy: Unsupported value: "Webhook": gpu-dra\'s embedded control plane '
                      'calls no conversion webhooks; supported values: "None"')
    elif strategy != "None":
        errors.append(f'spec.conversion.strategy: Unsupported value: {json.dumps(strategy)}: supported values: '
                      '"None", "Webhook"')
    if spec.get("preserveUnknownFields") is True:
        errors.append("spec.preserveUnknownFields: Invalid value: true: must be false in order to use defaults in "
                      "the schema")
    if old is not None:
        old_spec = old.get("spec") or {}
        if old_spec.get("scope") and scope != old_spec.get("scope"):
            errors.append(f"spec.scope: Invalid value: {json.dumps(scope)}: field is immutable")
        stored = ((old.get("status") or {}).get("storedVersions")) or []
        current = {v.get("name") for v in versions or [] if isinstance(v, dict)}
        for v in stored:
            if v not in current:
                errors.append(f"status.storedVersions[{stored.index(v)}]: Invalid value: {json.dumps(v)}: must "
                              "appear in spec.versions")
    return errors


def default_definition(obj: dict[str, Any]) -> None:
    """kube-apiserver's defaults for a CRD (singular, listKind, conversion), applied on every write."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    names = spec.get("names")
    if isinstance(names, dict) and names.get("kind"):
        names.setdefault("singular", str(names["kind"]).lower())
        names.setdefault("listKind", f"{names['kind']}List")
    if not isinstance(spec.get("conversion"), dict):
        spec["conversion"] = {"strategy": "None"}


# ----- the custom kind ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VersionSchema:
    name: str
    schema: sc.Schema
    columns: tuple[dict[str, Any], ...]
    status: bool
    scale: dict[str, Any] | None


@dataclass(frozen=True)
class CustomSchema:
    """The hooks the store, the handler and the table printer call for one CRD's resources (resources.CustomKind)."""

    group: str
    kind: str
    list_kind: str
    plural: str
    storage: str
    versions: dict[str, VersionSchema]
    definition: str  # the CRD's name
    uid: str = ""
    rules: Any = field(default=_RULES, compare=False)

    def _version_of(self, obj: dict[str, Any]) -> str:
        api_version = obj.get("apiVersion")
        if isinstance(api_version, str) and "/" in api_version:
            group, _, version = api_version.partition("/")
            if group == self.group and version in self.versions:
                return version
        return self.storage

    def decode(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
        version = self._version_of(obj)
        node = self.versions[version].schema
        value = copy_json(obj)
        type_errors: list[str] = []
        meta = value.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            type_errors.append("cannot unmarshal into Go struct field ObjectMeta of type metav1.ObjectMeta")
        sc.default(node, value)
        pruned, dropped = sc.prune(node, value, "")
        if isinstance(pruned.get("metadata"), dict):
            report = known_fields.check_fields("V1ObjectMeta", pruned["metadata"])
            type_errors.extend(report.type_errors)
            dropped.extend(f"metadata.{p}" for p in report.unknown)
            pruned["metadata"] = report.pruned
        pruned["apiVersion"] = f"{self.group}/{self.storage}"
        return pruned, dropped, type_errors

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        node = self.versions[self.storage].schema
        body = {k: v for k, v in obj.items() if k != "metadata"}
        old_body = {k: v for k, v in old.items() if k != "metadata"} if old is not None else None
        return sc.validate(node, body, "", old_body, self.rules, has_old=old is not None)

    def shown(self, obj: dict[str, Any], version: str) -> dict[str, Any]:
        if not version or version == self.storage:
            return obj
        return {**obj, "apiVersion": f"{self.group}/{version}"}

    def columns(self, version: str) -> tuple[dict[str, Any], ...]:
        return self.versions.get(version, self.versions[self.storage]).columns

    def scale(self) -> dict[str, Any] | None:
        return self.versions[self.storage].scale


def established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions
               if isinstance(c, dict))


def served_type(crd: dict[str, Any]) -> ResourceType:
    """The ResourceType an accepted CRD serves (preferred version first, stored at the storage version)."""
    spec = crd["spec"]
    names = spec["names"]
    versions: dict[str, VersionSchema] = {}
    storage = ""
    for v in spec["versions"]:
        subresources = v.get("subresources") or {}
        versions[v["name"]] = VersionSchema(
            name=v["name"], schema=(v.get("schema") or {}).get("openAPIV3Schema") or {"type": "object"},
            columns=tuple(v.get("additionalPrinterColumns") or ()), status="status" in subresources,
            scale=subresources.get("scale"))
        if v.get("storage"):
            storage = v["name"]
    served = tuple(sorted((v["name"] for v in spec["versions"] if v.get("served")), key=version_priority))
    custom = CustomSchema(group=spec["group"], kind=names["kind"], list_kind=names.get("listKind") or
                          names["kind"] + "List", plural=names["plural"], storage=storage, versions=versions,
                          definition=crd["metadata"]["name"], uid=str(crd["metadata"].get("uid", "")))
    return ResourceType(spec["group"], storage, names["plural"], names["kind"], spec["scope"] == "Namespaced",
                        short_names=tuple(names.get("shortNames") or ()), has_status=versions[storage].status,
                        categories=tuple(names.get("categories") or ()),
                        extra_subresources=("scale",) if versions[storage].scale else (), served=served,
                        custom=custom)
