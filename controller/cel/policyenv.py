"""The CEL environment of ValidatingAdmissionPolicies (object, oldObject, request, params, namespaceObject,
variables; Kubernetes' base extensions). The embedded control plane evaluates policies with it; it is handed
over by the program's wiring (cli), since the control plane imports nothing of the controller."""

from __future__ import annotations

from typing import Any

from cel_expr_python import cel

from controller.cel.environment import EXTENSIONS_YAML
from controller.cel.errors import compile_message, runtime_message

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "variables")


class PolicyProgram:
    def __init__(self, env: Any, program: Any) -> None:
        self._env = env
        self._program = program

    def evaluate(self, activation: dict[str, Any]) -> Any:
        """The value as plain Python; ValueError with CEL's text when evaluation fails."""
        try:
            result = self._program.eval(self._env.Activation(activation))
        except Exception as err:
            raise ValueError(runtime_message(str(err))) from None
        if result.type() == cel.Type.ERROR:  # cel-expr-python returns most runtime errors as a value
            raise ValueError(runtime_message(str(result.value())))
        value = result.plain_value() if hasattr(result, "plain_value") else result.value()
        if hasattr(value, "value") and not isinstance(value, (bool, int, float, str, list, dict)):
            value = value.value()
        return value


class PolicyEnvironment:
    def __init__(self) -> None:
        dyn = cel.Type.DYN
        self._env = cel.NewEnv(None, config=cel.NewEnvConfigFromYaml(EXTENSIONS_YAML),
                               variables=dict.fromkeys(VARIABLES, dyn))
        self._cache: dict[str, PolicyProgram | str] = {}

    def compile(self, expression: str) -> PolicyProgram:
        """Raises ValueError with Kubernetes' compile error text."""
        cached = self._cache.get(expression)
        if cached is None:
            try:
                cached = PolicyProgram(self._env, self._env.compile(expression))
            except Exception as err:
                cached = compile_message(str(err))
            self._cache[expression] = cached
        if isinstance(cached, str):
            raise ValueError(cached)
        return cached
