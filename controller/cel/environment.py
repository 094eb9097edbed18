"""The DRA CEL environment: compile selectors once, evaluate them against many devices."""

from __future__ import annotations

from typing import Any, NamedTuple

from cel_expr_python import cel
from google.protobuf import any_pb2

from controller.cel.cost import CostEstimate, checked_expr, estimate_checked_cost
from controller.cel.deadline import DEFAULT_EVALUATION_SECONDS, EvaluationDeadline, interrupted_message
from controller.cel.device import DeviceView
from controller.cel.errors import CelCompileError, CelRuntimeError, compile_message, runtime_message
from controller.cel.fold import fold_literals
from controller.cel.footprint import Footprint, parsed_footprint
from controller.cel.library import KubernetesLibrary
from controller.cel.messages import DEVICE_TYPE, STRICT_DEVICE_TYPE, MessageTypes, build_message_types
from controller.cel.regex import constant_pattern_error
from controller.cel.values import MessageMemo, quantity_to_message, semver_to_message
from gpudra.features import Features
from gpudra.quantity import Quantity
from gpudra.semver import Semver

# resource.k8s.io/v1 CELSelectorExpressionMaxCost.
COST_LIMIT = 1_000_000
COST_EXCEEDED = "actual cost limit exceeded"
VALIDATION_COST_EXCEEDED = "too complex, exceeds cost limit"

# The cel-go extensions of Kubernetes' base environment that cel-cpp also has. Kubernetes' own libraries
# (quantity, semver, regex find/findAll, lists) are added as functions by KubernetesLibrary.
EXTENSIONS_YAML = """
extensions:
  - name: strings
  - name: sets
  - name: optional
  - name: bindings
  - name: two-var-comprehensions
"""

_TYPE_WORDS = {"INT": "int", "UINT": "uint", "DOUBLE": "double", "STRING": "string", "BYTES": "bytes",
               "BOOL": "bool", "NULL": "null_type", "DYN": "dyn", "LIST": "list", "MAP": "map",
               "TIMESTAMP": "google.protobuf.Timestamp", "DURATION": "google.protobuf.Duration", "TYPE": "type"}


def cel_type_name(t: cel.Type) -> str:
    """cel-go's spelling of a type (``int``, ``map(string, dyn)``) from cel-cpp's (``INT``, ``MAP<STRING, DYN>``)."""
    out = []
    word = ""
    for ch in t.name() + " ":
        if ch.isalnum() or ch in "._":
            word += ch
            continue
        if word:
            out.append(_TYPE_WORDS.get(word, word))
            word = ""
        out.append({"<": "(", ">": ")"}.get(ch, ch))
    return "".join(out).strip()


# Devices whose activations share one cel-expr-python arena. Converting a device's data into a fresh arena
# costs about a third more than into a warm one; a small group bounds how much memory one long-lived device
# can keep alive (an arena is freed when the last activation using it is).
_ARENA_GROUP = 32


class _Key(NamedTuple):
    """Identifies evaluation data of a device: the environment and the empty domains it was padded with."""

    env: int
    attribute_domains: frozenset[str]
    capacity_domains: frozenset[str]


class Selector:
    """A compiled selector expression."""

    def __init__(self, env: "CelEnvironment", expression: str, program: Any, cost: CostEstimate,
                 footprint: Footprint | None = None) -> None:
        self.expression = expression
        self.cost = cost.max
        self._env = env
        self._program = program
        self._over_budget = cost.max > env.cost_limit
        self._attribute_domains = cost.attribute_domains
        self._capacity_domains = cost.capacity_domains
        self._base_key = _Key(id(env), frozenset(), frozenset())
        self._pads_domains = bool(self._attribute_domains or self._capacity_domains)
        # Results by the values of the device paths the expression reads (see footprint.py): devices of one
        # model share them, so most devices are answered without converting them or running the program.
        # Only true/false is kept; an error is raised again by evaluating, with that device's own text.
        self._footprint = footprint
        self._results = MessageMemo()

    def matches(self, device: DeviceView) -> bool:
        """Evaluate against one device; raises CelRuntimeError with Kubernetes' text on any error."""
        if self._over_budget:
            # cel-expr-python cannot stop a running evaluation, so an expression whose worst case is over
            # the limit is refused outright with the error Kubernetes gives when it hits the limit.
            raise CelRuntimeError(COST_EXCEEDED)
        footprint = None
        if self._footprint is not None:
            footprint = self._footprint.key(device)
            known = self._results.get(footprint)
            if known is not None:
                return known
        key = self._base_key
        if self._pads_domains:
            missing_attr = self._attribute_domains.difference(device.attributes)
            missing_cap = self._capacity_domains.difference(device.capacity)
            if missing_attr or missing_cap:
                key = _Key(key.env, missing_attr, missing_cap)
        # The view's memo is read directly: this is the per-evaluation hot path.
        cache = device._cel_cache
        activation = cache.get(key)
        if activation is None:
            activation = cache[key] = self._env.activation(device, key.attribute_domains, key.capacity_domains)
        deadline = self._env.deadline
        deadline.start()
        try:
            result = self._program.eval(activation)
        except Exception as err:  # cel-expr-python raises for a few conversion failures
            deadline.finish()
            raise CelRuntimeError(runtime_message(str(err))) from None
        if deadline.finish():
            # Past the bound inside one of our functions: whatever `||` or `exists` made of that error, the
            # evaluation did not complete, so it is an error (and not remembered for other devices).
            raise CelRuntimeError(interrupted_message(deadline.seconds))
        value = result.value()
        if value is True or value is False:
            if footprint is not None:
                self._results.put(footprint, value)
            return value
        if result.type() == cel.Type.ERROR:
            raise CelRuntimeError(runtime_message(str(value)))
        # A runtime value's type is named without parameters, as cel-go's ref.Val.Type() does ("list", "map").
        raise CelRuntimeError(f"CEL result of type {cel_type_name(result.type()).partition('(')[0]} could not be "
                              "converted to bool")


class CelEnvironment:
    """Kubernetes' DRA selector environment.

    ``strict=False`` is the stored-expressions environment the allocator uses (every field known);
    ``strict=True`` is the API-validation environment, where fields behind disabled feature gates
    (``device.allowMultipleAllocations``, DRAConsumableCapacity) are unknown.
    """

    def __init__(self, strict: bool = False, cost_limit: int = COST_LIMIT, features: Features | None = None,
                 share_results: bool = True, evaluation_seconds: float = DEFAULT_EVALUATION_SECONDS) -> None:
        self.strict = strict
        # The wall-clock bound of one evaluation (deadline.py), checked by our functions.
        self.deadline = EvaluationDeadline(evaluation_seconds)
        self.cost_limit = cost_limit
        # Selectors keep results by the device values they read (footprint.py); off, every device is evaluated
        # (what `bench cel` measures: the evaluation itself).
        self.share_results = share_results
        features = features or Features()
        # `<value>.includes(<value>)` (KEP-5491): declared with DRAListTypeAttributes (alpha, 1.36); from 1.37 the
        # stored-expressions environment has it whatever the gate, so that objects written with it keep working.
        self.includes = features.list_type_attributes or (not strict and features.at_least("1.37"))
        self._types: MessageTypes = build_message_types()
        library = KubernetesLibrary(self._types, includes=self.includes, deadline=self.deadline)
        config = cel.NewEnvConfigFromYaml(EXTENSIONS_YAML)
        device_type = STRICT_DEVICE_TYPE if strict else DEVICE_TYPE
        # Type checking uses a message type for `device` so that fields and their types are known; evaluation
        # uses a plain map so that attribute maps can hold ints, strings, semvers and quantities together.
        self._checker = cel.NewEnv(self._types.pool, config=config, variables={"device": cel.Type(device_type)},
                                   functions=library.checker_declarations())
        self._runtime = cel.NewEnv(self._types.pool, config=cel.NewEnvConfigFromYaml(EXTENSIONS_YAML),
                                   variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
                                   functions=library.runtime_declarations())
        self._cache: dict[str, Selector | CelCompileError] = {}
        # Devices repeat the same versions and capacities; their messages are built once per value.
        self._semver_messages = MessageMemo()
        self._quantity_messages = MessageMemo()
        self._arena: Any = None
        self._arena_left = 0

    def compile(self, expression: str) -> Selector:
        """Compile (cached by expression); raises CelCompileError with Kubernetes' text."""
        cached = self._cache.get(expression)
        if cached is None:
            try:
                cached = self._compile(expression)
            except CelCompileError as err:
                cached = err
            self._cache[expression] = cached
        if isinstance(cached, CelCompileError):
            raise cached
        return cached

    def _compile(self, expression: str) -> Selector:
        try:
            checked = self._checker.compile(expression)
        except Exception as err:
            raise CelCompileError(compile_message(str(err))) from None
        result_type = checked.return_type()
        if result_type != cel.Type.BOOL and result_type != cel.Type.DYN:
            raise CelCompileError(f"must evaluate to bool or the unknown type, not {cel_type_name(result_type)}")
        serialized = checked.serialize()
        # Kubernetes compiles a constant matches/find/findAll pattern when it builds the program (cel-go's regex
        # optimizations), so a pattern Go's regexp refuses (backreferences, lookaround) is a compile error there;
        # one computed at runtime fails at evaluation.
        bad_pattern = constant_pattern_error(checked_expr(serialized, self._types).expr)
        if bad_pattern is not None:
            raise CelCompileError(f"program instantiation failed: {bad_pattern}")
        cost = estimate_checked_cost(serialized, self._types)
        try:
            program = self._runtime.compile(expression, disable_check=True)
        except Exception as err:
            raise CelCompileError(compile_message(str(err))) from None
        parsed = program.serialize()
        footprint = parsed_footprint(parsed, self._types) if self.share_results else None
        folded = fold_literals(parsed, self._types)
        if folded is not None:
            program = self._runtime.deserialize(folded)
        return Selector(self, expression, program, cost, footprint)

    def parse(self, expression: str) -> Any:
        """The parsed expression (cel.expr.ParsedExpr, macros expanded, with source positions); raises
        CelCompileError with Kubernetes' text."""
        try:
            program = self._runtime.compile(expression, disable_check=True)
        except Exception as err:
            raise CelCompileError(compile_message(str(err))) from None
        wrapper = any_pb2.Any()
        wrapper.ParseFromString(program.serialize())
        parsed = self._types.ParsedExpr()
        parsed.ParseFromString(wrapper.value)
        return parsed

    def estimate_cost(self, expression: str) -> int:
        """Kubernetes-style worst-case cost of a compilable expression; raises CelCompileError."""
        return self.compile(expression).cost

    def check(self, expression: str) -> str | None:
        """Validation: None when the expression compiles and is within the cost limit, else the error text."""
        try:
            selector = self.compile(expression)
        except CelCompileError as err:
            return str(err)
        if selector.cost > self.cost_limit:
            return VALIDATION_COST_EXCEEDED
        return None

    def activation(self, device: DeviceView, empty_attribute_domains: frozenset[str],
                   empty_capacity_domains: frozenset[str]) -> Any:
        """Evaluation data for a device; the given domains are added as empty maps, as Kubernetes returns an
        empty map for any unknown domain."""
        semver = self._semver_message
        attributes: dict[str, dict[str, Any]] = {}
        for domain, ids in device.attributes.items():
            attributes[domain] = {k: semver(v) if type(v) is Semver else
                                  [semver(x) if type(x) is Semver else x for x in v] if type(v) is list else v
                                  for k, v in ids.items()}
        for domain in empty_attribute_domains:
            attributes[domain] = {}
        quantity = self._quantity_message
        capacity: dict[str, dict[str, Any]] = {}
        for domain, quantities in device.capacity.items():
            capacity[domain] = {k: quantity(v) for k, v in quantities.items()}
        for domain in empty_capacity_domains:
            capacity[domain] = {}
        data = {"driver": device.driver, "attributes": attributes, "capacity": capacity,
                "allowMultipleAllocations": device.allow_multiple_allocations}
        if self._arena_left == 0:
            self._arena = cel.Arena()
            self._arena_left = _ARENA_GROUP
        self._arena_left -= 1
        return self._runtime.Activation({"device": data}, arena=self._arena)

    def _semver_message(self, value: Semver) -> Any:
        # Keyed by the fields the message holds: a tuple hashes and compares in C, a Semver in Python.
        key = (value.major, value.minor, value.patch, value.prerelease)
        message = self._semver_messages.get(key)
        if message is None:
            message = self._semver_messages.put(key, semver_to_message(value, self._types.Semver))
        return message

    def _quantity_message(self, value: Quantity) -> Any:
        message = self._quantity_messages.get(value)
        if message is None:
            message = self._quantity_messages.put(value, quantity_to_message(value, self._types.Quantity))
        return message
