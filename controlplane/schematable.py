"""Regenerates gpudra/validation/schema_fields.json for the kinds this control plane serves:
`python -m controlplane.schematable` after serving a new kind or upgrading the kubernetes client."""

from __future__ import annotations

import sys

from controlplane.resources import DEFAULT_REGISTRY, Registry
from gpudra.validation import schema


def served_kinds(registry: Registry = DEFAULT_REGISTRY) -> list[tuple[str, tuple[str, ...], str]]:
    return [(rt.group, tuple(rt.versions), rt.kind) for rt in registry.types]


if __name__ == "__main__":
    count = schema.write_table(served_kinds())
    print(f"wrote {schema.TABLE} ({count} models)", file=sys.stderr)
