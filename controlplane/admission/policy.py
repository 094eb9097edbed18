"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and its bindings, evaluated as
admission/plugin/policy/validating does: match constraints and the binding's matchResources, params (paramKind
+ paramRef), matchConditions, variables, validations with message/messageExpression, failurePolicy, and the
binding's validationActions (Deny refuses, Warn adds a warning, Audit is accepted: this server keeps no audit log).

The CEL engine is passed in (`Expressions`): the control plane imports nothing of the controller."""

from __future__ import annotations

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
        prefix = f"ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request"
        try:
            params = self._resolve_params(spec, bspec, req)
        except _Denied as exc:
            self._report(req, actions, f"{prefix}: {exc}", warnings, "Invalid")
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
                self._report(req, actions, f"{prefix}: {exc}", warnings, "Invalid")
            return
        for validation in spec.get("validations") or ():
            expression = validation.get("expression", "")
            try:
                ok = self._eval(expression, activation)
            except ValueError as exc:
                if fail:
                    self._report(req, actions, f"{prefix}: expression '{expression}' resulted in error: {exc}",
                                 warnings, validation.get("reason") or "Invalid")
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
            self._report(req, actions, f"{prefix}: {message}", warnings, validation.get("reason") or "Invalid")

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
    def _report(req: AdmissionRequest, actions: list[str], message: str, warnings: list[str], reason: str) -> None:
        if "Warn" in actions:
            warnings.append(message.replace(" denied request: ", ": ", 1).replace(
                "ValidatingAdmissionPolicy", "Validation failed for ValidatingAdmissionPolicy", 1))
        if "Deny" in actions:
            code = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}.get(reason, 422)
            qualified = req.rt.qualified
            raise st.StatusError(code, reason, f'{qualified} "{req.name}" is forbidden: {message}',
                                 {"name": req.name, "kind": req.rt.plural, **({"group": req.rt.group} if req.rt.group else {})})


_SKIP: Any = object()
