"""Runs the demo: embedded control plane, four simulated GPU nodes, the controller, two acts of workloads.

Every component is the real one in its own process (`gpu-dra apiserver`, `gpu-dra plugin` per node,
`gpu-dra controller --embedded`), talking over real sockets; only the kubelets are simulated, in this process
(`sim.kubelet.pods`). Waits are on observable state (pods Running, Events posted, claims released) with a
deadline, never on fixed sleeps.

Arrival order matters and is part of the story: the gang controller allocates a gang as soon as all its claims
exist and fit, so the gang arrives after the two trainings are placed (as a job queued behind running work
does). The legacy pod still arrives after the DRA workloads are running, although the device plugin shim now
withholds a GPU as soon as the scheduler allocates it to a claim (driver.allocatedclaims): the opposite window
stays open. A GPU the device plugin hands to a legacy pod is withheld from the scheduler only once the node agent
republishes its ResourceSlice with the device-plugin taint, and a claim allocated that GPU in the meantime is
refused at prepare and stays allocated to it until the legacy pod ends: the notebook on the same V100 node would
then be stuck in some runs. Applying the legacy pod once the DRA pods are placed keeps every run the same.

With the podman runtime (sim.runtime) every container really starts, from a busybox rootfs with the CDI
devices of its claims, and each node's simulated driver install (sim.runtime.driverinstall) gives it an
`nvidia-smi -L` that lists what it was given; the trainings end because their command ends. Without a runtime
pods are marked Running after prepare and the demo ends the trainings itself (`NodeKubelet.finish`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sim.kubelet.devicemanager import DeviceManagerSim
from driver.discovery import discover
from driver.nvml import load_backend
from gpudra import DEFAULT_DRIVER_NAME
from sim.demo import cluster, disk
from sim.kubelet.pods import NodeKubelet
from sim.runtime import Runtimes
from sim.runtime.podman import PodmanRuntime
from sim.demo.observe import ApiState, Observed
from sim.demo.processes import ChildFailed, ChildGroup
from sim.cluster import nodes
from gpudra.kubeapi import KubeApi

log = logging.getLogger("sim.demo")
T = TypeVar("T")

NAMESPACE = "gpu-demo"
POLL_SECONDS = 0.1
# Arrival order (see the module docstring): each step waits for the previous one to settle.
STEP_DRA = ("training-a100.yaml", "inference-timeslice.yaml", "mig-slice.yaml", "notebook-v100.yaml", "cannot-fit.yaml")
STEP_LEGACY = ("legacy-gpu.yaml",)
STEP_GANG = ("gang-16gpu.yaml",)
DRA_RUNNING = ("train-llama", "train-bert", "inference-0", "inference-1", "mig-worker", "notebook")
TRAININGS = ("train-llama", "train-bert")
GANG_PODS = ("gang-worker-0", "gang-worker-1")
GANG_CLAIMS = ("gang-worker-0-gpus", "gang-worker-1-gpus")
CANNOT_FIT = "h100-full-node"
TRAINING_SECONDS = 20.0  # how long the trainings' command runs (manifests/examples/training-a100.yaml)


class DemoFailed(RuntimeError):
    """A step did not happen in time or a component failed; the message says which and why."""


@dataclass
class DemoSettings:
    workdir: Path
    manifests: cluster.Manifests = cluster.Manifests(cluster.DEFAULT_MANIFESTS)
    driver_name: str = DEFAULT_DRIVER_NAME
    step_timeout: float = 45.0
    nodes: tuple[cluster.NodeSpec, ...] = cluster.NODES
    progress: Callable[[str], None] = lambda line: None
    runtime: str = "none"  # "podman" or "none" (sim.runtime.choose decides)
    runtime_config: tuple[str, ...] = ()  # the apiserver's --runtime-config entries


@dataclass
class _Running:
    children: ChildGroup
    api: KubeApi | None = None
    kubelets: dict[str, NodeKubelet] = field(default_factory=dict)
    device_managers: list[DeviceManagerSim] = field(default_factory=list)
    runtimes: list[PodmanRuntime] = field(default_factory=list)


class Demo:
    def __init__(self, settings: DemoSettings) -> None:
        self.s = settings
        self.kubeconfig = settings.workdir / "kubeconfig"
        self.r = _Running(ChildGroup(settings.workdir / "logs"))
        self._t0 = time.monotonic()

    # ---- helpers ----------------------------------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        if self.r.api is None:
            raise DemoFailed("the API server is not connected")
        return self.r.api

    def progress(self, text: str) -> None:
        self.s.progress(f"[{time.monotonic() - self._t0:5.1f}s] {text}")

    def wait(self, what: str, check: Callable[[], T | None], extra: float = 0.0) -> T:
        deadline = time.monotonic() + self.s.step_timeout + extra
        while True:
            try:
                self.r.children.check_alive()
            except ChildFailed as exc:
                raise DemoFailed(f"while waiting for {what}: {exc}") from exc
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out after {self.s.step_timeout:.0f} s waiting for {what}")
            time.sleep(POLL_SECONDS)

    def state(self) -> ApiState:
        pods, _ = self.api.list("Pod", namespace=NAMESPACE)
        claims, _ = self.api.list("ResourceClaim", namespace=NAMESPACE)
        events, _ = self.api.list("Event", namespace=NAMESPACE)
        slices, _ = self.api.list("ResourceSlice")
        return ApiState({p["metadata"]["name"]: p for p in pods}, {c["metadata"]["name"]: c for c in claims}, events, slices)

    # ---- start-up ---------------------------------------------------------------------------------------

    def start_control_plane(self) -> None:
        try:
            _, url = nodes.start_apiserver(self.r.children, self.kubeconfig, timeout=self.s.step_timeout,
                                           pod_logs_dir=self.pod_logs_dir, runtime_config=self.s.runtime_config)
        except ChildFailed as exc:
            raise DemoFailed(str(exc)) from exc
        self.r.api = KubeApi.connect(kubeconfig=str(self.kubeconfig))
        manifests = self.s.manifests
        cluster.create_all(self.api, cluster.example_objects([manifests.examples / "00-namespace.yaml", manifests.device_classes]))
        self.progress(f"control plane: gpu-dra apiserver at {url}; namespace {NAMESPACE}, PriorityClass and DeviceClasses "
                      f"{', '.join(sorted(c['metadata']['name'] for c in self.api.list('DeviceClass')[0]))} created")
        self.r.children.start("controller", nodes.controller_argv(self.kubeconfig))

    @property
    def pod_logs_dir(self) -> Path:
        """The kubelets' /var/log/pods: what `gpu-dra apiserver --pod-logs-dir` serves as pods/log."""
        return self.s.workdir / "pod-logs"

    def start_nodes(self) -> None:
        runtimes = Runtimes(self.s.workdir / "runtime") if self.s.runtime == "podman" else None
        agents = {}
        for spec in self.s.nodes:
            dirs = cluster.node_dirs(self.s.workdir, spec.name)
            dirs.cdi.mkdir(parents=True, exist_ok=True)
            runtime = None
            if runtimes is not None:
                runtime = runtimes.for_node(spec.name, dirs.cdi)
                self.r.runtimes.append(runtime)
            side = nodes.start_node_side(self.api, spec, dirs, self.s.driver_name, runtime=runtime,
                                         pod_logs_dir=self.pod_logs_dir)
            if side.device_manager is not None:
                self.r.device_managers.append(side.device_manager)
            agents[spec.name] = self.r.children.start(
                f"plugin-{spec.name}", nodes.plugin_argv(spec, dirs, self.kubeconfig, self.s.driver_name,
                                                         driver_root=side.driver_root))
            self.r.kubelets[spec.name] = side.kubelet
        for spec in self.s.nodes:
            try:
                nodes.register_and_start(nodes.NodeSide(self.r.kubelets[spec.name], None), agents[spec.name],
                                         self.s.step_timeout)
            except ChildFailed as exc:
                raise DemoFailed(str(exc)) from exc
        counts = self.wait("every node to publish its ResourceSlices", self._slice_counts)
        self.progress("nodes: " + "; ".join(
            f"{s.name} ({s.profile}) agent registered, {counts[s.name]} devices published"
            + (", device plugin nvidia.com/gpu registered" if s.device_plugin else "")
            for s in self.s.nodes
        ))
        for spec in self.s.nodes:
            if spec.device_plugin:
                self.wait(f"node {spec.name} to report nvidia.com/gpu from its device plugin",
                          lambda n=spec.name: self._extended_allocatable(n) > 0)

    def _slice_counts(self) -> dict[str, int] | None:
        counts = nodes.slice_device_counts(self.api)
        return counts if all(counts.get(s.name) for s in self.s.nodes) else None

    def _extended_allocatable(self, node: str) -> int:
        obj = self.api.get("Node", node)
        return int(str(((obj.get("status") or {}).get("allocatable") or {}).get(cluster.EXTENDED_GPU_RESOURCE) or 0))

    # ---- the acts ---------------------------------------------------------------------------------------

    def apply(self, files: tuple[str, ...]) -> None:
        cluster.create_all(self.api, cluster.example_objects([self.s.manifests.examples / f for f in files]))

    @staticmethod
    def _phase(state: ApiState, pod: str) -> str:
        return str(((state.pods.get(pod) or {}).get("status") or {}).get("phase") or "Pending")

    @staticmethod
    def _exit_codes(state: ApiState, pods: list[str]) -> str:
        return "; ".join(
            f"{p}: " + ", ".join(f"{c.get('name')} exit code {((c.get('state') or {}).get('terminated') or {}).get('exitCode')}"
                                 for c in ((state.pods.get(p) or {}).get("status") or {}).get("containerStatuses") or [])
            for p in pods)

    def _where(self, state: ApiState, pod: str) -> str:
        return str(((state.pods.get(pod) or {}).get("spec") or {}).get("nodeName") or "-")

    def _event(self, state: ApiState, pod: str, reason: str) -> Any:
        return next((e for e in state.events_for(pod) if e.get("reason") == reason), None)

    def act1(self) -> ApiState:
        self.progress("act 1: applying trainings (2x 4 A100, NVLink), inference (2 replicas, one time-sliced H100), "
                      "MIG worker (1g.10gb), notebook (V100) and an 8x H100 job that cannot fit")
        self.apply(STEP_DRA)

        def dra_settled() -> ApiState | None:
            st = self.state()
            running = all(self._phase(st, p) == "Running" for p in DRA_RUNNING)
            return st if running and self._event(st, CANNOT_FIT, "GpuDraUnschedulable") else None

        st = self.wait("the DRA workloads to run and the 8x H100 pod to be explained", dra_settled)
        for pod in DRA_RUNNING:
            self.progress(f"  {pod}: Running on {self._where(st, pod)}")
        event = self._event(st, CANNOT_FIT, "GpuDraUnschedulable")
        self.progress(f"  {CANNOT_FIT}: Pending: {event.get('message')}")

        self.apply(STEP_LEGACY)
        def legacy_running() -> ApiState | None:
            s = self.state()
            return s if self._phase(s, "legacy-cuda") == "Running" else None

        st = self.wait("the legacy nvidia.com/gpu pod to run", legacy_running)
        self.progress(f"  legacy-cuda arrives (nvidia.com/gpu: 1, through the device plugin shim): Running on "
                      f"{self._where(st, 'legacy-cuda')}")

        self.apply(STEP_GANG)
        annotation = f"{self.s.driver_name}/explanation"

        def gang_waiting() -> ApiState | None:
            s = self.state()
            ended = [p for p in TRAININGS if self._phase(s, p) != "Running"]
            if ended:
                raise DemoFailed(f"the trainings {', '.join(ended)} ended before the gang was judged: act 1 took longer "
                                 f"than their {TRAINING_SECONDS:.0f} s (a very loaded machine?)")
            waiting = all(self._event(s, p, "GpuDraGangWaiting") for p in GANG_PODS)
            explained = all(annotation in ((s.claims.get(c) or {}).get("metadata") or {}).get("annotations", {}) for c in GANG_CLAIMS)
            return s if waiting and explained else None

        st = self.wait("the 16-GPU gang to be judged", gang_waiting)
        allocated = [c for c in GANG_CLAIMS if ((st.claims.get(c) or {}).get("status") or {}).get("allocation")]
        why = st.claims[GANG_CLAIMS[0]]["metadata"]["annotations"][annotation]
        free = self._free_gpus(st)
        self.progress(f"  gang pretrain arrives (2x 8 NVLink GPUs): waiting all-or-nothing: {len(allocated)} of 2 claims allocated, "
                      f"no GPU held (free whole GPUs: {', '.join(f'{n} {k}' for n, k in sorted(free.items()))}); {why}")
        return st

    def _free_gpus(self, st: ApiState) -> dict[str, int]:
        """Unallocated full-GPU devices per A100 node (what the gang would need)."""
        used = {(r.get("pool"), r.get("device")) for c in st.claims.values()
                for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []}
        free: dict[str, int] = {}
        for sl in st.slices:
            spec = sl.get("spec") or {}
            node = str(spec.get("nodeName"))
            if not node.startswith("a100"):
                continue
            for dev in spec.get("devices") or []:
                if (spec.get("pool", {}).get("name"), dev.get("name")) not in used:
                    free[node] = free.get(node, 0) + 1
        return free

    def act2(self) -> ApiState:
        st = self.state()
        if self.s.runtime == "podman":
            self.progress("act 2: the two trainings finish (their command ends after 20 steps, the containers exit 0)")
        else:
            self.progress("act 2: the two trainings finish (no runtime: the demo ends them as containers exiting 0 would)")
        for pod in TRAININGS:
            node = self._where(st, pod)
            if node not in self.r.kubelets:
                raise DemoFailed(f"pod {NAMESPACE}/{pod} is not running on a node (spec.nodeName {node!r})")
            if self.s.runtime != "podman":
                self.r.kubelets[node].finish(NAMESPACE, pod)
        training_claims = {p: list(_claim_names(st.pods[p])) for p in TRAININGS}

        def released() -> ApiState | None:
            s = self.state()
            failed = [p for p in TRAININGS if self._phase(s, p) == "Failed"]
            if failed:
                raise DemoFailed(f"training pod(s) {', '.join(failed)} Failed: {self._exit_codes(s, failed)}")
            done = all(self._phase(s, p) == "Succeeded" for p in TRAININGS)
            gone = all(not ((s.claims.get(c) or {}).get("status") or {}).get("allocation")
                       for names in training_claims.values() for c in names)
            return s if done and gone else None

        self.wait("the finished trainings' claims to be released", released, extra=TRAINING_SECONDS)
        self.progress(f"  trainings Succeeded; their claims {', '.join(c for v in training_claims.values() for c in v)} "
                      "unprepared (CDI specs removed) and released by the controller")

        def gang_running() -> ApiState | None:
            s = self.state()
            return s if all(self._phase(s, p) == "Running" for p in GANG_PODS) else None

        st = self.wait("the gang to be placed and running", gang_running)
        self.progress("  gang pretrain placed: " + ", ".join(f"{p} on {self._where(st, p)}" for p in GANG_PODS))
        return st

    # ---- the whole run ----------------------------------------------------------------------------------

    def run(self) -> Observed:
        self.start_control_plane()
        self.start_nodes()
        act1 = self.act1()
        self.act2()
        if self.s.runtime == "podman":
            self.wait("every running container to record what it saw", self._all_probed)
        final = self.state()
        records = {name: k.snapshot() for name, k in self.r.kubelets.items()}
        disks = {}
        for spec in self.s.nodes:
            dirs = cluster.node_dirs(self.s.workdir, spec.name)
            disks[spec.name] = disk.read_node(dirs.cdi, dirs.plugin_dir(self.s.driver_name))
        gpus = {spec.name: len(discover(load_backend(f"sim:{spec.profile}", node=spec.name), spec.name).gpus) for spec in self.s.nodes}
        return Observed(act1, final, records, disks, gpus, NAMESPACE, self.s.driver_name, self.s.runtime)

    def _all_probed(self) -> bool:
        return all(c.seen is not None or not c.running for k in self.r.kubelets.values()
                   for r in k.snapshot().values() for c in r.containers)

    def close(self) -> dict[str, int | None]:
        """Stop everything this run started, kubelets first (they call into the agents), then the processes."""
        for kubelet in self.r.kubelets.values():
            kubelet.stop()  # removes the containers it started
        for runtime in self.r.runtimes:
            runtime.close()
        for dm in self.r.device_managers:
            dm.stop()
        codes = self.r.children.stop_all()
        if self.r.api is not None:
            self.r.api.close()
            self.r.api = None
        return codes


def _claim_names(pod: dict[str, Any]) -> list[str]:
    statuses = {s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    return [str(e.get("resourceClaimName") or statuses.get(e.get("name"))) for e in (pod.get("spec") or {}).get("resourceClaims") or []
            if e.get("resourceClaimName") or statuses.get(e.get("name"))]
