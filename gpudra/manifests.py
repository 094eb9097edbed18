"""Reading Kubernetes manifests from files: YAML or JSON, multi-document, `kind: List` flattened.

Shared by every command that takes `-f FILE...`. Errors name the file and the problem.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


class InputError(Exception):
    """A manifest file cannot be read or parsed; the message names the file."""


def _flatten(doc: Any, source: str, position: str) -> list[dict[str, Any]]:
    if doc is None:
        return []  # empty YAML documents (e.g. a trailing `---`) are skipped, as kubectl does
    if isinstance(doc, list):
        # A bare list of objects (a JSON array or YAML sequence) is read like a List's items.
        return [obj for i, item in enumerate(doc) for obj in _flatten(item, source, f"{position} [{i}]")]
    if not isinstance(doc, dict):
        raise InputError(f"{source}: {position}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
        items = doc.get("items")
        if items is None:
            return []
        if not isinstance(items, list):
            raise InputError(f"{source}: {position}: `items` of a {kind} must be a list")
        out: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            out.extend(_flatten(item, source, f"{position} items[{i}]"))
        return out
    return [doc]


def parse_documents(text: str, source: str) -> list[dict[str, Any]]:
    """All objects in one file's text (JSON or YAML, one or many documents)."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None  # JSON is also YAML; let the YAML parser give the error for flow-style YAML
        else:
            return _flatten(parsed, source, "document 1")
    try:
        docs: list[Any] = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise InputError(f"{source}: not valid YAML or JSON: {err}") from None
    return [obj for i, d in enumerate(docs) for obj in _flatten(d, source, f"document {i + 1}")]


# What kubectl reads from a directory given to -f (non-recursive, in name order).
MANIFEST_SUFFIXES = (".json", ".yaml", ".yml")


def expand_paths(paths: Sequence[str | Path]) -> list[str]:
    """`-f` arguments as kubectl takes them: a directory stands for its .json/.yaml/.yml files in name order (not
    recursive), `-` for standard input, anything else for a file."""
    out: list[str] = []
    for path in paths:
        source = str(path)
        if source != "-" and Path(source).is_dir():
            found = sorted(str(p) for p in Path(source).iterdir() if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            if not found:
                raise InputError(f"{source}: a directory with no .json, .yaml or .yml files")
            out += found
        else:
            out.append(source)
    return out


# Kinds without a namespace; every other kind is namespaced (what kubectl assumes of the kinds it reads).
CLUSTER_SCOPED_KINDS = frozenset({
    "Node", "Namespace", "PriorityClass", "DeviceClass", "ResourceSlice", "PersistentVolume", "StorageClass",
    "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "RuntimeClass", "VolumeAttachment",
    "CSIDriver", "CSINode", "IngressClass", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "DeviceTaintRule", "List",
})
DEFAULT_NAMESPACE = "default"


def default_namespace(obj: dict[str, Any], namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    """A namespaced object without metadata.namespace goes into `namespace`, as kubectl applies it."""
    meta = obj.get("metadata")
    kind = obj.get("kind")
    if isinstance(kind, str) and kind not in CLUSTER_SCOPED_KINDS and isinstance(meta, dict) and not meta.get("namespace"):
        meta["namespace"] = namespace
    return obj


def load_objects(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Objects from all files in order; a directory reads its manifests (expand_paths), `-` reads standard input.
    Namespaced objects without a namespace are put in `default`, as kubectl does. Raises InputError naming the
    file."""
    objects: list[dict[str, Any]] = []
    for path in expand_paths(paths):
        source = str(path)
        try:
            if source == "-":
                text = sys.stdin.read()
            else:
                text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{source}: cannot read: no such file") from None
        except IsADirectoryError:
            raise InputError(f"{source}: cannot read: is a directory, expected a YAML or JSON file") from None
        except UnicodeDecodeError as err:
            raise InputError(f"{source}: not UTF-8 text: {err}") from None
        except OSError as err:
            raise InputError(f"{source}: cannot read: {err.strerror or err}") from None
        objects.extend(default_namespace(obj) for obj in parse_documents(text, source))
    return objects


def object_label(obj: Any) -> str:
    """`Kind/ns/name` for namespaced objects, `Kind/name` otherwise: how messages name an input object."""
    if not isinstance(obj, dict):
        return "?"
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    kind = str(obj.get("kind") or "?")
    name = str(meta.get("name") or meta.get("generateName") or "")
    namespace = meta.get("namespace")
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"
