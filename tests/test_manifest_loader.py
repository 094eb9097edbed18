"""The shared manifest loader refuses hostile input with one clear line and exit 2, in bounded time and memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gpudra.manifests import MAX_DEPTH, InputError, load_objects, parse_documents

ROOT = Path(__file__).resolve().parent.parent

BOMB = "\n".join(
    [f"{chr(97)}: &a [" + ",".join(['"lol"'] * 9) + "]"]
    + [f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]" for i in range(1, 9)]
) + "\n"


def test_alias_bomb_is_refused() -> None:
    assert len(BOMB) < 600
    with pytest.raises(InputError) as err:
        parse_documents(BOMB, "bomb.yaml")
    assert "bomb.yaml" in str(err.value) and "aliases expand" in str(err.value)
    assert "\n" not in str(err.value)


def test_modest_aliases_are_fine() -> None:
    text = "kind: List\nitems:\n- &p {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n- *p\n"
    assert [o["metadata"]["name"] for o in parse_documents(text, "ok.yaml")] == ["a", "a"]


@pytest.mark.parametrize("text", [
    "a: " + "[" * 60_000 + "]" * 60_000 + "\n",
    "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 3000)),
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 5000 + "1" + "}" * 5000,
])
@pytest.mark.slow
def test_deep_nesting_is_refused_without_a_traceback(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_documents(text, "deep.yaml")
    assert "deep" in str(err.value) and str(MAX_DEPTH) in str(err.value) or "too deep" in str(err.value)


def test_duplicate_keys_are_refused_in_yaml_and_json() -> None:
    with pytest.raises(InputError) as err:
        parse_documents("apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n", "dup.yaml")
    assert "duplicate key 'name' (line 5)" in str(err.value)
    with pytest.raises(InputError) as err:
        parse_documents('{"kind": "Pod", "metadata": {"name": "a", "name": "b"}}', "dup.json")
    assert "duplicate field 'metadata.name'" in str(err.value)
    # YAML merge keys are not duplicates.
    merged = parse_documents("base: &b {x: 1}\nkind: A\nm:\n  <<: *b\n  x: 2\n", "merge.yaml")
    assert merged[0]["m"] == {"x": 2}


def test_nan_in_json_is_refused() -> None:
    with pytest.raises(InputError) as err:
        parse_documents('{"kind": "Pod", "x": NaN}', "nan.json")
    assert "NaN" in str(err.value)


def _limit_memory() -> None:
    limit = 1024 * 1024 * 1024  # 1 GiB of address space: the bomb used to grow past 3.5 GB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.process
@pytest.mark.parametrize("command", [["validate"], ["allocate"], ["explain"], ["validate", "--strict"]])
@pytest.mark.parametrize("payload", ["bomb", "deep", "dup"])
def test_every_command_exits_2_with_one_line(tmp_path: Path, command: list[str], payload: str) -> None:
    texts = {"bomb": BOMB, "deep": "a: " + "[" * 60_000 + "]" * 60_000 + "\n",
             "dup": "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n"}
    path = tmp_path / f"{payload}.yaml"
    path.write_text(texts[payload])
    done = subprocess.run([sys.executable, "-m", "cli.main", *command, "-f", str(path)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
                          preexec_fn=_limit_memory, check=False)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in done.stderr


def test_load_objects_reads_json_manifests(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p"}}]}))
    # a namespaced object without a namespace is read into `default`, as kubectl applies it
    assert load_objects([str(path)]) == [{"kind": "Pod", "metadata": {"name": "p", "namespace": "default"}}]
