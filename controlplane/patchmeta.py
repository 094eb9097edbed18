"""Strategic-merge-patch metadata of the Kubernetes 1.37 API: per type, each field's patch strategy, merge key
and the type of its value, as the Go structs' `patchStrategy`/`patchMergeKey` tags (published in the OpenAPI
as `x-kubernetes-patch-strategy`/`x-kubernetes-patch-merge-key`) give them.

The table (`patch_strategies.json`, next to this module) is generated from the 1.37 OpenAPI schemas that the
`kubernetes-validate` package ships: `python -m controlplane.patchmeta` regenerates it, and a test checks that
it is current. At runtime only the table is read, so the server needs nothing beyond its own install.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("patch_strategies.json")
SOURCE_VERSION = "v1.37.0-local"  # the kubernetes-validate schema set the table is generated from


@dataclass(frozen=True)
class FieldMeta:
    """How strategic merge treats one field: `strategies` ("merge", "replace", "retainKeys"), the list's merge
    key, and the type of the value (of each item, for lists; of each value, for maps) when it is a struct."""

    strategies: frozenset[str] = frozenset()
    merge_key: str = ""
    ref: str = ""

    @property
    def merges(self) -> bool:
        return "merge" in self.strategies

    @property
    def retains_keys(self) -> bool:
        return "retainKeys" in self.strategies


NO_META = FieldMeta()


@dataclass(frozen=True)
class PatchMeta:
    types: dict[str, dict[str, FieldMeta]]
    kinds: dict[str, str]  # "group/version/Kind" -> type name

    def type_of(self, group: str, version: str, kind: str) -> str | None:
        return self.kinds.get(f"{group}/{version}/{kind}")

    def field(self, type_name: str, name: str) -> FieldMeta:
        return self.types.get(type_name, {}).get(name, NO_META)


def _ref(prop: dict[str, Any]) -> str:
    for candidate in (prop, prop.get("items") or {}, prop.get("additionalProperties") or {}):
        if isinstance(candidate, dict) and isinstance(candidate.get("$ref"), str):
            return str(candidate["$ref"]).rsplit("/", 1)[-1]
        for alt in (candidate.get("allOf") or []) if isinstance(candidate, dict) else []:
            if isinstance(alt, dict) and isinstance(alt.get("$ref"), str):
                return str(alt["$ref"]).rsplit("/", 1)[-1]
    return ""


def build_table(definitions: dict[str, Any]) -> dict[str, Any]:
    """The compact table from an OpenAPI `definitions` map: only fields that carry a strategy or lead to a
    struct that does (directly or further down), so that the lookup never walks dead ends."""
    raw: dict[str, dict[str, list[str]]] = {}
    for name, schema in definitions.items():
        fields: dict[str, list[str]] = {}
        for fname, prop in (schema.get("properties") or {}).items():
            if not isinstance(prop, dict):
                continue
            fields[fname] = [prop.get("x-kubernetes-patch-strategy", ""), prop.get("x-kubernetes-patch-merge-key", ""),
                             _ref(prop)]
        raw[name] = fields
    # A type matters when one of its fields has a strategy or refers to a type that matters (fixed point).
    matters: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, fields in raw.items():
            if name in matters:
                continue
            if any(s or (r in matters) for s, _, r in fields.values()):
                matters.add(name)
                changed = True
    types = {name: {f: [s, k, r if r in matters else ""] for f, (s, k, r) in sorted(fields.items())
                    if s or r in matters}
             for name, fields in sorted(raw.items()) if name in matters}
    kinds: dict[str, str] = {}
    for name, schema in sorted(definitions.items()):
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            key = f"{gvk.get('group', '')}/{gvk.get('version', '')}/{gvk.get('kind', '')}"
            if name in matters and not name.startswith("io.k8s.apimachinery.pkg.apis.meta.v1."):
                kinds[key] = name
    return {"source": f"kubernetes-validate {SOURCE_VERSION}", "types": types, "kinds": kinds}


def source_definitions() -> dict[str, Any]:
    """The OpenAPI definitions of the schema set the table comes from (needs kubernetes-validate, a test and
    development dependency)."""
    import kubernetes_validate  # type: ignore[import-untyped]  # noqa: PLC0415 - generator and its test only

    path = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / SOURCE_VERSION / "_definitions.json"
    doc = json.loads(path.read_text())
    return dict(doc.get("$defs") or doc.get("definitions") or {})


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, separators=(",", ":"), sort_keys=True) + "\n"


@cache
def load() -> PatchMeta:
    doc = json.loads(TABLE.read_text())
    types = {name: {f: FieldMeta(frozenset(s.split(",")) - {""}, k, r) for f, (s, k, r) in fields.items()}
             for name, fields in doc["types"].items()}
    return PatchMeta(types=types, kinds=dict(doc["kinds"]))


if __name__ == "__main__":
    text = render(build_table(source_definitions()))
    TABLE.write_text(text)
    print(f"wrote {TABLE} ({len(text)} bytes)", file=sys.stderr)
