"""CDI specs for prepared claims: one transient spec file per claim in the dynamic CDI dir (/var/run/cdi).

- kind `k8s.gpu.nvidia.com/claim` (vendor `k8s.gpu.nvidia.com`, class `claim`): distinct from NVIDIA's static
  `nvidia.com/gpu` specs, so our per-claim devices never conflict with them.
- file `k8s.gpu.nvidia.com-claim_<claimUID>.json` (the helper's transient naming, `/` -> `_`), written atomically.
- device names `<claimUID>-<device name>`; fully-qualified IDs `k8s.gpu.nvidia.com/claim=<claimUID>-<device>`.
- cdiVersion: the lowest version the content needs (reference 5.1): container runtimes carry their own copy of
  the CDI library and reject versions they do not know. Claim UIDs often start with a digit, which needs 0.5.0.
- every device carries its own non-empty edits: `NVIDIA_VISIBLE_DEVICES=void`, the GPU node
  `/dev/nvidia<minor>`, the control nodes, for MIG devices the nvidia-caps access nodes of the GPU instance and
  compute instance, and sharing edits. `void` (as in the specs NVIDIA's tools generate) keeps the NVIDIA
  runtime, the default runtime on GPU Operator nodes, from injecting GPUs by that variable on top of what CDI
  injected; CDI alone decides what a container gets. The variable is the same in every device, so CDI's
  last-wins env merging cannot matter.
- device nodes carry type `c` and major/minor wherever the node's numbers are known (`DeviceNumbers`, read from
  /proc/devices and /proc/driver/nvidia/capabilities at prepare time, or given by the simulator): the runtime
  then creates the node in the container without stat-ing the host path, which matters for
  `/dev/nvidia-caps/nvidia-cap<N>` (usually absent on the host: the driver only creates capability nodes on
  demand) and `/dev/nvidia-uvm*` (absent until something loads nvidia-uvm's nodes). A GPU or control node whose
  major is unknown is named by path only (the runtime then needs it on the host, as containerd and CRI-O stat
  it); `/dev/nvidia-uvm*` are left out when nvidia-uvm is not loaded (no major in /proc/devices): naming them
  would fail every container with "failed to stat CDI host device".
- the spec's top-level containerEdits carry what every device needs from the host driver install (libraries,
  binaries, firmware, IPC sockets and the nvidia-cdi-hook hooks; driver/driverfiles.py), so that a runtime with
  plain CDI support and no NVIDIA runtime hook still gives the container a working CUDA; empty on the simulator.

MIG capability minors are read from the driver (`DeviceFileMinor` in
/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<GI>/access and .../gi<GI>/ci<CI>/access, the major of
`nvidia-caps` from /proc/devices), as NVIDIA's plugin does. Where the driver does not say (the simulator), the
kernel module's fixed table (/proc/driver/nvidia-caps/mig-minors) gives them: `config` 1, `monitor` 2, then per
GPU minor 15 GPU instances of 9 entries each (the GI `access` entry and 8 compute instances):
gi access = 3 + 135*gpu_minor + 9*gi, ci access = gi access + 1 + ci.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudra.atomicfile import atomic_write

CDI_VENDOR = "k8s.gpu.nvidia.com"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"

NVIDIA_CAPS_DIR = "/dev/nvidia-caps"
_MIG_MINORS_PER_GI = 9  # the GI's access entry + 8 compute instances
_MIG_GIS_PER_GPU = 15
_MIG_FIRST_MINOR = 3  # after config (1) and monitor (2)

NVIDIA_MAJOR = 195  # the GPU and control nodes' major, fixed by the driver (registered as nvidia-frontend/nvidia)
NVIDIACTL_MINOR = 255  # /dev/nvidia<N> has minor N; the control node the last minor of the same major

KNOWN_VERSIONS: tuple[str, ...] = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_NAME_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV = re.compile(r"^[^=]+=")
HOOK_NAMES: tuple[str, ...] = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


def mig_cap_minors(gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> tuple[int, int]:
    """(GI access minor, CI access minor) of /dev/nvidia-caps/nvidia-cap<N> for one MIG device."""
    gi = _MIG_FIRST_MINOR + _MIG_GIS_PER_GPU * _MIG_MINORS_PER_GI * gpu_minor + _MIG_MINORS_PER_GI * gpu_instance_id
    return gi, gi + 1 + compute_instance_id


def _char_node(path: str, major: int, minor: int, mode: int | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"path": path, "type": "c", "major": major, "minor": minor}
    if mode is not None:
        node["fileMode"] = mode
    return node


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors by driver name from /proc/devices (block devices are ignored)."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def parse_capability_file(text: str) -> dict[str, int]:
    """`DeviceFileMinor: 22`, `DeviceFileMode: 292`, ... of one /proc/driver/nvidia/capabilities access file."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[key.strip()] = int(value.strip())
    return out


@dataclass(frozen=True)
class DeviceNumbers:
    """What the driver says about its device nodes; the I/O edge of the spec, read at prepare time.

    `majors` maps /proc/devices names (`nvidia-frontend`/`nvidia`, `nvidia-uvm`, `nvidia-caps`) to majors;
    `caps_dir` is /proc/driver/nvidia/capabilities (None: not available)."""

    majors: Mapping[str, int] = field(default_factory=dict)
    caps_dir: Path | None = None

    @classmethod
    def read(cls, proc_root: Path = Path("/proc")) -> "DeviceNumbers":
        try:
            majors = parse_proc_devices((proc_root / "devices").read_text())
        except OSError:
            majors = {}
        caps = proc_root / "driver/nvidia/capabilities"
        return cls(majors, caps if caps.is_dir() else None)

    @property
    def gpu_major(self) -> int | None:
        # Older drivers register the GPU nodes' major (195) as `nvidia-frontend`, newer ones as `nvidia`.
        return self.majors.get("nvidia-frontend", self.majors.get("nvidia"))

    def gpu_node(self, gpu_minor: int) -> dict[str, Any]:
        major = self.gpu_major
        path = f"/dev/nvidia{gpu_minor}"
        return _char_node(path, major, gpu_minor) if major is not None else {"path": path}

    def control_nodes(self) -> list[dict[str, Any]]:
        """/dev/nvidiactl, and /dev/nvidia-uvm{,-tools} only when nvidia-uvm is loaded."""
        major, uvm = self.gpu_major, self.majors.get("nvidia-uvm")
        nodes = [_char_node("/dev/nvidiactl", major, NVIDIACTL_MINOR) if major is not None else {"path": "/dev/nvidiactl"}]
        if uvm is not None:
            nodes += [_char_node("/dev/nvidia-uvm", uvm, 0), _char_node("/dev/nvidia-uvm-tools", uvm, 1)]
        return nodes

    def gpu_nodes(self, gpu_minor: int) -> list[dict[str, Any]]:
        """The GPU's node and the control nodes."""
        return [self.gpu_node(gpu_minor), *self.control_nodes()]

    def mig_nodes(self, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> list[dict[str, Any]]:
        """The GI and CI access nodes, with the driver's minors and major when it publishes them.

        Raises CapabilityError when the driver has capability files but not this MIG device's (it is gone)."""
        major = self.majors.get("nvidia-caps")
        if self.caps_dir is None or major is None:
            # The kernel module's fixed table; with the major known the nodes are typed (absent on the host).
            gi_minor, ci_minor = mig_cap_minors(gpu_minor, gpu_instance_id, compute_instance_id)
            paths = (f"{NVIDIA_CAPS_DIR}/nvidia-cap{gi_minor}", f"{NVIDIA_CAPS_DIR}/nvidia-cap{ci_minor}")
            if major is None:
                return [{"path": p} for p in paths]
            return [_char_node(paths[0], major, gi_minor, 0o444), _char_node(paths[1], major, ci_minor, 0o444)]
        gi_dir = self.caps_dir / f"gpu{gpu_minor}" / "mig" / f"gi{gpu_instance_id}"
        nodes = []
        for path in (gi_dir / "access", gi_dir / f"ci{compute_instance_id}" / "access"):
            try:
                info = parse_capability_file(path.read_text())
            except OSError as exc:
                raise CapabilityError(f"{path}: cannot read the MIG capability: {exc}") from exc
            if "DeviceFileMinor" not in info:
                raise CapabilityError(f"{path}: no DeviceFileMinor line")
            minor = info["DeviceFileMinor"]
            nodes.append(_char_node(f"{NVIDIA_CAPS_DIR}/nvidia-cap{minor}", major, minor, info.get("DeviceFileMode")))
        return nodes


    def capability_node(self, name: str) -> dict[str, Any]:
        """The /dev/nvidia-caps node of a driver capability other than MIG's (`fabric-imex-mgmt`: what the IMEX
        daemon opens), typed with the driver's minor and mode from /proc/driver/nvidia/capabilities/<name>.

        Raises CapabilityError naming what is missing (the capability file, its minor or the nvidia-caps major)."""
        major = self.majors.get("nvidia-caps")
        if self.caps_dir is None:
            raise CapabilityError(f"the driver publishes no capabilities (no /proc/driver/nvidia/capabilities): the "
                                  f"{name} device node cannot be given")
        path = self.caps_dir / name
        try:
            info = parse_capability_file(path.read_text())
        except OSError as exc:
            raise CapabilityError(f"{path}: cannot read the {name} capability: {exc}") from exc
        if "DeviceFileMinor" not in info:
            raise CapabilityError(f"{path}: no DeviceFileMinor line")
        if major is None:
            raise CapabilityError(f"/proc/devices names no nvidia-caps major: the {name} device node cannot be typed")
        minor = info["DeviceFileMinor"]
        return _char_node(f"{NVIDIA_CAPS_DIR}/nvidia-cap{minor}", major, minor, info.get("DeviceFileMode"))


class CapabilityError(OSError):
    """A MIG device's capability files could not be read; the message names the file."""


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def qualified_id(name: str) -> str:
    return f"{CDI_KIND}={name}"


def spec_file_name(claim_uid: str) -> str:
    return f"{SPEC_PREFIX}{claim_uid}.json"


@dataclass(frozen=True)
class DeviceEdits:
    """What one prepared device adds to a container."""

    device_name: str  # the DRA device name
    uuid: str  # GPU-... or MIG-...
    gpu_minor: int
    mig: tuple[int, int] | None = None  # (gpu instance id, compute instance id) for MIG devices
    env: Mapping[str, str] = field(default_factory=dict)  # sharing env, e.g. CUDA_MPS_PIPE_DIRECTORY
    mounts: Sequence[Mapping[str, Any]] = ()  # sharing mounts: {hostPath, containerPath, options}


def claim_spec(
    claim_uid: str, devices: Sequence[DeviceEdits], common: Mapping[str, Any] | None = None,
    numbers: DeviceNumbers | None = None,
) -> dict[str, Any]:
    """The CDI spec of one claim (pure).

    `common` holds edits for every device (the driver's libraries, binaries and hooks, see driver/driverfiles.py);
    they go to the spec's top-level containerEdits, which a runtime applies whenever any of its devices is
    requested, so a container that gets several of the claim's devices gets them once. `numbers` gives the
    device nodes their type and numbers (None: paths only)."""
    if not devices:
        raise ValueError(f"claim {claim_uid}: a CDI spec needs at least one device")
    numbers = numbers or DeviceNumbers()
    out_devices = []
    for d in devices:
        env = ["NVIDIA_VISIBLE_DEVICES=void"] + [f"{k}={v}" for k, v in sorted(d.env.items())]
        nodes = numbers.gpu_nodes(d.gpu_minor)
        if d.mig is not None:
            nodes += numbers.mig_nodes(d.gpu_minor, *d.mig)
        edits: dict[str, Any] = {"env": env, "deviceNodes": nodes}
        if d.mounts:
            edits["mounts"] = [dict(m) for m in d.mounts]
        out_devices.append({"name": cdi_device_name(claim_uid, d.device_name), "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": out_devices}
    if common:
        spec["containerEdits"] = {k: list(v) for k, v in common.items() if v}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.lstrip("v").split("."))


def _edits(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    if isinstance(spec.get("containerEdits"), Mapping):
        yield spec["containerEdits"]
    for d in spec.get("devices") or []:
        if isinstance(d, Mapping) and isinstance(d.get("containerEdits"), Mapping):
            yield d["containerEdits"]


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion whose format covers everything in the spec (reference table 5.1)."""
    need = "0.3.0"

    def at_least(v: str) -> None:
        nonlocal need
        if _version_key(v) > _version_key(need):
            need = v

    kind = str(spec.get("kind", ""))
    if "." in kind.partition("/")[2] or spec.get("annotations"):
        at_least("0.6.0")
    for d in spec.get("devices") or []:
        if not isinstance(d, Mapping):
            continue
        if str(d.get("name", ""))[:1].isdigit():
            at_least("0.5.0")
        if d.get("annotations"):
            at_least("0.6.0")
    for e in _edits(spec):
        if any(isinstance(m, Mapping) and m.get("type") for m in e.get("mounts") or []):
            at_least("0.4.0")
        if any(isinstance(n, Mapping) and n.get("hostPath") for n in e.get("deviceNodes") or []):
            at_least("0.5.0")
        if e.get("intelRdt") is not None or e.get("additionalGids"):
            at_least("0.7.0")
        rdt = e.get("intelRdt")
        if e.get("netDevices") or (isinstance(rdt, Mapping) and ("schemata" in rdt or "enableMonitoring" in rdt)):
            at_least("1.1.0")
    return need


def validate_spec(spec: Any) -> list[str]:
    """Check a spec against the CDI rules we rely on (reference section 5); used on our own output in tests."""
    errors: list[str] = []
    if not isinstance(spec, Mapping):
        return ["spec: must be an object"]
    allowed_top = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
    errors += [f"{k}: unknown field" for k in spec if k not in allowed_top]
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or version.lstrip("v") not in KNOWN_VERSIONS:
        errors.append(f"cdiVersion: {version!r} is not a known CDI version ({', '.join(KNOWN_VERSIONS)})")
    elif _version_key(version) < _version_key(minimum_version(spec)):
        errors.append(f"cdiVersion: {version} is lower than {minimum_version(spec)}, which the content needs")
    kind = spec.get("kind")
    vendor, slash, cls = str(kind).partition("/")
    if not isinstance(kind, str) or not slash or not _NAME_PART.match(vendor) or not _NAME_PART.match(cls):
        errors.append(f"kind: {kind!r} must be <vendor>/<class> (letters first, then letters, digits, '_', '.', '-')")
    elif len(vendor) > 253 or len(cls) > 63:
        errors.append(f"kind: {kind!r}: vendor at most 253 and class at most 63 characters")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        errors.append("devices: at least one device is required")
        devices = []
    seen: set[str] = set()
    for i, d in enumerate(devices):
        path = f"devices[{i}]"
        if not isinstance(d, Mapping):
            errors.append(f"{path}: must be an object")
            continue
        errors += [f"{path}.{k}: unknown field" for k in d if k not in {"name", "annotations", "containerEdits"}]
        name = d.get("name")
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            errors.append(f"{path}.name: {name!r} must start and end with a letter or digit, middle [A-Za-z0-9_.:-]")
        elif name in seen:
            errors.append(f"{path}.name: {name!r} is not unique in the spec")
        else:
            seen.add(name)
        edits = d.get("containerEdits")
        if not isinstance(edits, Mapping) or not any(edits.get(k) for k in edits):
            errors.append(f"{path}.containerEdits: empty device edits")
        else:
            errors += _validate_edits(edits, f"{path}.containerEdits")
    if isinstance(spec.get("containerEdits"), Mapping):
        errors += _validate_edits(spec["containerEdits"], "containerEdits")
    return errors


def _validate_edits(edits: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    allowed = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}
    errors += [f"{path}.{k}: unknown field" for k in edits if k not in allowed]
    for j, env in enumerate(edits.get("env") or []):
        if not isinstance(env, str) or not _ENV.match(env):
            errors.append(f"{path}.env[{j}]: {env!r} must be NAME=VALUE")
    for j, node in enumerate(edits.get("deviceNodes") or []):
        p = node.get("path") if isinstance(node, Mapping) else None
        if not isinstance(p, str) or not p.startswith("/"):
            errors.append(f"{path}.deviceNodes[{j}].path: required, an absolute path")
        if isinstance(node, Mapping):
            if node.get("type", "") not in ("", "b", "c", "u", "p"):
                errors.append(f"{path}.deviceNodes[{j}].type: must be one of '', b, c, u, p")
            perms = node.get("permissions", "")
            if perms not in ("", "none") and (not isinstance(perms, str) or set(perms) - set("rwm")):
                errors.append(f"{path}.deviceNodes[{j}].permissions: must be a subset of 'rwm' or 'none'")
    for j, m in enumerate(edits.get("mounts") or []):
        if not isinstance(m, Mapping) or not m.get("hostPath") or not m.get("containerPath"):
            errors.append(f"{path}.mounts[{j}]: hostPath and containerPath are required")
            continue
        errors += [f"{path}.mounts[{j}].{k}: unknown field" for k in m if k not in {"hostPath", "containerPath", "options", "type"}]
        options = m.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            errors.append(f"{path}.mounts[{j}].options: must be a list of strings")
    for j, h in enumerate(edits.get("hooks") or []):
        where = f"{path}.hooks[{j}]"
        if not isinstance(h, Mapping):
            errors.append(f"{where}: must be an object")
            continue
        errors += [f"{where}.{k}: unknown field" for k in h if k not in {"hookName", "path", "args", "env", "timeout"}]
        if h.get("hookName") not in HOOK_NAMES:
            errors.append(f"{where}.hookName: {h.get('hookName')!r} must be one of {', '.join(HOOK_NAMES)}")
        if not isinstance(h.get("path"), str) or not h["path"].startswith("/"):
            errors.append(f"{where}.path: required, an absolute path")
        args = h.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            errors.append(f"{where}.args: must be a list of strings")
        for k, env in enumerate(h.get("env") or []):
            if not isinstance(env, str) or not _ENV.match(env):
                errors.append(f"{where}.env[{k}]: {env!r} must be NAME=VALUE")
        timeout = h.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
            errors.append(f"{where}.timeout: {timeout!r} must be a whole number of seconds above 0")
    return errors


# ---- files -----------------------------------------------------------------------------------------------


def write_claim_spec(cdi_dir: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / spec_file_name(claim_uid)
    # Runtimes read the spec as another user: 0644 like every other CDI spec. Renamed into place so a reader
    # never sees half a spec; not fsynced, because the CDI dir is tmpfs on real nodes and the preparer rewrites
    # the specs of all completed claims at every start anyway.
    atomic_write(path, json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n", mode=0o644, durable=False)
    return path


def remove_claim_spec(cdi_dir: Path, claim_uid: str) -> bool:
    try:
        os.unlink(cdi_dir / spec_file_name(claim_uid))
    except FileNotFoundError:
        return False
    return True


def claim_spec_uids(cdi_dir: Path) -> set[str]:
    """Claim UIDs that have one of our spec files in cdi_dir."""
    try:
        names = os.listdir(cdi_dir)
    except FileNotFoundError:
        return set()
    return {n[len(SPEC_PREFIX) : -len(".json")] for n in names if n.startswith(SPEC_PREFIX) and n.endswith(".json")}


def remove_orphans(cdi_dir: Path, keep: Iterable[str]) -> list[str]:
    """Delete our spec files whose claim is not in `keep` (no checkpoint entry); returns the removed UIDs."""
    keep_set = set(keep)
    removed = []
    for uid in sorted(claim_spec_uids(cdi_dir) - keep_set):
        if remove_claim_spec(cdi_dir, uid):
            removed.append(uid)
    # Temp files of an interrupted atomic write are orphans too.
    try:
        for name in os.listdir(cdi_dir):
            if name.startswith(f".{SPEC_PREFIX}") and ".tmp-" in name:
                os.unlink(cdi_dir / name)
    except FileNotFoundError:
        pass
    return removed
