"""Specs written for NVIDIA's DRA driver (k8s-dra-driver-gpu) work here unchanged.

The specs below have the shapes of NVIDIA's `demo/specs/quickstart/v1` specs and of its Helm chart's
DeviceClasses (transcribed, not copied): each is validated (`gpu-dra validate`), allocated offline
(`gpu-dra allocate`) against the ResourceSlices a simulated node of matching hardware publishes, and the
allocated claims are prepared on that simulated node, where the sharing setting must take effect (timeslice
interval, MPS daemon with its thread percentage and pinned memory limits). The IMEX and VFIO specs get a clear
error from validation, from `allocate` and from the API server's admission.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from driver.checkpoint import Checkpoint
from gpudra.kubeapi import ApiError
from driver.discovery import discover
from driver.gputools import MpsDirs
from driver.nvml import load_backend
from driver.prepare import ClaimNotFound, ClaimRef, Preparer
from driver.sharing import COMPUTE_MODE_EXCLUSIVE_PROCESS, NvmlSharing
from driver.slices import SliceSettings, build_slices
from sim.nvml import SimulatedNvml
from tests.plugin_helpers import short_tmp

DRIVER = "gpu.nvidia.com"
NODE = "gpu-node"
MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"

# NVIDIA's Helm chart DeviceClasses (resource.k8s.io/v1 rendering), in its own quoting style.
HELM_CLASSES = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
  extendedResourceName: nvidia.com/gpu
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
"""


def _pod(ns: str, name: str, containers: list[tuple[str, str | None]], claims: list[dict[str, str]], claim: str) -> str:
    """A pod whose containers each reference claim `claim` (optionally one of its requests)."""
    ctrs = "".join(
        f"""
  - name: {c}
    image: ubuntu:22.04
    resources:
      claims:
      - name: {claim}{f'''
        request: {req}''' if req else ''}"""
        for c, req in containers
    )
    refs = "".join(f"\n  - name: {r['name']}\n    {r['ref']}: {r['value']}" for r in claims)
    return f"""
apiVersion: v1
kind: Pod
metadata:
  namespace: {ns}
  name: {name}
spec:
  containers:{ctrs}
  resourceClaims:{refs}
"""


def _template(ns: str, name: str, body: str) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: {ns}
  name: {name}
spec:
  spec:
    devices:
{body}"""


ONE_GPU = """      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
"""

TS_LONG = """            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: TimeSlicing
              timeSlicingConfig:
                interval: Long
"""

MPS_50_10GI = """            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: MPS
              mpsConfig:
                defaultActiveThreadPercentage: 50
                defaultPinnedDeviceMemoryLimit: 10Gi
"""


def _ns(name: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"


def _tref(value: str) -> dict[str, str]:
    return {"name": "gpu", "ref": "resourceClaimTemplateName", "value": value}


# gpu-test1: two pods, one GPU each, from one template.
GPU_TEST1 = "---".join([
    _ns("gpu-test1"),
    _template("gpu-test1", "single-gpu", ONE_GPU),
    _pod("gpu-test1", "pod1", [("ctr", None)], [_tref("single-gpu")], "gpu"),
    _pod("gpu-test1", "pod2", [("ctr", None)], [_tref("single-gpu")], "gpu"),
])

# gpu-test2: one pod, two containers sharing its one GPU.
GPU_TEST2 = "---".join([
    _ns("gpu-test2"),
    _template("gpu-test2", "single-gpu", ONE_GPU),
    _pod("gpu-test2", "pod", [("ctr0", None), ("ctr1", None)],
         [{"name": "shared-gpu", "ref": "resourceClaimTemplateName", "value": "single-gpu"}], "shared-gpu"),
])

# gpu-test3: two pods sharing one ResourceClaim.
GPU_TEST3 = "---".join([
    _ns("gpu-test3"),
    """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  namespace: gpu-test3
  name: single-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
""",
    _pod("gpu-test3", "pod1", [("ctr", None)], [{"name": "shared-gpu", "ref": "resourceClaimName", "value": "single-gpu"}], "shared-gpu"),
    _pod("gpu-test3", "pod2", [("ctr", None)], [{"name": "shared-gpu", "ref": "resourceClaimName", "value": "single-gpu"}], "shared-gpu"),
])

# gpu-test7: one pod, two containers, each with its own claim from one template.
GPU_TEST7 = "---".join([
    _ns("gpu-test7"),
    _template("gpu-test7", "single-gpu", ONE_GPU),
    "\n" + yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "gpu-test7", "name": "gpu-pod"}, "spec": {
        "containers": [{"name": f"ctr{i}", "image": "ubuntu:22.04", "resources": {"claims": [{"name": f"gpu{i}"}]}} for i in (0, 1)],
        "resourceClaims": [{"name": f"gpu{i}", "resourceClaimTemplateName": "single-gpu"} for i in (0, 1)],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }}),
])

# gpu-test8: one pod, one claim with two GPUs.
GPU_TEST8 = "---".join([
    _ns("gpu-test8"),
    _template("gpu-test8", "double-gpu", """      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          count: 2
"""),
    _pod("gpu-test8", "gpu-pod", [("ctr0", None)], [{"name": "twogpus", "ref": "resourceClaimTemplateName", "value": "double-gpu"}], "twogpus"),
])


def _mig_request(name: str, profile: str) -> str:
    return f"""      - name: {name}
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '{profile}'"
"""


MIG_REQUESTS = (
    "      requests:\n"
    + _mig_request("mig-1g-5gb-0", "1g.5gb") + _mig_request("mig-1g-5gb-1", "1g.5gb")
    + _mig_request("mig-2g-10gb", "2g.10gb") + _mig_request("mig-3g-20gb", "3g.20gb")
    + """      constraints:
      - requests: []
        matchAttribute: "gpu.nvidia.com/parentUUID"
"""
)


def _deployment(ns: str, replicas: int, containers: list[tuple[str, str | None]], claim: str, template: str) -> str:
    pod = yaml.safe_load(_pod(ns, "x", containers, [{"name": claim, "ref": "resourceClaimTemplateName", "value": template}], claim))
    return "\n" + yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": ns, "name": "pod"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "pod"}},
                 "template": {"metadata": {"labels": {"app": "pod"}}, "spec": pod["spec"]}},
    })


MIG_CONTAINERS = [("ctr0", "mig-1g-5gb-0"), ("ctr1", "mig-1g-5gb-1"), ("ctr2", "mig-2g-10gb"), ("ctr3", "mig-3g-20gb")]

# gpu-test4: a Deployment of 4 pods, each with 2x 1g.5gb + 2g.10gb + 3g.20gb of one A100-40GB.
GPU_TEST4 = "---".join([
    _ns("gpu-test4"),
    _template("gpu-test4", "mig-devices", MIG_REQUESTS),
    _deployment("gpu-test4", 4, MIG_CONTAINERS, "mig-devices", "mig-devices"),
])

# The same MIG layout with an MPS MigDeviceConfig (NVIDIA's kind for MIG devices) on every device.
GPU_TEST4_MPS = "---".join([
    _ns("gpu-test4"),
    _template("gpu-test4", "mig-devices", MIG_REQUESTS + """      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: MigDeviceConfig
            sharing:
              strategy: MPS
              mpsConfig:
                defaultActiveThreadPercentage: 25
                defaultPerDevicePinnedMemoryLimit:
                  "0": 2Gi
"""),
    _deployment("gpu-test4", 1, MIG_CONTAINERS, "mig-devices", "mig-devices"),
])

# gpu-test5: one claim, a time-sliced GPU and an MPS GPU, two containers on each.
GPU_TEST5 = "---".join([
    _ns("gpu-test5"),
    _template("gpu-test5", "multiple-gpus", f"""      requests:
      - name: ts-gpu
        exactly:
          deviceClassName: gpu.nvidia.com
      - name: mps-gpu
        exactly:
          deviceClassName: gpu.nvidia.com
      config:
      - requests: ["ts-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
{TS_LONG}      - requests: ["mps-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
{MPS_50_10GI}"""),
    _pod("gpu-test5", "pod0", [("ts-ctr0", "ts-gpu"), ("ts-ctr1", "ts-gpu"), ("mps-ctr0", "mps-gpu"), ("mps-ctr1", "mps-gpu")],
         [{"name": "shared-gpus", "ref": "resourceClaimTemplateName", "value": "multiple-gpus"}], "shared-gpus"),
])


def _gpu_test6(index_clause: bool) -> str:
    where = """
                &&
                (device.attributes['gpu.nvidia.com'].index == 0 ||
                device.attributes['gpu.nvidia.com'].index == 2)""" if index_clause else ""
    return "---".join([
        _ns("gpu-test6"),
        _template("gpu-test6", "a100", f"""      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel:
              expression: |
                device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$'){where}
      config:
      - requests: ["gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
{TS_LONG}"""),
        _deployment("gpu-test6", 4, [("ctr", None)], "a100", "a100"),
    ])


# gpu-test6 without its `index` clause: NVIDIA's current driver no longer publishes `index` either.
GPU_TEST6 = _gpu_test6(index_clause=False)

# gpu-test-mps: one MPS GPU shared by two containers.
GPU_TEST_MPS = "---".join([
    _ns("gpu-test-mps"),
    _template("gpu-test-mps", "shared-gpu", f"""      requests:
      - name: mps-gpu
        exactly:
          deviceClassName: gpu.nvidia.com
      config:
      - requests: ["mps-gpu"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
{MPS_50_10GI}"""),
    _pod("gpu-test-mps", "test-pod", [("mps-ctr0", "mps-gpu"), ("mps-ctr1", "mps-gpu")],
         [{"name": "shared-gpu", "ref": "resourceClaimTemplateName", "value": "shared-gpu"}], "shared-gpu"),
])

# imex-test1: a channel claim on NVIDIA's IMEX class.
IMEX_TEST1 = "---".join([
    _ns("imex-test1"),
    """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  namespace: imex-test1
  name: deployment0-imex-channel
spec:
  devices:
    requests:
    - name: channel
      exactly:
        deviceClassName: imex.nvidia.com
""",
])

# gpu-test-vfiopci: a GPU from NVIDIA's VFIO class; gpu-test-vfio-config: the same with a VfioDeviceConfig.
GPU_TEST_VFIOPCI = "---".join([
    _ns("gpu-test-vfio"),
    _template("gpu-test-vfio", "single-gpu", """      requests:
      - name: gpu
        exactly:
          deviceClassName: vfio.gpu.nvidia.com
"""),
])
GPU_TEST_VFIO_CONFIG = "---".join([
    _ns("gpu-test-vfio"),
    _template("gpu-test-vfio", "single-gpu-full-vfioconfig", """      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: VfioDeviceConfig
            iommu:
              backendPolicy: LegacyOnly
              enableAPIDevice: true
        requests:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
"""),
])


# ---- harness ---------------------------------------------------------------------------------------------------


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmp() as path:
        yield path


def _slices(nvml: Any) -> list[dict[str, Any]]:
    return build_slices(discover(nvml, NODE), SliceSettings(node_name=NODE, driver_name=DRIVER))


def _classes(kind: str) -> str:
    return HELM_CLASSES if kind == "helm" else (MANIFESTS / "base" / "deviceclasses.yaml").read_text()


def _write(tmp: Path, name: str, *texts: str) -> str:
    path = tmp / name
    path.write_text("\n---\n".join(texts))
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


class SimNode:
    """A simulated node: its NVML, its slices, and a Preparer holding the claims `allocate` gave it."""

    def __init__(self, tmp: Path, profile: str) -> None:
        self.nvml = load_backend(f"sim:{profile}", node=NODE)
        assert isinstance(self.nvml, SimulatedNvml)
        self.tmp = tmp
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        (tmp / "boot_id").write_text("boot-1")
        self.crash_at: str | None = None
        self.preparer = self._new()

    def _new(self) -> Preparer:
        checkpoint, report = Checkpoint.open(self.tmp / "plugin", boot_id_path=self.tmp / "boot_id")
        preparer = Preparer(
            driver_name=DRIVER, node_name=NODE, get_claim=self._get, inventory=lambda: discover(self.nvml, NODE),
            checkpoint=checkpoint, cdi_dir=self.tmp / "cdi", sharing_backend=NvmlSharing(self.nvml),
            mps_root=self.tmp / "mps", fault_hook=self._hook,
        )
        self.start_report = preparer.start(report)
        return preparer

    def _hook(self, step: str) -> None:
        if step == self.crash_at:
            raise RuntimeError(f"crash at {step}")

    def restart(self) -> None:
        """The node agent restarting: a new Preparer over the same checkpoint, CDI and MPS directories."""
        self.preparer.checkpoint.close()
        self.preparer = self._new()

    def _get(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"{namespace}/{name}") from None

    def slices_file(self, tmp: Path) -> str:
        return _write(tmp, "slices.yaml", yaml.safe_dump_all(_slices(self.nvml)))

    def prepare(self, results: list[dict[str, Any]], first_uid: int = 0) -> dict[str, ClaimRef]:
        """Prepare every allocated claim; all must succeed. Returns claim key -> ref."""
        refs = {}
        for i, r in enumerate(results, start=first_uid):
            ns, name = r["claim"].split("/")
            uid = f"uid-{i}"
            self.claims[(ns, name)] = {"metadata": {"namespace": ns, "name": name, "uid": uid}, "status": {"allocation": r["allocation"]}}
            refs[r["claim"]] = ClaimRef(uid, ns, name)
        out = self.preparer.prepare(list(refs.values()))
        assert {ref.uid: res.error for ref, res in zip(refs.values(), out.values())} == {ref.uid: "" for ref in refs.values()}
        return refs

    def uuid_of(self, result: dict[str, Any], request: str | None = None) -> list[str]:
        names = [d["device"] for d in result["allocation"]["devices"]["results"] if request in (None, d["request"])]
        devices = {d["name"]: d for s in _slices(self.nvml) for d in s["spec"]["devices"]}
        return [devices[n]["attributes"]["uuid"]["string"] for n in names]

    def mps(self, uid: str, ordinal: int = 0) -> Any:
        base = self.tmp / "mps" / uid if ordinal == 0 else self.tmp / "mps" / uid / str(ordinal)
        return self.nvml.mps_daemon(MpsDirs(pipe=base / "pipe", log=base / "log"))


def _allocate(tmp: Path, capsys: pytest.CaptureFixture[str], node: SimNode, spec: str, classes: str = "ours") -> list[dict[str, Any]]:
    spec_file = _write(tmp, "spec.yaml", _classes(classes), spec)
    rc, doc = _run(capsys, "validate", "-f", spec_file)
    assert rc == 0, doc
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp))
    assert rc == 0, doc
    assert all(r["outcome"] == "allocated" and r["node"] == NODE for r in doc["results"]), doc
    return doc["results"]


# ---- the specs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("classes", ["ours", "helm"])
@pytest.mark.parametrize(
    "spec,claims",
    [
        (GPU_TEST1, ["gpu-test1/pod1-gpu", "gpu-test1/pod2-gpu"]),
        (GPU_TEST2, ["gpu-test2/pod-shared-gpu"]),
        (GPU_TEST3, ["gpu-test3/single-gpu"]),
        (GPU_TEST7, ["gpu-test7/gpu-pod-gpu0", "gpu-test7/gpu-pod-gpu1"]),
        (GPU_TEST8, ["gpu-test8/gpu-pod-twogpus"]),
    ],
    ids=["gpu-test1", "gpu-test2", "gpu-test3", "gpu-test7", "gpu-test8"],
)
def test_plain_gpu_specs(tmp: Path, capsys: pytest.CaptureFixture[str], spec: str, claims: list[str], classes: str) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    results = _allocate(tmp, capsys, node, spec, classes)
    assert [r["claim"] for r in results] == claims
    node.prepare(results)
    uuids = [u for r in results for u in node.uuid_of(r)]
    assert len(set(uuids)) == len(uuids) == len(claims) + (1 if spec is GPU_TEST8 else 0)  # distinct full GPUs
    assert all(r["allocation"]["devices"]["results"][0]["device"].startswith("gpu-") for r in results)


@pytest.mark.parametrize("classes", ["ours", "helm"])
def test_gpu_test4_mig_devices_on_a100_40gb(tmp: Path, capsys: pytest.CaptureFixture[str], classes: str) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    results = _allocate(tmp, capsys, node, GPU_TEST4, classes)
    # The Deployment's 4 pods (named as its ReplicaSet names them), one claim each from the template.
    claims = [r["claim"] for r in results]
    assert len(set(claims)) == 4 and all(c.startswith("gpu-test4/pod-") and c.endswith("-mig-devices") for c in claims)
    slices = {d["name"]: d for s in _slices(node.nvml) for d in s["spec"]["devices"]}
    parents = set()
    for r in results:
        devs = [slices[d["device"]]["attributes"] for d in r["allocation"]["devices"]["results"]]
        assert sorted(a["profile"]["string"] for a in devs) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
        assert len({a["parentUUID"]["string"] for a in devs}) == 1
        # NVIDIA's driver publishes the parent's bus id on MIG devices; selectors may read it.
        assert len({a["resource.kubernetes.io/pciBusID"]["string"] for a in devs}) == 1
        parents.add(devs[0]["parentUUID"]["string"])
    assert len(parents) == 4
    node.prepare(results)


def test_gpu_test4_with_mps_mig_device_config(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    (result,) = _allocate(tmp, capsys, node, GPU_TEST4_MPS)
    node.prepare([result])
    daemon = node.mps("uid-0")
    uuids = sorted(node.uuid_of(result))
    assert daemon is not None and daemon.running and sorted(daemon.device_uuids) == uuids
    assert daemon.active_thread_percentage == 25
    # Index "0" is the first of the daemon's devices sorted by UUID, as in NVIDIA's driver.
    assert dict(daemon.pinned_limits) == {uuids[0]: "2048M"}


def test_gpu_test5_time_slicing_and_mps_in_one_claim(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    (result,) = _allocate(tmp, capsys, node, GPU_TEST5)
    node.prepare([result])
    (ts_gpu,) = node.uuid_of(result, "ts-gpu")
    (mps_gpu,) = node.uuid_of(result, "mps-gpu")
    assert node.nvml.get_timeslice(ts_gpu) == 3  # Long
    assert node.nvml.get_timeslice(mps_gpu) == 0
    daemon = node.mps("uid-0")
    assert daemon is not None and daemon.running and list(daemon.device_uuids) == [mps_gpu]
    assert daemon.active_thread_percentage == 50
    assert dict(daemon.pinned_limits) == {mps_gpu: "10240M"}
    handle = node.nvml.nvmlDeviceGetHandleByUUID(mps_gpu)
    assert node.nvml.nvmlDeviceGetComputeMode(handle) == COMPUTE_MODE_EXCLUSIVE_PROCESS


def test_gpu_test6_time_sliced_a100s(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    results = _allocate(tmp, capsys, node, GPU_TEST6, "helm")
    assert len(results) == 4
    node.prepare(results)
    assert [node.nvml.get_timeslice(u) for r in results for u in node.uuid_of(r)] == [3, 3, 3, 3]


def test_gpu_test6_index_selector_names_the_missing_attribute(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpu-test6 as NVIDIA ships it reads `index`, which neither gpu-dra nor NVIDIA's current driver publishes."""
    node = SimNode(tmp, "dgx-a100-40gb")
    spec_file = _write(tmp, "spec.yaml", HELM_CLASSES, _gpu_test6(index_clause=True))
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp))
    assert rc == 1
    assert [r["outcome"] for r in doc["results"]] == ["error"] * 4
    for r in doc["results"]:
        assert r["message"].startswith(f"claim {r['claim']}: selector #0") and "CEL runtime error: no such key: index" in r["message"]
        assert r["claim"].startswith("gpu-test6/pod-") and r["claim"].endswith("-a100")


def test_gpu_test_mps(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-h100")
    (result,) = _allocate(tmp, capsys, node, GPU_TEST_MPS, "helm")
    node.prepare([result])
    (gpu,) = node.uuid_of(result)
    daemon = node.mps("uid-0")
    assert daemon is not None and daemon.running
    assert (daemon.active_thread_percentage, dict(daemon.pinned_limits)) == (50, {gpu: "10240M"})


def test_helm_device_classes_validate(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _run(capsys, "validate", "-f", _write(tmp, "classes.yaml", HELM_CLASSES))
    assert rc == 0 and [r["valid"] for r in doc["results"]] == [True, True]


@pytest.mark.parametrize(
    "spec,expected",
    [
        (IMEX_TEST1, "spec.devices.requests[0].exactly.deviceClassName: Unsupported value: 'imex.nvidia.com': the IMEX "
                     "channel class of NVIDIA's driver before ComputeDomains; use a ComputeDomain"),
        (GPU_TEST_VFIOPCI, "spec.spec.devices.requests[0].exactly.deviceClassName: Unsupported value: 'vfio.gpu.nvidia.com': "
                           "NVIDIA's VFIO passthrough class; gpu-dra does not support VFIO passthrough"),
        (GPU_TEST_VFIO_CONFIG, "kind: VfioDeviceConfig is not supported: VFIO passthrough (vfio-pci GPUs for virtual "
                               "machines) is not supported by gpu-dra"),
    ],
    ids=["imex-test1", "gpu-test-vfiopci", "gpu-test-vfio-config"],
)
def test_imex_and_vfio_specs_are_refused_at_validation(tmp: Path, capsys: pytest.CaptureFixture[str], spec: str, expected: str) -> None:
    rc, doc = _run(capsys, "validate", "-f", _write(tmp, "spec.yaml", spec))
    assert rc == 1
    errors = [e for r in doc["results"] for e in r["errors"]]
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    "spec,expected",
    [
        (IMEX_TEST1, "the IMEX channel class of NVIDIA's driver before ComputeDomains"),
        (GPU_TEST_VFIOPCI, "gpu-dra does not support VFIO passthrough"),
        (GPU_TEST_VFIO_CONFIG, "kind: VfioDeviceConfig is not supported"),
    ],
    ids=["imex-test1", "gpu-test-vfiopci", "gpu-test-vfio-config"],
)
def test_imex_and_vfio_specs_are_refused_at_admission(apiserver: Any, spec: str, expected: str) -> None:
    objects = [o for o in yaml.safe_load_all(spec) if o]
    apiserver.api.create("Namespace", objects[0])
    for obj in objects[1:]:
        with pytest.raises(ApiError) as info:
            apiserver.api.create(obj["kind"], obj)
        assert info.value.status == 422 and expected in info.value.message


@pytest.mark.parametrize("name,why", [("vfio.gpu.nvidia.com", "gpu-dra does not support"),
                                      ("imex.nvidia.com", "use a ComputeDomain")])
def test_nvidia_classes_for_unsupported_features_are_refused_at_admission(apiserver: Any, name: str, why: str) -> None:
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    with pytest.raises(ApiError) as info:
        apiserver.api.create("DeviceClass", cls)
    assert info.value.status == 422 and why in info.value.message


def test_compute_domain_classes_are_admitted(apiserver: Any) -> None:
    for name in ("compute-domain-default-channel.nvidia.com", "compute-domain-daemon.nvidia.com"):
        cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
               "spec": {"selectors": [{"cel": {"expression": "device.driver == 'compute-domain.nvidia.com'"}}]}}
        assert apiserver.api.create("DeviceClass", cls)["metadata"]["name"] == name


@pytest.mark.parametrize("classes", ["ours", "helm"])
def test_nvidia_specs_are_admitted(apiserver: Any, classes: str) -> None:
    for obj in [o for o in yaml.safe_load_all(_classes(classes)) if o]:
        apiserver.api.create("DeviceClass", obj)
    for spec in (GPU_TEST3, GPU_TEST4_MPS, GPU_TEST5, GPU_TEST_MPS):
        objects = [o for o in yaml.safe_load_all(spec) if o]
        if apiserver.api.try_get("Namespace", objects[0]["metadata"]["name"]) is None:
            apiserver.api.create("Namespace", objects[0])
        for obj in objects:
            if obj["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                apiserver.api.create(obj["kind"], obj)


# ---- DRAExtendedResource: pods asking for nvidia.com/gpu through the gpu.nvidia.com class ---------------------

EXTENDED_POD = """
apiVersion: v1
kind: Pod
metadata:
  namespace: default
  name: legacy
spec:
  initContainers:
  - name: init
    image: busybox
  containers:
  - name: ctr
    image: ubuntu:22.04
    resources:
      limits:
        cpu: "1"
        nvidia.com/gpu: 2
"""


def test_extended_resource_pod_gets_a_dra_claim_offline(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-h100")
    spec_file = _write(tmp, "spec.yaml", HELM_CLASSES, EXTENDED_POD)
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp), "--feature", "DRAExtendedResource")
    assert rc == 0, doc
    (result,) = doc["results"]
    assert (result["claim"], result["outcome"]) == ("default/legacy-extended-resources", "allocated")
    # One request per container and resource: container 1 (after the init container), resource 1 of [cpu, nvidia.com/gpu].
    requests = {d["request"] for d in result["allocation"]["devices"]["results"]}
    assert requests == {"container-1-request-1"} and len(result["allocation"]["devices"]["results"]) == 2
    node.prepare([result])
    # Without the gate (off before 1.36) the pod is reported, with the way out, rather than silently skipped.
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp), "--kubernetes-version", "1.35")
    assert rc == 1
    assert doc["results"][0]["message"] == (
        "Pod default/legacy: asks for an extended resource backed by DeviceClass(es) gpu.nvidia.com (DRAExtendedResource), "
        "but that feature gate is off; pass --feature DRAExtendedResource"
    )


# NVIDIA's demo/specs/extended-resources shapes: `nvidia.com/gpu` through gpu.nvidia.com, and a MIG profile through
# a DeviceClass of its own with `extendedResourceName: nvidia.com/mig-<profile>`.
MIG_EXTENDED = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig-1g-10gb.gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
  extendedResourceName: nvidia.com/mig-1g.10gb
---
apiVersion: v1
kind: Pod
metadata:
  namespace: default
  name: mig-pod
spec:
  restartPolicy: Never
  containers:
  - name: cuda-container
    image: ubuntu:22.04
    resources:
      limits:
        nvidia.com/mig-1g.10gb: 1
"""


def test_extended_resource_mig_profile_class(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "h100-mig")
    spec_file = _write(tmp, "spec.yaml", HELM_CLASSES, MIG_EXTENDED)
    rc, doc = _run(capsys, "validate", "-f", spec_file)
    assert rc == 0, doc
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp), "--feature", "DRAExtendedResource")
    assert rc == 0, doc
    (result,) = doc["results"]
    (device,) = result["allocation"]["devices"]["results"]
    assert result["claim"] == "default/mig-pod-extended-resources" and "-mig-1g-10gb-" in device["device"]
    node.prepare([result])


# The shape of NVIDIA's tests/bats specs: no metadata.namespace (they are applied with kubectl -n), a MIG
# device chosen by capacity, a MigDeviceConfig.
MIG_TS_NO_NAMESPACE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: rct-mig1g-ts
spec:
  spec:
    devices:
      requests:
      - name: mig1gts
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: |
                device.capacity['gpu.nvidia.com'].multiprocessors.isGreaterThan(quantity("10"))
      config:
      - requests: ["mig1gts"]
        opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: MigDeviceConfig
            sharing:
              strategy: TimeSlicing
---
apiVersion: v1
kind: Pod
metadata:
  name: pod-mig1g
spec:
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims:
      - name: migdev
  resourceClaims:
  - name: migdev
    resourceClaimTemplateName: rct-mig1g-ts
"""


@pytest.mark.slow
def test_manifests_without_namespace_are_read_into_default(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = SimNode(tmp, "dgx-a100-40gb")
    spec_file = _write(tmp, "spec.yaml", HELM_CLASSES, MIG_TS_NO_NAMESPACE)
    rc, doc = _run(capsys, "validate", "-f", spec_file)
    assert rc == 0, doc
    assert "ResourceClaimTemplate/default/rct-mig1g-ts" in [r["object"] for r in doc["results"]]
    rc, doc = _run(capsys, "allocate", "-f", spec_file, node.slices_file(tmp))
    assert rc == 0, doc
    (result,) = doc["results"]
    assert result["claim"] == "default/pod-mig1g-migdev"
    node.prepare([result])  # a MigDeviceConfig with TimeSlicing applies to the MIG device
