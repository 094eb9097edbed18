"""Every example in README.md and docs/*.md runs as written, and every `gpu-dra ...` the docs mention uses
commands and flags that exist.

Conventions the docs follow (HTML comments, invisible when rendered):
- `<!-- file: NAME -->` before a fenced block: the block is a file the page's shell examples use;
- ```sh blocks are run with bash (`set -e`) in a temporary directory holding those files and a `manifests` link to
  the project's, with `gpu-dra` on PATH and a private $XDG_STATE_HOME and $KUBECONFIG; `make` lines (the build
  itself) are not run; a block that uses kubectl is skipped where kubectl is not installed;
- ```yaml blocks parse; resource.k8s.io objects pass `gpu-dra validate`; a simulator profile loads and discovers;
- ```json blocks parse; a faults file is read by the simulator's reader.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cli.main import build_parser
from tests.plugin_helpers import short_tmp
from tests.upstream_helpers import require_upstream

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE_MARK = re.compile(r"^<!-- file: (\S+) -->$")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    file: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    def files(self) -> dict[str, str]:
        return {b.file: b.text for b in self.blocks if b.file}


def parse_page(path: Path) -> Page:
    page = Page(path)
    lines = path.read_text().splitlines()
    i = 0
    pending_file: str | None = None
    while i < len(lines):
        line = lines[i]
        mark = FILE_MARK.match(line.strip())
        if mark:
            pending_file = mark.group(1)
        elif line.startswith("```"):
            lang = line[3:].strip()
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            page.blocks.append(Block(path, start, lang, "\n".join(lines[start:j]) + "\n", pending_file))
            pending_file = None
            i = j
        elif line.strip():
            pending_file = None
        i += 1
    return page


ALL = [parse_page(p) for p in PAGES]
SH = [(page, b) for page in ALL for b in page.blocks if b.lang in ("sh", "bash", "console")]
YAML = [b for page in ALL for b in page.blocks if b.lang == "yaml"]
JSON = [b for page in ALL for b in page.blocks if b.lang == "json"]


def test_the_docs_have_examples_of_each_kind() -> None:
    assert len(SH) >= 3 and len(YAML) >= 3 and JSON
    names = {b.file for page in ALL for b in page.blocks if b.file}
    assert {"a100.yaml", "pod.yaml"} <= names


def commands(text: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            out.append(current.strip())
        current = ""
    return out


@pytest.mark.process
@pytest.mark.parametrize("page, block", SH, ids=[b.id for _, b in SH])
def test_shell_examples_run_as_written(page: Page, block: Block) -> None:
    script = [c for c in commands(block.text) if not c.startswith("make ")]
    if not script:
        pytest.skip("only build commands (make)")
    if any(c.startswith("kubectl ") for c in script) and shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    if any("--kubernetes upstream" in c for c in script):
        require_upstream()
    with short_tmp() as tmp:
        work = tmp / "w"
        work.mkdir()
        (work / "manifests").symlink_to(ROOT / "manifests")
        for name, text in page.files().items():
            (work / name).write_text(text)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "gpu-dra"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cli.main "$@"\n')
        wrapper.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT),
               "XDG_STATE_HOME": str(tmp / "state"), "KUBECONFIG": str(tmp / "kube" / "config")}
        clusters = re.findall(r"gpu-dra cluster up(?:.*--name (\S+))?", "\n".join(script))
        try:
            out = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=str(work), env=env,
                                 capture_output=True, text=True, timeout=600)
        finally:
            for name in clusters:
                subprocess.run([str(wrapper), "cluster", "down", "--name", name or "gpu-dra"], env=env,
                               capture_output=True, timeout=120)
        assert out.returncode == 0, f"{block.id}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.mark.parametrize("block", YAML, ids=[b.id for b in YAML])
def test_yaml_examples_are_valid(block: Block, tmp_path: Path) -> None:
    from cli.main import main
    from sim.nvml.profile import parse_profile

    docs = [d for d in yaml.safe_load_all(block.text) if d is not None]
    assert docs, block.id
    first = docs[0]
    if isinstance(first, dict) and "models" in first and "gpus" in first:
        parse_profile(block.text, block.id)
        path = tmp_path / "profile.yaml"
        path.write_text(block.text)
        assert main(["inventory", "--nvml", f"sim:{path}", "--node", "n1", "-o", "json"]) == 0
        return
    dra = [d for d in docs if isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("resource.k8s.io/")]
    if dra:
        path = tmp_path / "objects.yaml"
        path.write_text(yaml.safe_dump_all(dra))
        assert main(["validate", "-f", str(path), "-o", "json"]) == 0, block.id


@pytest.mark.parametrize("block", JSON, ids=[b.id for b in JSON])
def test_json_examples_are_valid(block: Block) -> None:
    from sim.nvml.faults import Faults

    doc = json.loads(block.text)
    if isinstance(doc, dict) and {"xids", "lost", "failCalls"} & set(doc):
        Faults.from_json(doc, block.id)


def test_nvlink_domain_example_has_the_published_format() -> None:
    from driver.discovery import discover
    from driver.nvml import load_backend

    text = (ROOT / "docs" / "attributes.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `nvlinkDomain`"))
    example = re.search(r"`(nvlink-[^`]*)`", row).group(1)  # type: ignore[union-attr]
    published = {g.nvlink_domain for g in discover(load_backend("sim:dgx-a100", node="n"), "n").gpus}
    pattern = re.compile(r"^nvlink-[0-9a-f]{16}$")
    assert pattern.match(example) and all(pattern.match(str(d)) for d in published), (example, published)


# ---- every mention of a command uses commands and flags that exist ----------------------------------------------

INLINE = re.compile(r"`(gpu-dra [^`]+)`")


def mentions() -> list[tuple[str, str]]:
    found = []
    for path in PAGES:
        text = path.read_text()
        for m in INLINE.finditer(text):
            found.append((f"{path.relative_to(ROOT)}", m.group(1).replace("\\|", "|")))
        for page in ALL:
            if page.path != path:
                continue
            for b in page.blocks:
                if b.lang == "mermaid":
                    continue  # a diagram's labels, not commands
                for c in commands(b.text):
                    found += [(b.id, s) for s in re.findall(r"(gpu-dra [^|;&]+)", c)]
    return found


def _flags(words: list[str]) -> list[str]:
    out = []
    for w in words:
        for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)", w):
            out.append(m.group(1))
    return out


def test_every_documented_command_and_flag_exists() -> None:
    parser = build_parser([], load_all=True)
    problems = []
    for where, text in mentions():
        words = text.split()[1:]
        p: argparse.ArgumentParser = parser
        for w in words:
            sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is not None and w in sub.choices:
                p = sub.choices[w]
            elif not w.startswith("-"):
                continue
        if p is parser and not any(w in ("--version", "--help") for w in words):
            problems.append(f"{where}: {text!r}: no such command")
            continue
        known = {s for a in p._actions for s in a.option_strings}
        problems += [f"{where}: {text!r}: {flag} is not a flag of `{p.prog}`" for flag in _flags(words) if flag not in known]
    assert not problems, "\n".join(problems)
