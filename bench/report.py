"""How every benchmark prints its result: one object, as JSON, YAML or a table of figures.

The object always starts with `benchmark` (its name); the figures DESIGN.md lists (`claimsPerSecond` or
`podsPerSecond` or `evalsPerSecond`, `p50Ms`, `p99Ms`, `peakRssMiB`, ...) are keys of it, so scripts read every
benchmark the same way, and the table shows the same keys (nested ones joined with '.').
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

OUTPUTS = ("json", "yaml", "table")


def _rows(doc: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _rows(value, name + ".")
        else:
            yield name, value


def render(doc: Mapping[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return yaml.safe_dump(dict(doc), sort_keys=False).rstrip("\n")
    rows = list(_rows(doc))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{key:<{width}}  {json.dumps(value) if isinstance(value, (list, dict)) else value}"
                     for key, value in rows)


def emit(name: str, figures: Mapping[str, Any], output: str) -> None:
    """Print `figures` as the benchmark `name`'s one result object."""
    print(render({"benchmark": name, **{k: v for k, v in figures.items() if k != "benchmark"}}, output))
