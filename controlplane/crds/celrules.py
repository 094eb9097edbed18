"""`x-kubernetes-validations` rules: CEL with `self` (and `oldSelf` for transition rules) bound to the value.

Values are JSON, typed dynamically (apiextensions types them from the schema; a rule that type-checks there
evaluates the same here). Programs are compiled once per expression.
"""

from __future__ import annotations

from typing import Any

from cel_expr_python import cel

_EXTENSIONS = """
extensions:
  - name: strings
  - name: sets
  - name: optional
  - name: bindings
"""


class CelRules:
    """A `RuleEvaluator` (controlplane.crds.schema): None when the rule holds, else why not."""

    def __init__(self) -> None:
        self._env = cel.NewEnv(None, config=cel.NewEnvConfigFromYaml(_EXTENSIONS),
                               variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN})
        self._programs: dict[str, Any] = {}

    def compile_error(self, expression: str) -> str | None:
        """The compile error of `expression`, None when it compiles (checked when a CRD is written)."""
        try:
            self._program(expression)
        except Exception as err:  # cel-expr-python raises plain exceptions with the parser's text
            return f"compilation failed: {err}"
        return None

    def _program(self, expression: str) -> Any:
        program = self._programs.get(expression)
        if program is None:
            program = self._env.compile(expression)
            self._programs[expression] = program
        return program

    def __call__(self, expression: str, value: Any, old: Any, has_old: bool) -> str | None:
        try:
            program = self._program(expression)
            result = program.eval(self._env.Activation({"self": value, "oldSelf": old if has_old else None}))
            plain = result.value()
        except Exception as err:
            return f"rule evaluation error: {err}"
        if plain is True:
            return None
        if plain is False:
            return ""
        return f"rule evaluation error: {expression} did not evaluate to a bool: {plain!r}"
