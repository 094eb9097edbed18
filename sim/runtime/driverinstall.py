"""A simulated NVIDIA driver install for a `--nvml sim:` node: what its agent's `--driver-root` points at.

It holds one file, `usr/bin/nvidia-smi`, a POSIX shell script (busybox's sh runs it) that the node agent's
driver-file discovery puts into every claim's CDI spec like the real binary. In a container it lists, in the
real `nvidia-smi -L` format, the GPUs and MIG devices this container was given, with the names and UUIDs the
simulator reports for this node: a GPU is listed when its device node /dev/nvidia<minor> is a character device in
the container, a MIG device when its compute instance's /dev/nvidia-caps access node is too (the real driver's
rule), and when NVIDIA_VISIBLE_DEVICES lists UUIDs, only devices named there (or whose MIG devices are) are
listed. Nothing else in the container is looked at, so the output is the container's own view.

MIG devices created later (partitionable GPUs, on demand at prepare) are known in advance: the simulator names a
MIG device by its GPU, profile and placement, so the table holds every placement of every profile of a
MIG-capable GPU. Where two profiles share a placement (hence a cap node), such a row is listed only when
NVIDIA_VISIBLE_DEVICES names its UUID; the agent's claim specs set it to `void` (the NVIDIA runtime must not
inject by it), so for those the install is written again once the MIG device exists (`write` with the new
inventory), which lists it as existing.

Real nodes never get this: the agent with `--nvml real` reads the host's install.
"""

from __future__ import annotations

import sys
from pathlib import Path

from driver.cdi import NVIDIA_MAJOR, mig_cap_minors
from driver.inventory import Inventory
from sim.nvml.simulator import SIM_CAPS_MAJOR, SIM_UVM_MAJOR, gpu_instance_id, mig_uuid
from sim.runtime.sharedobject import soname_image

NVIDIA_SMI = "usr/bin/nvidia-smi"
NVIDIA_IMEX = "usr/bin/nvidia-imex"
NVIDIA_IMEX_CTL = "usr/bin/nvidia-imex-ctl"
IMEX_CHANNELS_MAJOR = 509  # a simulated driver's dynamic major for nvidia-caps-imex-channels
# The fabric-imex-mgmt capability's minor under /dev/nvidia-caps (a simulated driver's; past the MIG minors).
FABRIC_IMEX_MGMT_MINOR = 4094
NVML_LIBRARY_DIR = "usr/lib64"
CAPABILITIES_DIR = "proc/driver/nvidia/capabilities"

_SCRIPT = r"""#!/bin/sh
# nvidia-smi of the gpu-dra simulator's driver install (node NODE, driver DRIVER_VERSION): lists the GPUs and MIG
# devices whose device nodes this container has, filtered by NVIDIA_VISIBLE_DEVICES when it lists UUIDs.
case "${1-}" in
  -L|--list-gpus|"") ;;
  *) echo "nvidia-smi (gpu-dra simulator): only -L / --list-gpus is simulated" >&2; exit 2 ;;
esac
visible="${NVIDIA_VISIBLE_DEVICES-}"
case "$visible" in all|none|void|"") visible="" ;; esac
named() {
  [ -z "$visible" ] && return 0
  for u in "$@"; do case ",$visible," in *",$u,"*) return 0 ;; esac; done
  return 1
}
if [ -z "${1-}" ]; then
  echo "NVIDIA-SMI DRIVER_VERSION (gpu-dra simulator)    Driver Version: DRIVER_VERSION"
fi
out=""; index=0; found=0
while IFS='|' read -r minor uuid name migs; do
  [ -c "/dev/nvidia$minor" ] || continue
  lines=""; n=0; mig_uuids=""
  for m in $migs; do
    ci=${m%%:*}; rest=${m#*:}; profile=${rest%%:*}; rest=${rest#*:}; muuid=${rest%%:*}; strict=${rest#*:}
    [ -c "/dev/nvidia-caps/nvidia-cap$ci" ] || continue
    if [ "$strict" = 1 ]; then [ -n "$visible" ] && named "$muuid" || continue; fi
    named "$uuid" "$muuid" || continue
    lines="$lines$(printf '  MIG %-12s Device %2d: (UUID: %s)' "$profile" "$n" "$muuid")
"
    mig_uuids="$mig_uuids $muuid"; n=$((n + 1))
  done
  named "$uuid" $mig_uuids || continue
  printf 'GPU %d: %s (UUID: %s)\n' "$index" "$name" "$uuid"
  printf '%s' "$lines"
  index=$((index + 1)); found=1
done <<'TABLE'
ROWS
TABLE
if [ "$found" = 0 ]; then echo "No devices were found"; exit 6; fi
exit 0
"""


def script(node: str, inventory: Inventory) -> str:
    """The nvidia-smi script for this node's GPUs (pure)."""
    rows = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        existing: dict[int, tuple[str, str]] = {}
        for mig in gpu.mig_devices:
            _, ci_minor = mig_cap_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
            existing[ci_minor] = (mig.profile, mig.uuid)
        possible: dict[int, list[tuple[str, str]]] = {}
        for profile in gpu.mig_profiles if gpu.mig_capable else ():
            for pl in profile.placements:
                _, ci_minor = mig_cap_minors(gpu.minor, gpu_instance_id(pl.start, pl.size), 0)
                if ci_minor not in existing:
                    possible.setdefault(ci_minor, []).append((profile.name, mig_uuid(gpu.uuid, profile.name, pl.start)))
        migs = [f"{ci}:{profile}:{uuid}:0" for ci, (profile, uuid) in sorted(existing.items())]
        migs += [f"{ci}:{profile}:{uuid}:{int(len(rows_) > 1)}" for ci, rows_ in sorted(possible.items())
                 for profile, uuid in rows_]
        rows.append(f"{gpu.minor}|{gpu.uuid}|{gpu.product_name}|{' '.join(migs)}")
    return (_SCRIPT.replace("NODE", node).replace("DRIVER_VERSION", inventory.driver_version or "unknown")
            .replace("ROWS", "\n".join(rows)))


def _python_tool(module: str, call: str, interpreter: str) -> str:
    """A program running one of the simulator's tools with `interpreter`: this one where the daemon pod's command
    runs on the host (the embedded runtime: sim.runtime.hostprocess), the testbed image's where it runs in a
    container (the upstream backend: the image has the `sim` package; the repository path is then absent)."""
    repo = Path(__file__).resolve().parents[2]
    return (f"#!{interpreter}\n# {module}: gpu-dra simulator stand-in\nimport sys\nsys.path.insert(0, {str(repo)!r})\n"
            f"from {module} import main\nsys.exit({call})\n")


def write(root: Path, node: str, inventory: Inventory, faults: Path | None = None, *,
          container_python: str | None = None) -> Path:
    """Create the install under `root` (the agent's --driver-root and --host-driver-root); returns root. Nodes
    with NVLink-fabric GPUs also get `nvidia-imex` and `nvidia-imex-ctl` (sim.imex), the driver's NVML library
    (sim.runtime.sharedobject) and its procfs (device majors, the fabric-imex-mgmt capability); the daemon learns
    the node's fabric state from `faults` (the node's simulated NVML faults file), as a real one from the driver,
    and refuses to start without the device nodes and library a real one needs (sim.imex.daemon.missing).
    `container_python`: the tools run in containers (the upstream backend) with this interpreter of the testbed
    image, not on the host with this one (the embedded runtime's sim.runtime.hostprocess)."""
    path = root / NVIDIA_SMI
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script(node, inventory))
    path.chmod(0o755)
    if any(g.fabric_clique_id is not None for g in inventory.gpus):
        uuids = sorted(g.uuid for g in inventory.gpus)
        fabric = f"({str(faults)!r}, frozenset({uuids!r}))" if faults is not None else "None"
        # Run on the host, the daemon reads the capability from the driver's procfs here; in a container (whose
        # procfs is the host kernel's, without this driver) it is given what that file publishes.
        capability = (FABRIC_IMEX_MGMT_MINOR, SIM_CAPS_MAJOR) if container_python else str(
            root / CAPABILITIES_DIR / "fabric-imex-mgmt")
        needs = f"({len(uuids)}, {capability!r})"
        tools = ((NVIDIA_IMEX, "sim.imex.daemon", f"main(sys.argv[1:], fabric={fabric}, needs={needs})"),
                 (NVIDIA_IMEX_CTL, "sim.imex.ctl", "main(sys.argv[1:])"))
        for rel, module, call in tools:
            tool = root / rel
            tool.write_text(_python_tool(module, call, container_python or sys.executable))
            tool.chmod(0o755)
        # The driver's procfs: the majors of its devices (nvidia-caps and the IMEX channels' are dynamic on a real
        # node) and the fabric-imex-mgmt capability the IMEX daemon opens.
        proc = root / "proc" / "devices"
        proc.parent.mkdir(parents=True, exist_ok=True)
        proc.write_text(f"Character devices:\n{NVIDIA_MAJOR} nvidia-frontend\n{SIM_UVM_MAJOR} nvidia-uvm\n"
                        f"{SIM_CAPS_MAJOR} nvidia-caps\n{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n\n"
                        "Block devices:\n")
        caps = root / CAPABILITIES_DIR
        caps.mkdir(parents=True, exist_ok=True)
        (caps / "fabric-imex-mgmt").write_text(f"DeviceFileMinor: {FABRIC_IMEX_MGMT_MINOR}\nDeviceFileMode: 256\n"
                                               "DeviceFileModify: 1\n")
        # The driver's NVML, which nvidia-imex is linked against: found, mounted and looked for by its soname.
        version = inventory.driver_version or "0"
        library = root / NVML_LIBRARY_DIR / f"libnvidia-ml.so.{version}"
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_bytes(soname_image("libnvidia-ml.so.1"))
    return root
