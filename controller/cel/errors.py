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
