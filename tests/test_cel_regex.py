"""`find`/`findAll`/`matches` with Go's regexp syntax and linear-time matching (RE2), and the wall-clock bound
on one evaluation (issue 37: a tenant's selector with a backtracking pattern froze scheduling)."""

from __future__ import annotations

import re
import time

import pytest

from controller.cel import CelCompileError, CelEnvironment, CelRuntimeError, DeviceView
from controller.cel.regex import Regex, RegexError

DRIVER = "dra.example.com"


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


def _device(name: str = "") -> DeviceView:
    return DeviceView.from_slice_device(DRIVER, {"name": "dev", "attributes": {"name": {"string": name}}})


def _eval(env: CelEnvironment, expr: str, dev: DeviceView | None = None) -> bool:
    return env.compile(expr).matches(dev or _device())


@pytest.mark.parametrize("expr", [
    # 40 characters: hours with a backtracking engine (each extra "a" doubles the time), microseconds with RE2.
    '"' + "a" * 40 + '!".find("^(a+)+$") == ""',
    '"' + "a" * 40 + '!".findAll("^(a+)+$").size() == 0',
    '!("' + "a" * 40 + '!".matches("^(a+)+$"))',
    '"' + "a" * 40 + '!".find("(a|aa)+$") == ""',
    '"' + "x" * 60 + '".find("(x+x+)+y") == ""',
])
def test_catastrophic_backtracking_patterns_evaluate_in_linear_time(env: CelEnvironment, expr: str) -> None:
    started = time.monotonic()
    assert _eval(env, expr) is True
    assert time.monotonic() - started < 2.0


def test_the_engine_is_re2_not_backtracking() -> None:
    # Features only a backtracking engine has are refused, in Go's words (Go's regexp is RE2 syntax).
    for pattern, text in [(r"(a)\1", r"invalid escape sequence: `\1`"),
                          ("(?=a)", "invalid or unsupported Perl syntax: `(?=`"),
                          ("(?<!a)b", "invalid or unsupported Perl syntax: `(?<!`")]:
        with pytest.raises(RegexError) as err:
            Regex(pattern)
        assert str(err.value) == f"error parsing regexp: {text}"


@pytest.mark.parametrize("pattern, text", [
    ("[0-9]+", "abc123def45"), ("^a", "abc"), ("c$", "abc"), ("(?i)ABC", "xabcx"), ("a.c", "a\nc abc"),
    (r"\d{2,3}", "1 12 1234"), ("x*", "axxbx"), ("[a-z]+@[a-z]+\\.com", "mail bob@example.com now"),
    ("(gpu|mig)-[0-9]", "node mig-3 gpu-1"), ("é+", "caféé"), ("", "ab"), (r"\bgpu\b", "a gpu here"),
    ("a|ab", "ab"), ("[[:digit:]]+", "v42"),
])
def test_normal_patterns_give_the_answers_they_gave_before(env: CelEnvironment, pattern: str, text: str) -> None:
    posix = pattern.replace("[[:digit:]]", "[0-9]")  # POSIX classes are RE2/Go syntax; Python's re lacks them
    before = re.search(posix, text)
    assert Regex(pattern).find(text) == (before.group(0) if before else "")
    literal = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    expected = before.group(0) if before else ""
    quoted = pattern.replace("\\", "\\\\")
    assert _eval(env, f'"{literal}".find("{quoted}") == "{expected}"') is True


def test_find_all_follows_go_for_empty_matches() -> None:
    # Go's FindAllString skips an empty match right after a match; Python's re.findall keeps it.
    assert Regex("a*").find_all("baaab") == ["", "aaa", ""]
    assert Regex("[0-9]").find_all("a1b2c3") == ["1", "2", "3"]
    assert Regex("[0-9]").find_all("a1b2c3", 2) == ["1", "2"]
    assert Regex("[0-9]").find_all("a1b2c3", 0) == []
    assert Regex("").find_all("é!") == ["", "", ""]


def test_a_constant_bad_pattern_is_a_compile_error(env: CelEnvironment) -> None:
    for expr in ['"ab".find("(a)\\\\1") == ""', '"ab".findAll(")").size() == 0', '"ab".matches("(?=a)")']:
        with pytest.raises(CelCompileError) as err:
            env.compile(expr)
        assert str(err.value).startswith("program instantiation failed: error parsing regexp: ")


def test_a_pattern_computed_at_runtime_fails_at_evaluation(env: CelEnvironment) -> None:
    selector = env.compile(f'"abc".find(device.attributes["{DRIVER}"].name) == "b"')
    assert selector.matches(_device("b")) is True
    with pytest.raises(CelRuntimeError) as err:
        selector.matches(_device("(b"))
    assert str(err.value) == "Illegal regex: error parsing regexp: missing closing ): `(b`"
    with pytest.raises(CelRuntimeError) as err:
        env.compile(f'"abc".matches(device.attributes["{DRIVER}"].name)').matches(_device("(a)\\1"))
    assert str(err.value) == "error parsing regexp: invalid escape sequence: `\\1`"


def test_an_evaluation_past_its_time_bound_is_an_error_not_a_match() -> None:
    env = CelEnvironment(evaluation_seconds=0.0)
    for expr in ['"abc".find("b") == "b"',
                 # `||` absorbs an error when the other side is true: the evaluation is still refused.
                 '"abc".find("b") == "b" || true',
                 '[1, 2, 3].exists(i, "abc".find("b") == "b")']:
        with pytest.raises(CelRuntimeError) as err:
            _eval(env, expr)
        assert str(err.value) == "operation interrupted: the evaluation ran longer than 0 s"
    # The default bound leaves ordinary selectors alone.
    assert _eval(CelEnvironment(), '"abc".find("b") == "b" || true') is True
