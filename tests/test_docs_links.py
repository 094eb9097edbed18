"""Every relative link in README.md and docs/*.md resolves: the file (or directory) exists, and a `#anchor` names a
heading of the page it points to, by GitHub's rules for heading anchors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).*?\1")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (code spans and link texts kept, markup dropped),
    lower-cased, every character but letters, digits, `_`, `-` and space removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # emphasis underscores, not those inside words
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _lines_outside_fences(text: str) -> Iterator[tuple[int, str]]:
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _lines_outside_fences(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings: x, x-1, x-2
    return out


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _lines_outside_fences(page.read_text()):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, m.group(1)))
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def broken(page: Path) -> list[str]:
    problems = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # https:, mailto: ...: not ours to check offline
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{_shown(page)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {_shown(dest)}")
    return problems


@pytest.mark.parametrize("heading, anchor", [
    ("Sharing by capacity (`--shared-capacity`)", "sharing-by-capacity---shared-capacity"),
    ("Legacy `nvidia.com/gpu`: three modes", "legacy-nvidiacomgpu-three-modes"),
    ("The node agent's pod (`manifests/base/node-agent.yaml`)", "the-node-agents-pod-manifestsbasenode-agentyaml"),
    ("Trying a selector on one device: `gpu-dra cel --device`", "trying-a-selector-on-one-device-gpu-dra-cel---device"),
    ("Kubernetes 1.34 — 1.37", "kubernetes-134--137"),
    ("See [the docs](docs/x.md) and *this*", "see-the-docs-and-this"),
    ("snake_case_name", "snake_case_name"),
])
def test_github_anchor_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n[ok](#notes-1) [bad](#notes-2) [gone](x.md)\n")
    assert anchors(page) == {"a", "notes", "notes-1"}
    assert broken(page) == ["p.md:7: #notes-2: no heading #notes-2 in p.md", "p.md:7: x.md: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken(page), "\n".join(broken(page))


def test_the_readme_links_to_every_docs_page() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")}
    assert not [p.name for p in PAGES[1:] if p.resolve() not in linked]
