"""kube-apiserver's Pod validation (pkg/apis/core/validation ValidatePodSpec), the part that keeps a name or a
port a kubelet would turn into a host path or a socket from being stored: container, init and ephemeral
container names (DNS-1123 labels, unique across all three), volume names, ports, env var names, restartPolicy.
Required fields (containers, image) are not enforced: see pod_spec_errors.
Workload templates (Deployment, ReplicaSet, StatefulSet, Job, CronJob) are checked the same way."""

from __future__ import annotations

import json
import re
from typing import Any

from controlplane import status as st
from controlplane.admission.request import AdmissionRequest
from gpudra.validation.names import dns1123_label

_PROTOCOLS = ("SCTP", "TCP", "UDP")
# The handler types of a lifecycle hook and of a probe (validateHandler counts them: exactly one).
_HOOK_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")
_PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_RESTART_POLICIES = ("Always", "Never", "OnFailure")
_IANA_LETTER = re.compile(r"[a-z]")
_IANA_CHARS = re.compile(r"^[-a-z0-9]+$")
# Where each kind keeps its pod spec.
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def _q(value: Any) -> str:
    return json.dumps(value)


def _port_name_errors(name: str) -> list[str]:
    """validation.IsValidPortName (IANA_SVC_NAME)."""
    errors = []
    if len(name) > 15:
        errors.append("must be no more than 15 characters")
    if not _IANA_CHARS.match(name):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in name:
        errors.append("must not contain consecutive hyphens")
    if not _IANA_LETTER.search(name):
        errors.append("must contain at least one letter (a-z)")
    if name.startswith("-") or name.endswith("-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def _env_name_errors(name: str) -> list[str]:
    """validation.IsRelaxedEnvVarName (RelaxedEnvironmentVariableValidation, GA in 1.34)."""
    if any(ch == "=" or not (" " <= ch <= "~") for ch in name):
        return ["a valid environment variable name must consist only of printable ASCII characters other than '='"]
    return []


def _handler_errors(handler: Any, path: str, kinds: tuple[str, ...]) -> list[str]:
    if not isinstance(handler, dict):
        return []
    given = [k for k in kinds if handler.get(k) is not None]
    if not given:
        return [f"{path}: Required value: must specify a handler type"]
    if len(given) > 1:
        return [f"{path}.{given[1]}: Forbidden: may not specify more than 1 handler type"]
    action = handler[given[0]]
    if given[0] == "exec" and not (isinstance(action, dict) and action.get("command")):
        return [f"{path}.exec.command: Required value"]
    return []


def _container_errors(c: Any, path: str) -> list[str]:
    if not isinstance(c, dict):
        return [f"{path}: Invalid value: must be an object"]
    errors = []
    name = c.get("name")
    if not name:
        errors.append(f"{path}.name: Required value")
    else:
        errors.extend(f"{path}.name: Invalid value: {_q(name)}: {e}" for e in dns1123_label(str(name)))
    names: set[str] = set()
    for j, port in enumerate(c.get("ports") or []):
        p = f"{path}.ports[{j}]"
        pname = port.get("name")
        if pname:
            errors.extend(f"{p}.name: Invalid value: {_q(pname)}: {e}" for e in _port_name_errors(str(pname)))
            if pname in names:
                errors.append(f"{p}.name: Duplicate value: {_q(pname)}")
            names.add(pname)
        for field in ("containerPort", "hostPort"):
            value = port.get(field)
            if field == "containerPort" and not value:
                errors.append(f"{p}.containerPort: Required value")
            elif value is not None and value != 0 and not (isinstance(value, int) and 1 <= value <= 65535):
                errors.append(f"{p}.{field}: Invalid value: {value}: must be between 1 and 65535, inclusive")
        protocol = port.get("protocol")
        if protocol is not None and protocol not in _PROTOCOLS:
            errors.append(f"{p}.protocol: Unsupported value: {_q(protocol)}: supported values: "
                          + ", ".join(_q(x) for x in _PROTOCOLS))
    for j, env in enumerate(c.get("env") or []):
        ename = env.get("name") if isinstance(env, dict) else None
        if not ename:
            errors.append(f"{path}.env[{j}].name: Required value")
        else:
            errors.extend(f"{path}.env[{j}].name: Invalid value: {_q(ename)}: {e}" for e in _env_name_errors(ename))
    for j, mount in enumerate(c.get("volumeMounts") or []):
        if not mount.get("name"):
            errors.append(f"{path}.volumeMounts[{j}].name: Required value")
        if not mount.get("mountPath"):
            errors.append(f"{path}.volumeMounts[{j}].mountPath: Required value")
    lifecycle = c.get("lifecycle")
    if isinstance(lifecycle, dict):
        for hook in ("postStart", "preStop"):
            errors.extend(_handler_errors(lifecycle.get(hook), f"{path}.lifecycle.{hook}", _HOOK_HANDLERS))
    for probe in _PROBES:
        errors.extend(_handler_errors(c.get(probe), f"{path}.{probe}", _PROBE_HANDLERS))
    return errors


def pod_spec_errors(spec: Any, path: str) -> list[str]:
    """What is given is checked; what is missing (no containers, no image) is not refused here, because the
    testbed's pods and many tests' pods are sketches (kube-apiserver refuses those too: a known leniency)."""
    if not isinstance(spec, dict):
        return []
    errors: list[str] = []
    seen: set[str] = set()
    volume_names: set[str] = set()
    for i, vol in enumerate(spec.get("volumes") or []):
        vname = vol.get("name") if isinstance(vol, dict) else None
        p = f"{path}.volumes[{i}].name"
        if not vname:
            errors.append(f"{p}: Required value")
            continue
        errors.extend(f"{p}: Invalid value: {_q(vname)}: {e}" for e in dns1123_label(str(vname)))
        if vname in volume_names:
            errors.append(f"{p}: Duplicate value: {_q(vname)}")
        volume_names.add(vname)
    for part in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(part) or []):
            p = f"{path}.{part}[{i}]"
            errors.extend(_container_errors(c, p))
            if part == "initContainers" and isinstance(c, dict) and c.get("restartPolicy") != "Always":
                errors.extend(f"{p}.{field}: Forbidden: may not be set for init containers without restartPolicy=Always"
                              for field in ("lifecycle", *_PROBES) if c.get(field) is not None)
            name = c.get("name") if isinstance(c, dict) else None
            if name:
                if name in seen:
                    errors.append(f"{p}.name: Duplicate value: {_q(name)}")
                seen.add(name)
            for j, mount in enumerate((c.get("volumeMounts") if isinstance(c, dict) else None) or []):
                if mount.get("name") and mount["name"] not in volume_names:
                    errors.append(f"{p}.volumeMounts[{j}].name: Not found: {_q(mount['name'])}")
    policy = spec.get("restartPolicy")
    if policy is not None and policy != "" and policy not in _RESTART_POLICIES:
        errors.append(f"{path}.restartPolicy: Unsupported value: {_q(policy)}: supported values: "
                      + ", ".join(_q(x) for x in _RESTART_POLICIES))
    return errors


class PodSpecPlugin:
    kinds = frozenset((group, kind) for kind in _TEMPLATE_PATHS for group in ("", "apps", "batch"))

    def admit(self, req: AdmissionRequest, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              warnings: list[str]) -> None:
        keys = _TEMPLATE_PATHS.get(req.rt.kind)
        if keys is None or obj is None or req.subresource or req.rt.group not in ("", "apps", "batch"):
            return
        if req.operation not in ("CREATE", "UPDATE"):
            return
        spec: Any = obj
        for key in keys:
            spec = spec.get(key) if isinstance(spec, dict) else None
        if req.operation == "UPDATE" and old is not None:
            before: Any = old
            for key in keys:
                before = before.get(key) if isinstance(before, dict) else None
            if before == spec:
                return
        errors = pod_spec_errors(spec, ".".join(keys))
        if errors:
            raise st.invalid(req.rt, req.name, errors)
