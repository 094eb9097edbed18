"""Query parameters as kube-apiserver parses them: a Status 400 naming the parameter when malformed."""

from __future__ import annotations

import json
import re

from controlplane import status as st

_DIGITS = re.compile(r"^[0-9]+$")


def int_param(query: dict[str, str], name: str, minimum: int = 0) -> int | None:
    """An integer query parameter, None when absent; a Status 400 naming it when malformed."""
    text = query.get(name)
    if text is None or text == "":
        return None
    t = text[1:] if text.startswith("-") else text
    if not _DIGITS.match(t) or len(t) > 18:
        raise st.bad_request(f"{name}: Invalid value: {json.dumps(text)}: must be an integer")
    value = int(text)
    if value < minimum:
        raise st.bad_request(f"{name}: Invalid value: {value}: must be greater than or equal to {minimum}")
    return value


def bool_param(query: dict[str, str], name: str) -> bool:
    text = query.get(name)
    if text is None or text == "":
        return False
    if text in ("true", "1", "True", "TRUE", "t", "T"):
        return True
    if text in ("false", "0", "False", "FALSE", "f", "F"):
        return False
    raise st.bad_request(f"{name}: Invalid value: {json.dumps(text)}: must be a boolean (true or false)")
