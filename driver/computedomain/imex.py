"""What the node plugin prepares for a domain's IMEX daemon: its config directory `<state>/<domain uid>/` (the
daemon pod's /imexd) holding NVIDIA's IMEX config template `imexd.cfg.tmpl` (the keys and values of NVIDIA's
compute-domain-daemon config template, with its two Go template fields, which the daemon fills in:
driver.computedomain.daemon), the driver's `nvidia-imex` / `nvidia-imex-ctl` that the daemon's CDI spec
mounts (the host's install on a GB200 node; the simulator's stand-ins on a simulated one), and the device nodes
and driver files nvidia-imex needs beside them (`daemon_edits`). Nothing here runs nvidia-imex: the daemon pod
does.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.cdi import CapabilityError, DeviceNumbers
from driver.driverfiles import DriverFiles
from driver.driverroot import DriverRoot, DriverRootError
from gpudra.atomicfile import atomic_write
from gpudra.computedomain import CHANNEL_DEVICE_DIR

SERVER_PORT = 50000
CMD_PORT = 50005
IMEX_BIN = "usr/bin/nvidia-imex"
IMEX_CTL_BIN = "usr/bin/nvidia-imex-ctl"
TEMPLATE_NAME = "imexd.cfg.tmpl"
# The driver's capability the IMEX daemon opens (/proc/driver/nvidia/capabilities/fabric-imex-mgmt).
FABRIC_IMEX_CAPABILITY = "fabric-imex-mgmt"


class ImexError(Exception):
    pass


def config_template() -> str:
    """imexd.cfg.tmpl: NVIDIA's values; the bind IP is left empty (taken from the nodes config), the command
    service binds the pod's IP and the nodes config path is the daemon's."""
    lines = {
        "LOG_LEVEL": "4", "LOG_FILE_NAME": "", "LOG_APPEND_TO_LOG": "0", "DAEMONIZE": "0", "BIND_INTERFACE_IP": "",
        "SERVER_PORT": str(SERVER_PORT), "IMEX_NODE_CONFIG_FILE": "{{ .IMEXDaemonNodesConfigPath }}",
        "IMEX_WAIT_FOR_QUORUM": "RECOVERY", "IMEX_ENABLE_AUTH_ENCRYPTION": "0", "IMEX_CMD_ENABLED": "1",
        "IMEX_CMD_BIND_INTERFACE_IP": "{{ .IMEXCmdBindInterfaceIP }}", "IMEX_CMD_PORT": str(CMD_PORT),
        "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def write_domain_dir(state_dir: Path, domain: str) -> Path:
    directory = state_dir / domain
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / TEMPLATE_NAME, config_template().encode(), mode=0o644)
    return directory


def binaries(driver_root: Path | None, host_root: str = "/") -> list[tuple[str, str]]:
    """(host path, container path) of the driver's IMEX binaries, found under `driver_root` (this process's view)
    where the driver's other tools are (driver.driverroot: /usr/bin, GKE's bin/, ...) and named under `host_root`
    (the host's, for the runtime); mounted at /usr/bin. Refused when the install has none."""
    if driver_root is None:
        raise ImexError("no driver root (--driver-root): nvidia-imex cannot be found")
    root = DriverRoot(driver_root)
    out = []
    for rel in (IMEX_BIN, IMEX_CTL_BIN):
        name = posixpath.basename(rel)
        try:
            found = root.find_binary(name)
        except DriverRootError as exc:
            raise ImexError(f"{exc}; the NVIDIA driver install on this node has no IMEX daemon (nvidia-imex is part "
                            "of the driver's nvidia-imex package)") from None
        out.append((posixpath.join(host_root, found.relative_to(driver_root).as_posix()), "/" + rel))
    return out


def host_channel_nodes(dev_root: Path | None) -> list[dict[str, Any]]:
    """The IMEX channel device nodes that exist on the host (`<dev_root>/nvidia-caps-imex-channels/channel<N>`,
    typed with their numbers), in channel order: what NVIDIA's management-mode device gives the daemon beside the
    GPUs. None (a simulated node, whose host /dev is not its own): none."""
    if dev_root is None:
        return []
    found: list[tuple[int, dict[str, Any]]] = []
    directory = dev_root / CHANNEL_DEVICE_DIR.removeprefix("/dev/")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        number = name.removeprefix("channel")
        if not name.startswith("channel") or not number.isdigit():
            continue
        try:
            st = os.stat(directory / name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            found.append((int(number), {"path": f"{CHANNEL_DEVICE_DIR}/{name}", "type": "c",
                                        "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}))
    return [node for _, node in sorted(found, key=lambda f: f[0])]


def daemon_edits(numbers: DeviceNumbers, gpu_minors: Sequence[int], files: DriverFiles,
                 channels: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """CDI containerEdits for what nvidia-imex needs in the daemon's container beside its config and binaries, as
    NVIDIA's daemon device gets them (its management-mode `device=all` and the fabric-imex-mgmt node): every GPU's
    device node, /dev/nvidiactl (and nvidia-uvm's when loaded), the IMEX channel nodes the host has
    (`host_channel_nodes`), the fabric-imex-mgmt capability node it opens, and the driver's files (libraries,
    tools, firmware, hooks: driver.driverfiles). Raises ImexError when the driver does not say what the capability
    node is."""
    try:
        capability = numbers.capability_node(FABRIC_IMEX_CAPABILITY)
    except CapabilityError as exc:
        raise ImexError(str(exc)) from exc
    nodes = [numbers.gpu_node(minor) for minor in sorted(gpu_minors)]
    return {**files.container_edits(),
            "deviceNodes": [*nodes, *numbers.control_nodes(), *(dict(c) for c in channels), capability]}
