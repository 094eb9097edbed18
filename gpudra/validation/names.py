"""Kubernetes' name and label format checks (k8s.io/apimachinery/pkg/util/validation), with its messages."""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63

_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _QNAME_FMT + ")?"
_C_IDENTIFIER_FMT = "[A-Za-z_][A-Za-z0-9_]*"

_LABEL_RE = re.compile(f"^{_LABEL_FMT}$")
_SUBDOMAIN_RE = re.compile(f"^{_SUBDOMAIN_FMT}$")
_QNAME_RE = re.compile(f"^{_QNAME_FMT}$")
_LABEL_VALUE_RE = re.compile(f"^{_LABEL_VALUE_FMT}$")
_C_IDENTIFIER_RE = re.compile(f"^{_C_IDENTIFIER_FMT}$")

_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_QNAME_MSG = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of "
    "alphanumeric characters or '_'"
)


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    """Kubernetes' RegexError, including its odd `',  or '` spacing."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def _fullmatch(pattern: re.Pattern[str], value: str) -> bool:
    # Go's $ does not accept a trailing newline the way Python's does.
    return "\n" not in value and pattern.match(value) is not None


def dns1123_label(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _fullmatch(_LABEL_RE, value):
        if _fullmatch(_SUBDOMAIN_RE, value):
            errs.append("must not contain dots")
        else:
            errs.append(regex_error(_LABEL_MSG, _LABEL_FMT, "my-name", "123-abc"))
    return errs


def dns1123_subdomain(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _fullmatch(_SUBDOMAIN_RE, value):
        errs.append(regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    return errs


def qualified_name(value: str) -> list[str]:
    """IsQualifiedName: label keys and annotation keys (`[prefix/]name`)."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + max_len_error(QUALIFIED_NAME_MAX))
    if not _fullmatch(_QNAME_RE, name):
        errs.append("name part " + regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def label_value(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > LABEL_VALUE_MAX:
        errs.append(max_len_error(LABEL_VALUE_MAX))
    if not _fullmatch(_LABEL_VALUE_RE, value):
        errs.append(regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def c_identifier(value: str) -> list[str]:
    if not _fullmatch(_C_IDENTIFIER_RE, value):
        return [regex_error(_C_IDENTIFIER_MSG, _C_IDENTIFIER_FMT, "my_name", "MY_NAME", "MyName")]
    return []


def mask_trailing_dash(name: str) -> str:
    """generateName prefixes may end in '-': Kubernetes checks them as if it were a letter."""
    if len(name) > 1 and name.endswith("-"):
        return name[:-1] + "a"
    return name
