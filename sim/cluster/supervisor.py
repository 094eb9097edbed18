"""The background process behind `gpu-dra cluster up`: starts the cluster, keeps it up, stops it on SIGTERM.

Run as `python -m sim.cluster.supervisor STATE_DIR` (detached by `cluster up`). It starts the embedded control plane
with its durable store, the controller in embedded mode, one node agent per node, and (in this process) one kubelet
simulator per node; then watches its children and restarts one that exits (with a per-child backoff), re-registering
a restarted node agent with its kubelet. Everything it knows is published in STATE_DIR/supervisor.json.
"""

from __future__ import annotations

import base64
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudra import DEFAULT_DRIVER_NAME, logfmt
from gpudra.kubeapi import KubeApi
from gpudra.privatedir import ensure_private_dir
from gpudra.signals import stop_on_signals
from sim.cluster import identities, kubeconfig, nodes
from sim.cluster.liveness import Liveness, livez
from sim.cluster.daemonsets import DaemonSetController
from sim.cluster.podgc import PodGC
from sim.cluster.leftovers import stop_children, stop_runtimes
from sim.cluster.workloads import WorkloadController
from sim.cluster.spec import ClusterPaths, ClusterSpec, ProcessInfo, SupervisorStatus, read_json, write_json
from sim.demo.cluster import DEFAULT_MANIFESTS, NodeDirs
from sim.demo.processes import Child, ChildFailed, ChildGroup
from sim.runtime import Runtimes
from sim.nvml.faults import write_faults

log = logging.getLogger("gpu-dra.cluster")

STEP_TIMEOUT_S = 120.0
POLL_S = 0.5
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
# A child that stayed up this long has its backoff reset.
STABLE_S = 60.0


@dataclass
class _Slot:
    """One supervised child: how to start it, and its restart bookkeeping."""

    role: str
    node: str | None
    child: Child
    restarts: int = 0
    backoff: float = RESTART_FIRST_S
    started: float = field(default_factory=time.monotonic)
    restart_at: float | None = None


class Supervisor:
    def __init__(self, paths: ClusterPaths, spec: ClusterSpec, *, driver_name: str = DEFAULT_DRIVER_NAME) -> None:
        self.paths = paths
        self.spec = spec
        self.driver_name = driver_name
        self.children = ChildGroup(paths.logs)
        self.status = SupervisorStatus(pid=os.getpid())
        self.slots: list[_Slot] = []
        self.sides: dict[str, nodes.NodeSide] = {}
        self.api: KubeApi | None = None
        self.port = 0
        self.stop_event = threading.Event()
        self.workloads: WorkloadController | None = None
        self.daemonsets: DaemonSetController | None = None
        self.podgc: PodGC | None = None
        # One container runtime per node (sim.runtime); none: only our image's pods run, the rest Run once prepared.
        self.runtimes = Runtimes(paths.root / "runtime", "podman" if spec.runtime == "podman" else "none")
        self.node_runtimes: list[Any] = []
        self.liveness = Liveness()

    def recover(self, previous: Any) -> None:
        """A supervisor of this cluster died (the keeper restarts us): stop what it left (its children, the node
        runtimes' containers) and keep its API server URL, so that kubeconfigs stay valid; the store is durable."""
        if not isinstance(previous, dict) or previous.get("pid") in (None, os.getpid()):
            return
        stopped = stop_children(self.paths) + stop_runtimes(self.paths)
        server = str(previous.get("server") or "")
        if server.rsplit(":", 1)[-1].split("/")[0].isdigit():
            self.port = int(server.rsplit(":", 1)[-1].split("/")[0])
        log.warning("event=recovering previous_pid=%s stopped=%s port=%d", previous.get("pid"),
                    logfmt.quote(", ".join(stopped) or "-"), self.port)
        self.status.steps.append(f"recovered from a supervisor that died (pid {previous.get('pid')}); stopped: "
                                 f"{', '.join(stopped) or 'nothing'}")

    # ---- status --------------------------------------------------------------------------------------------

    def publish(self) -> None:
        procs = [ProcessInfo("supervisor", self.status.pid)]
        procs += [ProcessInfo(s.role, s.child.process.pid, s.node, s.restarts) for s in self.slots]
        procs += [ProcessInfo("kubelet", self.status.pid, name) for name in self.sides]
        self.status.processes = procs
        write_json(self.paths.status, self.status.to_json())

    def step(self, text: str) -> None:
        log.info("event=step msg=%s", logfmt.quote(text))
        self.status.steps.append(text)
        self.publish()

    # ---- start ---------------------------------------------------------------------------------------------

    def _dirs(self, node: str) -> NodeDirs:
        """The node's directories as its processes see them: through the short link (see ClusterPaths.node_link)."""
        real = self.paths.node(node)
        real.mkdir(parents=True, exist_ok=True)
        links = Path(self.spec.links)
        ensure_private_dir(links.parent)  # checked by `cluster up` too; a directory swapped in since is refused
        ensure_private_dir(links)
        link = self.paths.node_link(links, node)
        if not (link.is_symlink() and link.resolve() == real.resolve()):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(real)
        return NodeDirs(link)

    def _start_apiserver(self) -> Child:
        child, url = nodes.start_apiserver(self.children, self.paths.kubeconfig, timeout=STEP_TIMEOUT_S,
                                           state=self.paths.store, port=self.port, pod_logs_dir=self.paths.pod_logs,
                                           runtime_config=self.spec.runtime_config, features=self.spec.features,
                                           tls_dir=self.paths.tls)
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.status.server = url
        return child

    def _component_kubeconfig(self, account: str, target: Path, node: str | None = None) -> Path:
        """The component's ServiceAccount kubeconfig (a token that outlives restarts of the control plane: the
        signing key is kept beside the admin kubeconfig); made once."""
        if target.exists():
            return target
        return identities.service_account_kubeconfig(self.api, self.paths.kubeconfig, account, target, node=node)

    def _start_controller(self) -> Child:
        config = self._component_kubeconfig(identities.CONTROLLER_ACCOUNT,
                                            self.paths.kubeconfig.with_name("controller.kubeconfig"))
        return self.children.start("controller", nodes.controller_argv(
            config, features=self.spec.features, leader_elect=False))

    def _start_agent(self, node: str) -> Child:
        spec = self.spec.node(node)
        assert spec is not None
        faults = self.paths.faults(node)
        if not faults.exists():
            write_faults(faults)  # no faults yet: `cluster fault` adds them
        config = self._component_kubeconfig(identities.AGENT_ACCOUNT, self.paths.node(node) / "agent.kubeconfig",
                                            node=node)
        return self.children.start(f"plugin-{node}", nodes.plugin_argv(
            spec, self._dirs(node), config, self.driver_name, faults=self.paths.faults(node),
            partitionable=self.spec.partitionable, driver_root=self.sides[node].driver_root))

    def start(self) -> None:
        apiserver = self._start_apiserver()
        self.slots.append(_Slot("apiserver", None, apiserver))
        self.api = KubeApi.connect(kubeconfig=str(self.paths.kubeconfig))
        identities.apply_base(self.api, DEFAULT_MANIFESTS / "base")
        classes = sorted(c["metadata"]["name"] for c in self.api.list("DeviceClass")[0])
        self.step(f"control plane: gpu-dra apiserver at {self.status.server} (store {self.paths.store}); "
                  f"DeviceClasses {', '.join(classes)}")
        self.slots.append(_Slot("controller", None, self._start_controller()))
        self.step("controller: started in embedded mode (scheduler, claim controller, explanations, gangs)")
        for spec in self.spec.nodes:
            dirs = self._dirs(spec.name)
            dirs.cdi.mkdir(parents=True, exist_ok=True)
            runtime = self.runtimes.for_node(spec.name, dirs.cdi)
            self.node_runtimes.append(runtime)
            self.sides[spec.name] = nodes.start_node_side(self.api, spec, dirs, self.driver_name, runtime=runtime,
                                                          pod_logs_dir=self.paths.pod_logs,
                                                          admin_kubeconfig=self.paths.kubeconfig,
                                                          faults=self.paths.faults(spec.name))
            self.slots.append(_Slot("plugin", spec.name, self._start_agent(spec.name)))
        self.publish()
        for slot in self.slots:
            if slot.role == "plugin" and slot.node is not None:
                nodes.register_and_start(self.sides[slot.node], slot.child, STEP_TIMEOUT_S)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            self.children.check_alive()
            counts = nodes.slice_device_counts(self.api)
            if all(counts.get(n.name) for n in self.spec.nodes):
                break
            if time.monotonic() > deadline:
                missing = [n.name for n in self.spec.nodes if not counts.get(n.name)]
                raise ChildFailed(f"timed out after {STEP_TIMEOUT_S:.0f} s waiting for ResourceSlices of {', '.join(missing)}")
            time.sleep(0.1)
        for spec in self.spec.nodes:
            self.step(f"node {spec.name} ({spec.profile}): Ready, agent registered, {counts[spec.name]} devices published"
                      + (", device plugin nvidia.com/gpu" if spec.device_plugin else ""))
        self.workloads = WorkloadController(self.api)
        self.workloads.start()
        self.daemonsets = DaemonSetController(self.api)
        self.daemonsets.start()
        self.podgc = PodGC(self.api)
        self.podgc.start()
        self.step("workload controllers: Deployments, ReplicaSets, StatefulSets, Jobs and CronJobs get their pods")
        self.status.phase = "ready"
        self.publish()

    # ---- keep up -------------------------------------------------------------------------------------------

    def _restart(self, slot: _Slot) -> None:
        old = slot.child
        if old in self.children.children:  # not after a restart that failed to start its successor
            self.children.children.remove(old)
        old.stop(0.1)  # reaps it and closes its log
        if slot.role == "apiserver":
            slot.child = self._start_apiserver()
            self.liveness.restarted(time.monotonic())
        elif slot.role == "controller":
            slot.child = self._start_controller()
        else:
            assert slot.node is not None
            slot.child = self._start_agent(slot.node)
            side = self.sides[slot.node]
            # Register the new agent as the kubelet's plugin watcher would on the new socket (slices follow).
            threading.Thread(target=self._reregister, args=(side, slot), daemon=True).start()
        slot.restarts += 1
        slot.started = time.monotonic()
        slot.restart_at = None
        log.warning("event=restarted role=%s node=%s pid=%d restarts=%d", slot.role, slot.node or "-",
                    slot.child.process.pid, slot.restarts)
        self.publish()

    def _reregister(self, side: nodes.NodeSide, slot: _Slot) -> None:
        if nodes.reregister(side, self.driver_name, STEP_TIMEOUT_S):
            log.info("event=plugin-registered node=%s pid=%d", slot.node, slot.child.process.pid)
        else:
            log.error("event=reregister-failed node=%s timeout_s=%.0f", slot.node, STEP_TIMEOUT_S)

    def _apiserver_live(self, slot: _Slot, now: float) -> bool:
        """The liveness probe (sim.cluster.liveness): False when the running API server is to be restarted."""
        if slot.role != "apiserver" or not self.liveness.due(now) or not self.status.server:
            return True
        try:
            ca_data = kubeconfig.admin_access(self.paths.kubeconfig)[0].get("certificate-authority-data")
        except (kubeconfig.KubeconfigError, OSError):
            ca_data = None
        failure = livez(self.status.server, base64.b64decode(ca_data).decode() if ca_data else None)
        if not self.liveness.record(now, failure):
            return True
        log.error("event=apiserver-unhealthy failures=%d error=%r; restarting it", self.liveness.threshold, failure)
        return False

    def failing(self) -> list[dict[str, str]]:
        """What does not work now, for `cluster status`: children down, the API server's failing probe, the
        in-process controllers whose last pass failed."""
        out = [{"component": s.role + (f" {s.node}" if s.node else ""),
                "message": f"exited with code {s.child.process.returncode}; restarting (restarts: {s.restarts})"}
               for s in self.slots if not s.child.alive()]
        if self.liveness.last is not None:
            out.append({"component": "apiserver", "message": f"/livez failed {self.liveness.failures} times in a row: "
                                                             f"{self.liveness.last}"})
        for name, controller in (("workload controllers", self.workloads), ("daemonset controller", self.daemonsets),
                                 ("pod garbage collector", self.podgc)):
            if controller is not None and controller.failure:
                out.append({"component": name, "message": controller.failure})
        return out

    def watch(self) -> None:
        while not self.stop_event.wait(POLL_S):
            self.watch_once(time.monotonic())

    def watch_once(self, now: float) -> None:
        """One look at everything supervised: publish what fails, restart what exited or is not live."""
        failing = self.failing()
        if failing != self.status.failing:
            self.status.failing = failing
            self.publish()
        for slot in self.slots:
            if slot.child.alive() and not self._apiserver_live(slot, now):
                try:
                    self._restart(slot)
                except (OSError, ChildFailed) as exc:
                    log.error("event=restart-failed role=%s error=%r", slot.role, str(exc))
                    slot.restart_at = now + slot.backoff
                continue
            if slot.child.alive():
                if now - slot.started > STABLE_S:
                    slot.backoff = RESTART_FIRST_S
                continue
            if slot.restart_at is None:
                slot.restart_at = now + (slot.backoff if now - slot.started < STABLE_S else 0.0)
                log.warning("event=child-exited role=%s node=%s code=%s restart_in_s=%.1f", slot.role,
                            slot.node or "-", slot.child.process.returncode, max(0.0, slot.restart_at - now))
                slot.backoff = min(slot.backoff * 2, RESTART_MAX_S)
            if now >= slot.restart_at:
                try:
                    self._restart(slot)
                except (OSError, ChildFailed) as exc:
                    log.error("event=restart-failed role=%s node=%s error=%r", slot.role, slot.node or "-", str(exc))
                    slot.restart_at = now + slot.backoff

    def close(self) -> None:
        self.status.phase = "stopping"
        self.publish()
        if self.workloads is not None:
            self.workloads.stop()
        if self.daemonsets is not None:
            self.daemonsets.stop()
        if self.podgc is not None:
            self.podgc.stop()
        for side in self.sides.values():
            side.stop()  # the kubelets remove the containers they started
        for runtime in self.node_runtimes:
            runtime.close()
        self.children.stop_all()
        if self.api is not None:
            self.api.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sim.cluster.supervisor STATE_DIR", file=sys.stderr)
        return 2
    paths = ClusterPaths(Path(argv[0]))
    data = read_json(paths.spec)
    if not isinstance(data, dict):
        print(f"{paths.spec}: missing or unreadable cluster spec", file=sys.stderr)
        return 2
    logfmt.configure(logging.INFO)
    # While the control plane restarts, urllib3 would log every connection retry of every watch; the kubelets
    # already log each failed watch once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    sup = Supervisor(paths, ClusterSpec.from_json(data))
    sup.recover(read_json(paths.status))  # before our own status replaces the dead supervisor's
    stop_on_signals(sup.stop_event)
    sup.publish()
    code = 0
    try:
        sup.start()
        sup.watch()
    except Exception as exc:  # noqa: BLE001 - a start failure is reported to `cluster up` through the status file
        log.exception("event=failed")
        sup.status.phase = "failed"
        sup.status.error = str(exc)
        code = 1
    finally:
        failed = sup.status.phase == "failed"
        sup.close()
        if failed:
            sup.status.phase = "failed"
        else:
            sup.status.phase = "stopped"
        sup.publish()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
