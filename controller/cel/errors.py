"""Errors of the CEL layer and the texts the allocator reports for them (Kubernetes' wording)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from controller.cel.regex import go_error_text


class CelCompileError(ValueError):
    """The expression does not compile, or its result is not a bool (message is Kubernetes' text)."""


class CelRuntimeError(RuntimeError):
    """Evaluating a compiled selector failed for one device (message is Kubernetes' text)."""


def selector_error(prefix: str, index: int, err: Exception) -> str:
    """The allocator's text for a failed selector, e.g. ``class gpu: selector #0: CEL runtime error: ...``.

    ``prefix`` names the owner: ``class NAME`` or ``claim NAMESPACE/NAME``.
    """
    kind = "CEL compile error" if isinstance(err, CelCompileError) else "CEL runtime error"
    return f"{prefix}: selector #{index}: {kind}: {err}"


# cel-cpp statuses read "CODE: message" (and compile issues end in " [CODE]"); Kubernetes shows the message.
_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX = re.compile(r" \[[A-Z_]+\]$")
_MISSING_KEY = re.compile(r'^Key not found in map ?: ?"?(.*?)"?$')
_NO_FIELD = re.compile(r"^no_such_field ?: ?(.*)$")
# A comprehension (exists, all, map, ...) over a scalar: cel-cpp names only the internal range overload.
_NOT_ITERABLE = re.compile(r"^No matching overloads found ?: ?<iter_range>$")
# cel-cpp's `matches` with a pattern RE2 refuses; cel-go reports Go's regexp error.
_BAD_MATCHES_PATTERN = re.compile(r"^invalid regular expression: (.*)$", re.DOTALL)


def runtime_message(status: str) -> str:
    """Translate a cel-cpp evaluation error into cel-go's wording where they differ."""
    text = _STATUS_PREFIX.sub("", status.strip(), count=1)
    missing = _MISSING_KEY.match(text)
    if missing:
        return f"no such key: {missing.group(1)}"
    no_field = _NO_FIELD.match(text)
    if no_field:
        return f"no such key: {no_field.group(1)}"
    if _NOT_ITERABLE.match(text):
        return "got a scalar value (not a list or map), expected iterable type"
    bad_pattern = _BAD_MATCHES_PATTERN.match(text)
    if bad_pattern:
        return go_error_text(bad_pattern.group(1))
    return text


def compile_message(status: str) -> str:
    """cel-cpp's issue list as Kubernetes prints a failed compilation."""
    text = _STATUS_PREFIX.sub("", status.strip(), count=1)
    text = _STATUS_SUFFIX.sub("", text)
    return f"compilation failed: {text}"


_NO_SUCH_KEY = re.compile(r"^no such key: (\S+)$")


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to a mistyped `name` (case-insensitive similarity), if any is close enough."""
    import difflib

    pool = sorted(set(choices))
    by_lower = {c.lower(): c for c in pool}
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def _edits(a: str, b: str) -> int:
    """Levenshtein distance."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _words(name: str) -> list[str]:
    return "".join(ch if ch.isalnum() else " " for ch in name.lower()).split()


# What people write for a DeviceClass, by meaning, -> the first label of the class they mean (NVIDIA's classes are
# `<kind>.nvidia.com`): the device-plugin resource `nvidia.com/gpu`, a GPU model, a MIG profile.
_CLASS_MEANINGS: dict[str, tuple[str, ...]] = {
    "gpu": ("gpus", "cuda", "accelerator", "h100", "h200", "a100", "a10", "a30", "a40", "b200", "gb200", "l4", "l40",
            "l40s", "t4", "v100"),
    "mig": ("migs", "1g", "2g", "3g", "4g", "7g", "partition", "instance"),
}
_CLASS_HINT_DISTANCE = 0.3  # under one edit in three letters


def closest_class(name: str, classes: Iterable[str]) -> str | None:
    """The DeviceClass a wrong class name probably meant, or None. Decided by the better of the edit distance on
    the whole name and the distance between a word of the name and the class's first label (by spelling, or by
    meaning: `nvidia.com/gpu` and `h100` mean gpu.nvidia.com, not mig.nvidia.com, which is as close in letters);
    a tie between two classes offers neither."""
    typed = name.lower()
    words = _words(typed)
    scored: list[tuple[float, float, str]] = []
    for candidate in sorted(set(classes)):
        lower = candidate.lower()
        whole = _edits(typed, lower) / max(len(typed), len(lower), 1)
        label = lower.split(".")[0]
        by_label = 1.0
        for word in words:
            if word == label or word in _CLASS_MEANINGS.get(label, ()):
                by_label = 0.0
            elif len(label) >= 3 and label in word:
                by_label = min(by_label, 0.2)  # nvidiagpu
            else:
                by_label = min(by_label, _edits(word, label) / max(len(word), len(label)))
        scored.append((min(whole, by_label), whole, candidate))
    scored.sort()
    if not scored or scored[0][0] > _CLASS_HINT_DISTANCE:
        return None
    if len(scored) > 1 and scored[1][:2] == scored[0][:2]:
        return None
    return scored[0][2]


def closest_attribute(qualified: str, published: Iterable[str]) -> str | None:
    """The fully qualified attribute a constraint probably meant (`matchAttribute`, `distinctAttribute`), among
    those the devices publish: the same name in another domain, a name of the same meaning, else the closest
    spelling of the name (in the domain closest to the one written)."""
    domain, _, ident = qualified.rpartition("/")
    by_id: dict[str, list[str]] = {}
    for name in sorted(set(published)):
        by_id.setdefault(name.rpartition("/")[2], []).append(name)

    def in_domain(meant: str) -> str:
        return closest(f"{domain}/{meant}", by_id[meant]) or by_id[meant][0]

    if ident in by_id:
        return in_domain(ident)
    for meant in _SYNONYMS.get(_key(ident), ()):
        if meant in by_id:
            return in_domain(meant)
    best = closest(ident, by_id)
    return in_domain(best) if best else None


# What users call an attribute or capacity, by meaning, -> the names drivers publish (NVIDIA's, ours and the
# Kubernetes-standard ones). Keys are compared lower-case without `_` and `-`.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("model", "gpumodel", "name", "product", "gpuname", "sku", "card", "gpu"), ("productName",)),
    **dict.fromkeys(("memory", "mem", "vram", "gpumemory", "memorysize", "memorycapacity", "totalmemory", "framebuffer",
                     "fb", "hbm", "ram"), ("memory",)),
    **dict.fromkeys(("arch", "gpuarch", "gpuarchitecture", "generation", "family"), ("architecture",)),
    **dict.fromkeys(("computecapability", "cc", "sm", "smversion", "capability"), ("cudaComputeCapability",)),
    **dict.fromkeys(("cuda", "cudaversion", "cudadriver"), ("cudaDriverVersion",)),
    **dict.fromkeys(("driver", "nvidiadriver", "driverrelease", "kernelmodule"), ("driverVersion",)),
    **dict.fromkeys(("numa", "socket", "numaid", "numadomain"), ("numaNode",)),
    **dict.fromkeys(("pci", "pciaddress", "busid", "pcibus", "bdf", "pcibusid"), ("pciBusID",)),
    **dict.fromkeys(("pcieroot", "rootcomplex", "pcieswitch"), ("pcieRoot",)),
    **dict.fromkeys(("mig", "migmode"), ("migEnabled", "migCapable")),
    **dict.fromkeys(("migprofile", "profilename", "slice"), ("profile",)),
    **dict.fromkeys(("sms", "smcount", "multiprocessorcount", "cores", "cudacores"), ("multiprocessors",)),
    **dict.fromkeys(("vendor", "manufacturer", "make"), ("brand",)),
    **dict.fromkeys(("nvlink", "nvlinkgroup", "clique", "fabric"), ("nvlinkDomain",)),
    **dict.fromkeys(("parent", "parentgpu", "gpuuuid", "parentid"), ("parentUUID",)),
    **dict.fromkeys(("id", "gpuid", "serial", "deviceid"), ("uuid",)),
    **dict.fromkeys(("kind", "devicetype", "class"), ("type",)),
}


def _key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def suggest(name: str, attributes: Mapping[str, Mapping[str, object]], capacity: Mapping[str, Mapping[str, object]]) -> str:
    """What a selector probably meant by a key the device lacks: the same name under another domain or in the
    other map (a capacity looked up as an attribute), a name of the same meaning (`model` -> productName,
    `vram` -> memory capacity), else the closest spelling. The CEL to write, or empty."""
    def where(target: str, exact: bool) -> str:
        # An attribute is named as such; a capacity, or the very key missing from one map but present in another
        # (a capacity looked up as an attribute, a wrong domain), as the CEL that reaches it.
        for kind, maps in (("attributes", attributes), ("capacity", capacity)):
            for domain, ids in sorted(maps.items()):
                if target in ids:
                    if kind == "attributes" and not exact:
                        return target
                    return f'device.{kind}["{domain}"].{target}' if domain else f"device.{kind}.{target}"
        return ""

    found = where(name, exact=True)
    if found:
        return found
    for meant in _SYNONYMS.get(_key(name), ()):
        found = where(meant, exact=False)
        if found:
            return found
    names = [n for domain in (*attributes.values(), *capacity.values()) for n in domain]
    best = closest(name, (n for n in names if n != name))
    return where(best, exact=False) if best else ""


def missing_key_hint(message: str, attributes: Mapping[str, Mapping[str, object]],
                     capacity: Mapping[str, Mapping[str, object]], device: str) -> str:
    """For a `no such key: NAME` runtime error: what the device does have, and what was probably meant (by meaning
    as well as by spelling). Empty otherwise.

    Appended after Kubernetes' text, e.g. "no such key: model; did you mean device.attributes["gpu.nvidia.com"]
    .productName? (device gpu-0 has attributes gpu.nvidia.com: architecture, brand, ...; capacity gpu.nvidia.com:
    memory)".
    """
    missing = _NO_SUCH_KEY.match(message)
    if not missing:
        return ""
    name = missing.group(1)
    best = suggest(name, attributes, capacity) or closest(name, (d for d in (*attributes, *capacity) if d and d != name))
    parts = [f"attributes {domain}: {', '.join(sorted(ids))}" for domain, ids in sorted(attributes.items()) if ids]
    parts += [f"capacity {domain}: {', '.join(sorted(ids))}" for domain, ids in sorted(capacity.items()) if ids]
    has = f"device {device} has " + ("; ".join(parts) if parts else "no attributes or capacity")
    return (f"; did you mean {best}?" if best else "") + f" ({has})"
