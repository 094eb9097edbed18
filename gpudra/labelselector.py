"""metav1.LabelSelector matching (matchLabels and matchExpressions), as apimachinery's LabelSelectorAsSelector
matches: every requirement must hold; an absent selector (None) selects everything, as does an empty one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(selector, Mapping):
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        if not isinstance(expr, Mapping):
            return False
        key, op, values = str(expr.get("key")), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (op == "In" and (not present or labels[key] not in values)) or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present) \
                or op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True
