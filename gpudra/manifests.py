"""Reading Kubernetes manifests from files: YAML or JSON, multi-document, `kind: List` flattened.

Shared by every command that takes `-f FILE...`. Errors name the file and the problem.

Input is untrusted and bounded: YAML aliases may not expand a document past `MAX_EXPANDED_NODES` nodes (a
526-byte alias bomb otherwise makes every consumer walk billions of nodes), nesting is bounded by
`strictjson.MAX_DEPTH` (deeper used to end in a RecursionError traceback), duplicate mapping keys are
errors (YAML says keys are unique; Kubernetes' own decoder refuses them), and JSON has no NaN.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpudra import strictjson

MAX_EXPANDED_NODES = 200_000  # nodes of one document with every alias expanded (10x a large ResourceSlice)
MAX_DEPTH = strictjson.MAX_DEPTH


class InputError(Exception):
    """A manifest file cannot be read or parsed; the message names the file."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting while composing, then excessive alias expansion and duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"nesting deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.YAMLError(f"duplicate key {key_node.value!r} (line {key_node.start_mark.line + 1})")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: Any) -> None:
    """Count the nodes of `root` with aliases expanded, without expanding them (each shared node counts once
    per reference); iterative, so that neither depth nor size can exhaust the stack."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
            continue
        total = 1 + sum(size.get(id(c), 1) for c in children)
        if total > MAX_EXPANDED_NODES:
            raise yaml.YAMLError(f"aliases expand the document past {MAX_EXPANDED_NODES} nodes (an alias bomb?)")
        size[id(node)] = total


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
            parsed = strictjson.loads(text)
        except strictjson.StrictJsonError as err:
            if "max depth" in str(err) or "NaN" in str(err):
                raise InputError(f"{source}: not acceptable JSON: {err}") from None
            parsed = None  # JSON is also YAML; let the YAML parser give the error for flow-style YAML
        else:
            dups = strictjson.duplicate_fields(parsed)
            if dups:
                raise InputError(f"{source}: not acceptable JSON: duplicate field {', '.join(map(repr, dups))}")
            return _flatten(parsed, source, "document 1")
    try:
        docs: list[Any] = list(yaml.load_all(text, Loader=_BoundedLoader))
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())  # one line
        raise InputError(f"{source}: not valid YAML or JSON: {detail}") from None
    except RecursionError:
        raise InputError(f"{source}: not valid YAML or JSON: nesting too deep") from None
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
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    kind = str(obj.get("kind") or "?")
    name = str(meta.get("name") or meta.get("generateName") or "")
    namespace = meta.get("namespace")
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"

