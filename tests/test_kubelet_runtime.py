"""The kubelet simulator running pods' containers for real (podman): phase from exit codes, restartPolicy,
claims unprepared when a pod ends, containers removed when it is deleted, `kubectl logs` from the runtime's logs.

A node agent (in process) prepares claims over its real gRPC socket; the pods' containers get the CDI ids it
returns. Gated like tests/test_runtime.py: run in CI, skipped elsewhere when podman cannot run.
"""

from __future__ import annotations

import functools
import http.client
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.podlogs import PodLogsDir
from gpudra.kubeapi import KubeApi
from sim.demo.processes import pid_alive
from sim.kubelet.pods import NodeKubelet
from driver.nvml import load_backend
from sim.runtime import Runtimes
from sim.runtime.podman import PodmanRuntime
from tests.conftest import RunningApiServer
from tests.plugin_helpers import DRIVER, NODE, create_allocated_claim, short_tmp, start_agent
from tests.polling import until
from tests.runtime_helpers import require_podman

pytestmark = pytest.mark.process  # every test here starts a container runtime

DEADLINE = 60.0


wait_for = functools.partial(until, timeout=DEADLINE, interval=0.1)


@dataclass
class Cluster:
    api: KubeApi
    kubelet: NodeKubelet
    runtime: PodmanRuntime
    tmp: Path
    kubeconfig: Path

    def pod(self, name: str, script: str, *, claim: str | None = None, restart: str = "Never",
            grace: int | None = None) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                                     "env": [{"name": "GREETING", "value": "hello"}]}
        spec: dict[str, Any] = {"nodeName": NODE, "restartPolicy": restart, "containers": [container]}
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        if claim:
            container["resources"] = {"claims": [{"name": "gpu"}]}
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        pod = self.api.create("Pod", {"metadata": {"name": name, "namespace": "default"}, "spec": spec}, namespace="default")
        if claim:
            c = self.api.get("ResourceClaim", claim, namespace="default")
            c["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
            self.api.replace_status("ResourceClaim", c)
        return pod

    def phase(self, name: str) -> str:
        return str((self.api.get("Pod", name, namespace="default").get("status") or {}).get("phase") or "Pending")

    def wait_phase(self, name: str, *phases: str) -> dict[str, Any]:
        wait_for(f"pod {name} to be {' or '.join(phases)}", lambda: self.phase(name) in phases)
        return self.api.get("Pod", name, namespace="default")

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), "-n", "default", *args],
                              capture_output=True, text=True, timeout=60)


@pytest.fixture
def cluster(apiserver: RunningApiServer) -> Iterator[Cluster]:
    require_podman()
    with short_tmp() as tmp:
        apiserver.server.pod_logs = PodLogsDir(tmp / "pod-logs")
        apiserver.api.create("Node", {"metadata": {"name": NODE}})  # the kubelet publishes its exec port on it
        agent = start_agent(tmp, apiserver.api, profile="v100-4")
        runtime = Runtimes(tmp / "runtime").for_node(NODE, tmp / "cdi")
        kubelet = NodeKubelet(apiserver.api, NODE, tmp / "kubelet", DRIVER, runtime=runtime, pod_logs_dir=tmp / "pod-logs",
                              stream_client=apiserver.server.security.authenticator.is_kubelet_client)
        try:
            kubelet.register_plugin(timeout=DEADLINE)
            kubelet.start()
            yield Cluster(apiserver.api, kubelet, runtime, tmp, apiserver.kubeconfig)
        finally:
            kubelet.stop()
            runtime.close()
            agent.stop()


def _gpu_device_names(api: KubeApi) -> list[str]:
    slices, _ = api.list("ResourceSlice")
    return sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])


def test_pod_whose_container_exits_0_succeeds_and_its_claim_is_unprepared(cluster: Cluster) -> None:
    device = wait_for("the node's slices", lambda: _gpu_device_names(cluster.api))[0]
    claim = create_allocated_claim(cluster.api, "job-gpu", [("gpu", device)])
    uid = claim["metadata"]["uid"]
    cluster.pod("job", 'echo "$GREETING from the job"; ls /dev | grep "^nvidia[0-9]"; echo done', claim="job-gpu")
    pod = cluster.wait_phase("job", "Succeeded", "Failed")
    (status,) = pod["status"]["containerStatuses"]
    assert pod["status"]["phase"] == "Succeeded", status
    assert status["state"]["terminated"]["exitCode"] == 0 and status["state"]["terminated"]["reason"] == "Completed"
    # The claim was unprepared: no spec file, no checkpoint entry.
    wait_for("the claim's CDI spec to be removed", lambda: not (cluster.tmp / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists())
    (record,) = [r for r in cluster.kubelet.snapshot().values() if r.name == "job"]
    assert record.unprepared and record.containers[0].exit_code == 0
    assert record.containers[0].cdi_devices == (f"k8s.gpu.nvidia.com/claim={uid}-{device}",)
    # kubectl logs prints what the container printed (one GPU device node: its claim's).
    logs = cluster.kubectl("logs", "job")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines[0] == "hello from the job" and lines[-1] == "done" and len(lines) == 3 and lines[1].startswith("nvidia")
    assert cluster.kubectl("logs", "job", "-c", "main", "--tail", "1").stdout == "done\n"
    bad = cluster.kubectl("logs", "job", "-c", "nope")
    assert bad.returncode != 0 and "container nope is not valid for pod job" in bad.stderr


def test_a_failed_containers_termination_message_is_in_its_status(cluster: Cluster) -> None:
    cluster.pod("said", "echo 'bye now' > /dev/termination-log; exit 3")
    pod = cluster.wait_phase("said", "Failed")
    (status,) = pod["status"]["containerStatuses"]
    assert (status["state"]["terminated"]["exitCode"], status["state"]["terminated"]["message"]) == (3, "bye now\n")
    described = cluster.kubectl("describe", "pod", "said").stdout
    assert any(line.split() == ["Message:", "bye", "now"] for line in described.splitlines()), described


def test_containers_get_the_pods_hostname_and_the_kubelets_hosts_file(cluster: Cluster) -> None:
    cluster.api.create("Pod", {"metadata": {"name": "named", "namespace": "default"}, "spec": {
        "nodeName": NODE, "restartPolicy": "Never", "hostname": "web-0", "subdomain": "web",
        "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}],
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "hostname; cat /etc/hosts"]}]}},
        namespace="default")
    pod = cluster.wait_phase("named", "Succeeded", "Failed")
    ip = pod["status"]["podIP"]
    lines = cluster.kubectl("logs", "named").stdout.splitlines()
    assert lines[0] == "web-0"
    assert lines[1:] == ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
                         "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet",
                         "fe00::0\tip6-mcastprefix", "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters",
                         f"{ip}\tweb-0.web.default.svc.cluster.local\tweb-0", "", "# Entries added by HostAliases.",
                         "10.1.2.3\tfoo.local\tbar.local"], lines


def test_a_command_that_cannot_be_executed_is_a_start_error(cluster: Cluster) -> None:
    cluster.api.create("Pod", {"metadata": {"name": "typo", "namespace": "default"}, "spec": {
        "nodeName": NODE, "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["nosuchbinary", "--flag"]}]}},
        namespace="default")
    pod = cluster.wait_phase("typo", "Failed")
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("StartError", 128), terminated
    assert terminated["message"].endswith('error during container init: exec: "nosuchbinary": executable file not '
                                          'found in $PATH: unknown'), terminated
    events = cluster.api.list("Event", namespace="default")[0]
    assert any(e["involvedObject"]["name"] == "typo" and e["reason"] == "Failed" and e["type"] == "Warning"
               and e["message"] == f"Error: {terminated['message']}" for e in events)


def test_failed_container_restart_policies_and_deletion(cluster: Cluster) -> None:
    # Never: the pod fails with the exit code.
    cluster.pod("never", "echo failing; exit 3", restart="Never")
    pod = cluster.wait_phase("never", "Failed", "Succeeded")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    # OnFailure: a failing container is restarted (the pod stays Running, the restart count grows) ...
    cluster.pod("retry", "echo attempt; exit 1", restart="OnFailure")
    wait_for("OnFailure restarts", lambda: any(
        (c.get("restartCount") or 0) >= 2
        for c in (cluster.api.get("Pod", "retry", namespace="default").get("status") or {}).get("containerStatuses") or []))
    assert cluster.phase("retry") == "Running"
    assert cluster.kubectl("logs", "retry").stdout == "attempt\n"  # the current run's log
    assert cluster.kubectl("logs", "retry", "--previous").stdout == "attempt\n"  # the run before it
    first = cluster.kubectl("logs", "never", "--previous")
    assert first.returncode != 0 and 'previous terminated container "main" in pod "never" not found' in first.stderr
    # ... and one that succeeds is not: the pod Succeeds.
    cluster.pod("once", "exit 0", restart="OnFailure")
    pod = cluster.wait_phase("once", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded" and pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # A long-running pod is Running; deleting it stops and removes its container, then the pod. Its shell is PID 1
    # and ignores SIGTERM: the pod stays Terminating, its container running, for its grace period.
    cluster.pod("server", "echo serving; sleep 1000", restart="Always", grace=8)
    cluster.wait_phase("server", "Running")
    wait_for("the server's output", lambda: cluster.kubectl("logs", "server").stdout == "serving\n")
    (record,) = [r for r in cluster.kubelet.snapshot().values() if r.name == "server"]
    name = record.containers[0].runtime_name
    assert cluster.runtime.status(name).running
    pid = cluster.runtime.network_pid(name)
    assert pid is not None
    cluster.api.delete("Pod", "server", namespace="default")
    terminating = cluster.api.get("Pod", "server", namespace="default")["metadata"]
    assert terminating["deletionTimestamp"] and terminating["deletionGracePeriodSeconds"] == 8
    assert pid_alive(pid)
    assert cluster.kubectl("get", "pod", "server", "--no-headers").stdout.split()[2] == "Terminating"
    wait_for("the pod deleted by its kubelet", lambda: cluster.api.try_get("Pod", "server", namespace="default") is None)
    assert not pid_alive(pid) and name not in cluster.runtime.names()  # stopped (SIGKILL) before the pod went
    # A pod Terminating for 600 s, then `--force --grace-period=0`: the pod object goes at once, and the kubelet
    # restarts the stop with its least grace period (2 s), as the kubelet does when a deletion is shortened.
    cluster.pod("stubborn", "sleep 1000", restart="Always", grace=600)
    cluster.wait_phase("stubborn", "Running")
    (record,) = [r for r in cluster.kubelet.snapshot().values() if r.name == "stubborn"]
    pid = cluster.runtime.network_pid(record.containers[0].runtime_name)
    assert pid is not None
    assert cluster.kubectl("delete", "pod", "stubborn", "--wait=false").returncode == 0
    assert cluster.api.get("Pod", "stubborn", namespace="default")["metadata"]["deletionGracePeriodSeconds"] == 600
    assert pid_alive(pid)
    forced = cluster.kubectl("delete", "pod", "stubborn", "--force", "--grace-period=0")
    assert forced.returncode == 0 and 'pod "stubborn" force deleted' in forced.stdout, forced.stderr
    assert cluster.api.try_get("Pod", "stubborn", namespace="default") is None
    wait_for("the force-deleted pod's container stopped", lambda: not pid_alive(pid), timeout=30)


def test_legacy_pod_gets_its_device_plugin_gpu_and_frees_it_when_done(apiserver: RunningApiServer) -> None:
    from driver.checkpoint import Checkpoint
    from driver.deviceplugin import DevicePluginSettings, DevicePluginShim
    from sim.kubelet.devicemanager import DeviceManagerSim
    from tests.test_deviceplugin import RESOURCE, inv

    require_podman()
    with short_tmp() as tmp:
        dm = DeviceManagerSim(tmp / "kubelet")
        dm.start()
        (tmp / "boot").write_text("b1\n")
        checkpoint, _ = Checkpoint.open(tmp / "kubelet" / "plugins" / DRIVER, boot_id_path=tmp / "boot")
        inventory = inv("v100-4")
        # The simulator's device numbers, as the agent hands them to the shim: typed nodes, nothing stat-ed on the host.
        numbers = load_backend("sim:v100-4", node=NODE).device_numbers
        shim = DevicePluginShim(DevicePluginSettings(kubelet_dir=tmp / "kubelet", cdi_dir=tmp / "cdi", driver_name=DRIVER,
                                                     watch_seconds=0.05, device_numbers=numbers),
                                inventory=lambda: inventory, checkpoint=checkpoint)
        shim.start()
        runtime = Runtimes(tmp / "runtime").for_node(NODE, tmp / "cdi")
        kubelet = NodeKubelet(apiserver.api, NODE, tmp / "kubelet", DRIVER, device_manager=dm, runtime=runtime)
        try:
            dm.wait_for(lambda sim: len(sim.devices(RESOURCE)) == 4, timeout=DEADLINE)
            kubelet.start()
            apiserver.api.create("Pod", {"metadata": {"name": "legacy", "namespace": "default"}, "spec": {
                "nodeName": NODE, "restartPolicy": "Never", "containers": [{
                    "name": "cuda", "image": "cuda", "resources": {"limits": {RESOURCE: "1"}},
                    "command": ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; ls /dev | grep '^nvidia[0-9]'"]}]}},
                namespace="default")
            wait_for("the legacy pod to end", lambda: (apiserver.api.get("Pod", "legacy", namespace="default").get("status")
                                                       or {}).get("phase") in ("Succeeded", "Failed"))
            (record,) = kubelet.snapshot().values()
            assert record.phase == "Succeeded", record
            (grant,) = record.legacy
            gpu = next(g for g in inventory.gpus if g.uuid == grant.device_ids[0])
            assert record.containers[0].cdi_devices == grant.cdi_devices
            assert runtime.logs(record.containers[0].runtime_name) == f"{gpu.uuid}\nnvidia{gpu.minor}\n"
            # The kubelet forgot the terminated pod's devices: the GPU is free for the next legacy pod.
            assert dm.allocated(RESOURCE) == set()
        finally:
            kubelet.stop()
            runtime.close()
            shim.stop()
            dm.stop()
            checkpoint.close()


def test_crashing_container_goes_into_crash_loop_back_off_and_the_pod_is_not_ready(cluster: Cluster) -> None:
    cluster.pod("crash", "echo crashing; exit 1", restart="Always")

    def waiting() -> dict[str, Any] | None:
        pod = cluster.api.get("Pod", "crash", namespace="default")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if statuses and "waiting" in statuses[0]["state"]:
            return pod
        return None

    # The first exit restarts at once (restartCount 1); the second waits out a 10 s back-off.
    pod = wait_for("CrashLoopBackOff", waiting)
    (status,) = pod["status"]["containerStatuses"]
    uid = pod["metadata"]["uid"]
    assert status["state"]["waiting"] == {
        "reason": "CrashLoopBackOff",
        "message": f"back-off 10s restarting failed container=main pod=crash_default({uid})"}
    assert status["ready"] is False and status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert pod["status"]["phase"] == "Running"
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["ContainersReady"]["status"] == "False"
    assert conditions["Ready"]["message"] == "containers with unready status: [main]"
    row = cluster.kubectl("get", "pod", "crash", "--no-headers").stdout.split()
    assert row[1:3] == ["0/1", "CrashLoopBackOff"], row
    events = [e for e in cluster.api.list("Event", namespace="default")[0]
              if e["involvedObject"].get("uid") == uid and e["reason"] == "BackOff"]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert events[0]["message"] == f"Back-off restarting failed container main in pod crash_default({uid})"
    assert events[0]["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert events[0]["source"] == {"component": "kubelet", "host": NODE}
    # Not restarted during the back-off; restarted once it is over (restartCount 2), then 20 s.
    time.sleep(3)
    assert cluster.api.get("Pod", "crash", namespace="default")["status"]["containerStatuses"][0]["restartCount"] == 1
    wait_for("the 20 s back-off", lambda: "back-off 20s" in str(waiting() or ""))
    assert waiting()["status"]["containerStatuses"][0]["restartCount"] == 2  # type: ignore[index]


def test_probes_decide_readiness_and_restart_a_container_that_fails_liveness(cluster: Cluster) -> None:
    def create(name: str, script: str, **probes: Any) -> None:
        container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script], **probes}
        cluster.api.create("Pod", {"metadata": {"name": name, "namespace": "default"},
                                   "spec": {"nodeName": NODE, "containers": [container]}}, namespace="default")

    def status(name: str) -> dict[str, Any]:
        pod = cluster.api.get("Pod", name, namespace="default")
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return {"ready": statuses[0].get("ready"), "restarts": statuses[0].get("restartCount"),
                "condition": next((c["status"] for c in (pod.get("status") or {}).get("conditions") or []
                                   if c["type"] == "Ready"), None), "ip": (pod.get("status") or {}).get("podIP")}

    def events(name: str, reason: str) -> list[str]:
        return [e["message"] for e in cluster.api.list("Event", namespace="default")[0]
                if e["involvedObject"]["name"] == name and e["reason"] == reason]

    every_second = {"periodSeconds": 1, "failureThreshold": 2}
    create("warming", "sleep 2; touch /tmp/ready; exec sleep 3600",
           readinessProbe={"exec": {"command": ["cat", "/tmp/ready"]}, **every_second})
    create("unserved", "exec sleep 3600", readinessProbe={"httpGet": {"path": "/healthz", "port": 8080}, **every_second})
    create("dying", "exec sleep 3600", livenessProbe={"exec": {"command": ["false"]}, **every_second})
    # Running but not Ready until the readiness probe passes, as on a cluster.
    wait_for("warming running", lambda: cluster.phase("warming") == "Running")
    assert status("warming")["ready"] is False and status("warming")["condition"] == "False"
    wait_for("warming ready", lambda: status("warming")["ready"] is True and status("warming")["condition"] == "True")
    assert events("warming", "Unhealthy")[0].startswith("Readiness probe failed: cat: can't open '/tmp/ready'")
    # Nothing listens on 8080: never Ready, and the kubelet says why, naming the pod IP it probed.
    message = wait_for("unserved's Unhealthy event", lambda: (events("unserved", "Unhealthy") or [None])[0])
    ip = status("unserved")["ip"]
    assert message == (f'Readiness probe failed: Get "http://{ip}:8080/healthz": dial tcp {ip}:8080: connect: '
                       "connection refused")
    assert status("unserved")["ready"] is False and cluster.phase("unserved") == "Running"
    # Two liveness failures in a row: killed and restarted (restartCount counts it), with the kubelet's events.
    wait_for("dying restarted", lambda: (status("dying")["restarts"] or 0) >= 1)
    assert "Container main failed liveness probe, will be restarted" in events("dying", "Killing")
    assert "Liveness probe failed: " in events("dying", "Unhealthy")
    last = cluster.api.get("Pod", "dying", namespace="default")["status"]["containerStatuses"][0]["lastState"]
    assert last["terminated"]["exitCode"] == 137
    # Each start is described as the kubelet describes it; a deleted pod's running container is stopped.
    assert (events("warming", "Pulled"), events("warming", "Created"), events("warming", "Started")) == (
        ['Container image "busybox" already present on machine'], ["Created container: main"], ["Started container main"])
    cluster.api.delete("Pod", "warming", namespace="default")
    wait_for("warming's Killing event", lambda: "Stopping container main" in events("warming", "Killing"))


def test_init_containers_run_in_order_to_completion_before_the_app(cluster: Cluster) -> None:
    def create(name: str, inits: list[tuple[str, str]], restart: str = "Always") -> None:
        cluster.api.create("Pod", {"metadata": {"name": name, "namespace": "default"}, "spec": {
            "nodeName": NODE, "restartPolicy": restart,
            "initContainers": [{"name": n, "image": "busybox", "command": ["sh", "-c", script]} for n, script in inits],
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "echo app; sleep 1000"]}]}},
            namespace="default")

    create("ordered", [("first", "sleep 3; echo first"), ("second", "echo second")])
    row = wait_for("Init:0/2", lambda: (r := cluster.kubectl("get", "pod", "ordered", "--no-headers").stdout.split())
                   and r[2] == "Init:0/2" and r)
    assert row[1] == "0/1"
    pod = cluster.api.get("Pod", "ordered", namespace="default")
    initialized = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False" and initialized["message"] == "containers with incomplete status: [first second]"
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    pod = cluster.wait_phase("ordered", "Running")
    inits = pod["status"]["initContainerStatuses"]
    assert [(s["name"], s["state"]["terminated"]["exitCode"], s["state"]["terminated"]["reason"]) for s in inits] == [
        ("first", 0, "Completed"), ("second", 0, "Completed")]
    first_done = inits[0]["state"]["terminated"]["finishedAt"]
    assert first_done <= inits[1]["state"]["terminated"]["startedAt"]
    assert cluster.kubectl("logs", "ordered", "-c", "first").stdout == "first\n"
    wait_for("the app's output", lambda: cluster.kubectl("logs", "ordered").stdout == "app\n")
    # A failing init container under restartPolicy Never fails the pod; its app never starts.
    create("broken", [("setup", "exit 2")], restart="Never")
    pod = cluster.wait_phase("broken", "Failed")
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 2
    assert cluster.kubectl("get", "pod", "broken", "--no-headers").stdout.split()[2] == "Init:Error"
    assert not any(r.name == "broken" and r.containers for r in cluster.kubelet.snapshot().values())


def test_empty_dir_config_map_and_secret_volumes_are_real_files(cluster: Cluster) -> None:
    import base64

    cluster.api.create("ConfigMap", {"metadata": {"name": "settings"}, "data": {"mode": "fast", "level": "3"}},
                       namespace="default")
    cluster.api.create("Secret", {"metadata": {"name": "token"}, "data": {"token": base64.b64encode(b"s3cret").decode()}},
                       namespace="default")
    script = ("cat /etc/settings/mode; echo; cat /etc/only/lvl; echo; cat /run/token/token; echo; "
              "echo shared > /scratch/f; cat /scratch/f; touch /etc/settings/x 2>/dev/null || echo read-only")
    cluster.api.create("Pod", {"metadata": {"name": "vols", "namespace": "default"}, "spec": {
        "nodeName": NODE, "restartPolicy": "Never",
        "volumes": [{"name": "settings", "configMap": {"name": "settings"}},
                    {"name": "only", "configMap": {"name": "settings", "items": [{"key": "level", "path": "lvl"}]}},
                    {"name": "token", "secret": {"secretName": "token"}}, {"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script], "volumeMounts": [
            {"name": "settings", "mountPath": "/etc/settings"}, {"name": "only", "mountPath": "/etc/only"},
            {"name": "token", "mountPath": "/run/token"}, {"name": "scratch", "mountPath": "/scratch"}]}]}},
        namespace="default")
    pod = cluster.wait_phase("vols", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", cluster.kubectl("logs", "vols").stdout
    assert cluster.kubectl("logs", "vols").stdout.splitlines() == ["fast", "3", "s3cret", "shared", "read-only"]
    # A missing ConfigMap keeps a pod in ContainerCreating with a FailedMount event.
    cluster.api.create("Pod", {"metadata": {"name": "nomap", "namespace": "default"}, "spec": {
        "nodeName": NODE, "volumes": [{"name": "cfg", "configMap": {"name": "absent"}}],
        "containers": [{"name": "main", "image": "busybox", "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}},
        namespace="default")
    event = wait_for("FailedMount", lambda: next((e for e in cluster.api.list("Event", namespace="default")[0]
                                                  if e["reason"] == "FailedMount"), None))
    assert event["message"] == 'MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found'
    assert cluster.kubectl("get", "pod", "nomap", "--no-headers").stdout.split()[2] == "ContainerCreating"


def test_kubectl_exec_runs_in_the_container_over_websocket(cluster: Cluster) -> None:
    kubectl = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "kubectl")  # 1.37: WebSocket first
    cluster.pod("shell", "echo ready > /tmp/state 2>/dev/null; sleep 1000", restart="Always")
    cluster.wait_phase("shell", "Running")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, "--kubeconfig", str(cluster.kubeconfig), "-n", "default", *args],
                              capture_output=True, text=True, timeout=60, input=stdin)

    done = run("exec", "shell", "--", "sh", "-c", "echo out $GREETING; echo err >&2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "out hello\n" and done.stderr == "err\n"
    failed = run("exec", "shell", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3 and "command terminated with exit code 3" in failed.stderr
    piped = run("exec", "-i", "shell", "-c", "main", "--", "sh", "-c", "tr a-z A-Z", stdin="shout\n")
    assert piped.returncode == 0 and piped.stdout == "SHOUT\n", piped.stderr
    missing = run("exec", "shell", "-c", "nope", "--", "true")
    assert missing.returncode != 0 and "container nope is not valid for pod shell" in missing.stderr

    # the kubelet's streaming server itself serves only the API server: without its credential (none, the admin's
    # token, a forged one) a direct exec is 401 and runs nothing
    port = cluster.api.get("Node", NODE)["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    for authorization in (None, "Bearer " + yaml.safe_load(cluster.kubeconfig.read_text())["users"][0]["user"]["token"],
                          "Bearer not-a-token"):
        conn = http.client.HTTPConnection(cluster.kubelet.host_ip, port, timeout=30)
        headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                   "Sec-WebSocket-Version": "13", "Sec-WebSocket-Protocol": "v5.channel.k8s.io"}
        if authorization:
            headers["Authorization"] = authorization
        conn.request("GET", "/exec/default/shell/main?command=touch&command=/tmp/pwned&stdout=true", headers=headers)
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (401, b"Unauthorized")
        conn.close()
    assert run("exec", "shell", "--", "test", "-e", "/tmp/pwned").returncode == 1


def _hooked_pod(name: str, command: str, post_start: list[str], pre_stop: list[str] | None = None,
                grace: int = 20) -> dict[str, Any]:
    lifecycle: dict[str, Any] = {"postStart": {"exec": {"command": post_start}}}
    if pre_stop is not None:
        lifecycle["preStop"] = {"exec": {"command": pre_stop}}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": grace,
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", command], "lifecycle": lifecycle}]}}


def test_lifecycle_hooks_run_after_the_start_and_before_sigterm_and_a_failed_post_start_kills(cluster: Cluster) -> None:
    # Each hook writes to PID 1's stdout, so the container's log shows the order: the preStop hook ran before the
    # SIGTERM the shell traps.
    say = "echo {} > /proc/1/fd/1"
    created = cluster.api.create("Pod", _hooked_pod(
        "hooked", "trap 'echo got-term; exit 0' TERM; echo main-started; while true; do sleep 0.2; done",
        ["sh", "-c", say.format("post-start")], ["sh", "-c", say.format("pre-stop")]), namespace="default")
    cluster.wait_phase("hooked", "Running")
    wait_for("the postStart hook's line", lambda: "post-start" in cluster.kubectl("logs", "hooked").stdout)
    (record,) = [r for r in cluster.kubelet.snapshot().values() if r.name == "hooked"]
    log_file = cluster.kubelet.pod_log_path(record, "main", 0)
    assert log_file is not None
    cluster.api.delete("Pod", "hooked", namespace="default")
    wait_for("the pod deleted by its kubelet", lambda: cluster.api.try_get("Pod", "hooked", namespace="default") is None)
    lines = [line.split(" ", 3)[3] for line in log_file.read_text().splitlines()]
    assert lines == ["main-started", "post-start", "pre-stop", "got-term"], lines
    assert created["metadata"]["uid"] == record.uid
    # A postStart hook that fails: FailedPostStartHook, the container killed, then restarted per restartPolicy.
    cluster.api.create("Pod", _hooked_pod("refused", "sleep 1000", ["sh", "-c", "exit 3"], grace=2), namespace="default")
    wait_for("the container restarted after its failed hook", lambda: any(
        (s.get("restartCount") or 0) >= 1 for s in (cluster.api.get("Pod", "refused", namespace="default").get(
            "status") or {}).get("containerStatuses") or []))
    events = cluster.api.list("Event", namespace="default")[0]
    mine = [(e["reason"], e["message"], e["type"]) for e in events if e["involvedObject"]["name"] == "refused"]
    assert ("FailedPostStartHook", "PostStartHook failed", "Warning") in mine
    assert ("Killing", "FailedPostStartHook", "Normal") in mine


def test_a_container_in_its_post_start_hook_shows_being_created_until_the_hook_is_done(cluster: Cluster) -> None:
    cluster.api.create("Pod", _hooked_pod("slow-hook", "sleep 1000", ["sh", "-c", "sleep 4"]), namespace="default")

    def state() -> tuple[str, dict[str, Any], bool] | None:
        status = cluster.api.get("Pod", "slow-hook", namespace="default").get("status") or {}
        statuses = status.get("containerStatuses") or []
        return (status.get("phase"), statuses[0]["state"], statuses[0]["ready"]) if statuses else None

    # The kubelet's start of the container includes its postStart hook: until the hook is done the pod is Pending
    # and the container waits in ContainerCreating (not Running and Ready, as it already runs in the runtime).
    wait_for("the pod's first container status", lambda: state() is not None)
    assert state() == ("Pending", {"waiting": {"reason": "ContainerCreating"}}, False)
    wait_for("the hook done", lambda: (state() or ("",))[0] == "Running")
    phase, current, ready = state() or ("", {}, False)
    assert "running" in current and ready
