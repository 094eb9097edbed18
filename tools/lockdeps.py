"""Write or check `requirements.lock`: the exact versions of gpu-dra's runtime dependencies (no test extras), the
closure of `pyproject.toml`'s `dependencies` as installed in this environment, for the image build
(`pip install --no-deps -r requirements.lock` then gpu-dra itself with `--no-deps`).

    python tools/lockdeps.py           # rewrite requirements.lock from the installed environment
    python tools/lockdeps.py --check   # exit 1 when the lock no longer matches pyproject.toml's ranges
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
HEADER = ("# Runtime dependencies of gpu-dra, pinned (tools/lockdeps.py from pyproject.toml's `dependencies`).\n"
          "# The image installs exactly these: pip install --no-deps -r requirements.lock.\n")


def top_level() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """Installed name -> version for `roots` and everything they require (markers evaluated, no extras)."""
    out: dict[str, str] = {}
    todo = list(roots)
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in out:
            continue
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            raise SystemExit(f"lockdeps: {req.name} (needed as {req}) is not installed; run make install first") from None
        out[name] = dist.version
        todo.extend(Requirement(r) for r in dist.requires or [])
    return out


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def lock_errors(text: str, roots: list[Requirement]) -> list[str]:
    pins = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    errors = []
    for req in roots:
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            errors.append(f"{req.name}: in pyproject.toml's dependencies but not in requirements.lock")
        elif not req.specifier.contains(version, prereleases=True):
            errors.append(f"{req.name}=={version}: outside pyproject.toml's range {req.specifier}")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        errors = lock_errors(LOCK.read_text(), top_level())
        for e in errors:
            print(f"requirements.lock: {e}", file=sys.stderr)
        return 1 if errors else 0
    LOCK.write_text(render(closure(top_level())))
    print(f"wrote {LOCK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
