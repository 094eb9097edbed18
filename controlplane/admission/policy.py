"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and its bindings, evaluated as
admission/plugin/policy/validating does: match constraints and the binding's matchResources, params (paramKind
+ paramRef), matchConditions, variables, validations with message/messageExpression, failurePolicy, and the
binding's validationActions (Deny refuses, Warn adds a warning, Audit adds the request's audit annotation
`validation.policy.admission.k8s.io/validation_failure`), and auditAnnotations.

The CEL engine is passed in (`Expressions`): the control plane imports nothing of the controller."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from controlplane import status as st
from controlplane.admission.matching import NamespaceLookup, request_view, rules_match, selectors_match
from controlplane.admission.request import AdmissionRequest


class Program(Protocol):
    def evaluate(self, activation: dict[str, Any]) -> Any: ...


class Expressions(Protocol):
    def compile(self, expression: str) -> Program: ...


# () -> (a key that changes when any policy or binding changes, policies, bindings)
PolicySource = Callable[[], "tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]"]
PolicyVersion = Callable[[], Any]
# (apiVersion, kind, namespace, name) -> the param object or None
ParamLookup = Callable[[str, str, str, str], "dict[str, Any] | None"]


class _Denied(Exception):
    pass


class PolicyPlugin:
    kinds = None  # a policy may match any kind

    def __init__(self, expressions: Expressions, version: PolicyVersion, load: PolicySource,
                 namespace: NamespaceLookup, params: ParamLookup) -> None:
        self._cel = expressions
        self._version = version
        self._load = load
        self._namespace = namespace
        self._params = params
        self._key: Any = object()
        self._pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def _bound(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        key = self._version()
        if key != self._key:
            _, policies, bindings = self._load()
            by_name = {(p.get("metadata") or {}).get("name"): p for p in policies}
            pairs = []
            for b in bindings:
                policy = by_name.get((b.get("spec") or {}).get("policyName"))
                if policy is not None:
                    pairs.append((policy, b))
            self._pairs, self._key = pairs, key
        return self._pairs

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        pairs = self._bound()
        if not pairs:
            return
        for policy, binding in pairs:
            self._one(policy, binding, req, obj, old, warnings)

    def _matches(self, constraints: Any, req: AdmissionRequest, obj: dict[str, Any] | None,
                 old: dict[str, Any] | None) -> bool:
        if not isinstance(constraints, dict):
            return True
        if "resourceRules" in constraints and not rules_match(constraints.get("resourceRules"), req):
            return False
        if rules_match(constraints.get("excludeResourceRules"), req):
            return False
        return selectors_match(constraints.get("namespaceSelector"), constraints.get("objectSelector"), req, obj,
                               old, self._namespace)

    def _one(self, policy: dict[str, Any], binding: dict[str, Any], req: AdmissionRequest,
             obj: dict[str, Any] | None, old: dict[str, Any] | None, warnings: list[str]) -> None:
        spec, bspec = policy.get("spec") or {}, binding.get("spec") or {}
        if not self._matches(spec.get("matchConstraints") or {"resourceRules": []}, req, obj, old):
            return
        if bspec.get("matchResources") and not self._matches(bspec["matchResources"], req, obj, old):
            return
        pname, bname = policy["metadata"].get("name"), binding["metadata"].get("name")
        actions = bspec.get("validationActions") or []
        fail = (spec.get("failurePolicy") or "Fail") == "Fail"
        names = (str(pname), str(bname))
        try:
            params = self._resolve_params(spec, bspec, req)
        except _Denied as exc:
            self._report(req, names, actions, str(exc), warnings, "Invalid")
            return
        if params is _SKIP:
            return
        activation: dict[str, Any] = {
            "object": obj, "oldObject": old, "request": request_view(req), "params": params,
            "namespaceObject": self._namespace(req.namespace) if req.rt.namespaced and req.namespace else None,
            "variables": {},
        }
        try:
            for cond in spec.get("matchConditions") or ():
                if self._eval(cond.get("expression", ""), activation) is not True:
                    return
            for var in spec.get("variables") or ():
                activation["variables"] = {**activation["variables"],
                                           var["name"]: self._eval(var.get("expression", ""), activation, False)}
        except ValueError as exc:
            if fail:
                self._report(req, names, actions, str(exc), warnings, "Invalid")
            return
        self._audit_annotations(spec, str(pname), activation, req, fail)
        for index, validation in enumerate(spec.get("validations") or ()):
            expression = validation.get("expression", "")
            try:
                ok = self._eval(expression, activation)
            except ValueError as exc:
                if fail:
                    self._report(req, names, actions, f"expression '{expression}' resulted in error: {exc}",
                                 warnings, validation.get("reason") or "Invalid", index)
                continue
            if ok is True:
                continue
            message = validation.get("message") or f"failed expression: {expression}"
            if validation.get("messageExpression"):
                try:
                    produced = self._eval(validation["messageExpression"], activation, False)
                    if isinstance(produced, str) and produced.strip():
                        message = produced
                except ValueError:
                    pass
            self._report(req, names, actions, message, warnings, validation.get("reason") or "Invalid", index)

    def _audit_annotations(self, spec: dict[str, Any], policy: str, activation: dict[str, Any],
                           req: AdmissionRequest, fail: bool) -> None:
        """spec.auditAnnotations: `<policy>/<key>` for each valueExpression that gives a non-empty string
        (at most 10 KiB of it); one that fails to evaluate refuses the request under failurePolicy Fail."""
        for annotation in spec.get("auditAnnotations") or ():
            expression = annotation.get("valueExpression", "")
            try:
                value = self._eval(expression, activation, False)
            except ValueError as exc:
                if fail:
                    raise st.StatusError(500, "InternalError", f"Internal error occurred: ValidatingAdmissionPolicy "
                                                               f"'{policy}': expression '{expression}' resulted in "
                                                               f"error: {exc}") from None
                continue
            if isinstance(value, str) and value:
                req.annotate(f"{policy}/{annotation.get('key', '')}", value[:10 * 1024])

    def _eval(self, expression: str, activation: dict[str, Any], boolean: bool = True) -> Any:
        value = self._cel.compile(expression).evaluate(activation)
        if boolean and not isinstance(value, bool):
            raise ValueError(f"expression '{expression}' must evaluate to bool")
        return value

    def _resolve_params(self, spec: dict[str, Any], bspec: dict[str, Any], req: AdmissionRequest) -> Any:
        kind = spec.get("paramKind")
        if not isinstance(kind, dict):
            return None
        ref = bspec.get("paramRef") or {}
        namespace = ref.get("namespace") or (req.namespace if req.rt.namespaced else "")
        found = self._params(kind.get("apiVersion", ""), kind.get("kind", ""), namespace, ref.get("name", "")) \
            if ref.get("name") else None
        if found is None:
            if (ref.get("parameterNotFoundAction") or "Deny") == "Deny":
                raise _Denied("failed to configure binding: no params found for policy binding with `Deny` "
                              "parameterNotFoundAction")
            return _SKIP
        return found

    @staticmethod
    def _report(req: AdmissionRequest, names: tuple[str, str], actions: list[str], failure: str,
                warnings: list[str], reason: str, index: int = 0) -> None:
        policy, binding = names
        if "Audit" in actions:
            req.annotate(_VALIDATION_FAILURE, json.dumps([{
                "message": failure, "policy": policy, "binding": binding, "expressionIndex": index,
                "validationActions": actions}], separators=(",", ":")))
        if "Warn" in actions:
            warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{policy}' with binding '{binding}': "
                            f"{failure}")
        if "Deny" in actions:
            message = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {failure}"
            code = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}.get(reason, 422)
            qualified = req.rt.qualified
            raise st.StatusError(code, reason, f'{qualified} "{req.name}" is forbidden: {message}',
                                 {"name": req.name, "kind": req.rt.plural, **({"group": req.rt.group} if req.rt.group else {})})


_SKIP: Any = object()
_VALIDATION_FAILURE = "validation.policy.admission.k8s.io/validation_failure"
