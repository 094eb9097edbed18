"""Kubernetes `Status` failure bodies, raised as exceptions inside the server and written as JSON."""

from __future__ import annotations

from typing import Any

from controlplane.resources import ResourceType

# Kubernetes' FieldError types, recognised from the start of a validation message.
_CAUSE_REASONS: tuple[tuple[str, str], ...] = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Too many", "FieldValueTooMany"),
    ("Too long", "FieldValueTooLong"),
    ("Forbidden", "FieldValueForbidden"),
    ("Not found", "FieldValueNotFound"),
    ("Internal error", "InternalError"),
)


class StatusError(Exception):
    """An API failure with its HTTP code and Kubernetes Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            status["details"] = self.details
        return status


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return details


def not_found(rt: ResourceType, name: str) -> StatusError:
    return StatusError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def namespace_not_found(namespace: str) -> StatusError:
    return StatusError(404, "NotFound", f'namespaces "{namespace}" not found',
                       {"name": namespace, "kind": "namespaces"})


def already_exists(rt: ResourceType, name: str) -> StatusError:
    return StatusError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str | None = None) -> StatusError:
    detail = why or "the object has been modified; please apply your changes to the latest version and try again"
    return StatusError(409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified} "{name}": {detail}',
                       _details(rt, name))


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def forbidden(rt: ResourceType, name: str, why: str) -> StatusError:
    return StatusError(403, "Forbidden", f'{rt.qualified} "{name}" is forbidden: {why}', _details(rt, name))


def method_not_allowed(message: str) -> StatusError:
    return StatusError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> StatusError:
    return StatusError(
        415, "UnsupportedMediaType",
        f'the body of the request was in an unknown format: {content_type or "(none)"}; accepted: application/json, '
        "application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json",
    )


def expired(requested: int, oldest: int) -> StatusError:
    return StatusError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def _split_error(error: str) -> tuple[str, str]:
    # Errors arrive as "path: message"; the path never contains ": ", the message may.
    field, sep, message = error.partition(": ")
    if not sep:
        return "", error
    return field, message


def invalid(rt: ResourceType, name: str, errors: list[str]) -> StatusError:
    causes = []
    for error in errors:
        field, message = _split_error(error)
        reason = next((r for prefix, r in _CAUSE_REASONS if message.startswith(prefix)), "FieldValueInvalid")
        causes.append({"reason": reason, "message": message, "field": field})
    joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    details = _details(rt, name)
    details["kind"] = rt.kind  # NewInvalid names the kind (kubectl prints `The Namespace "x" is invalid`)
    details["causes"] = causes
    return StatusError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {joined}', details)
