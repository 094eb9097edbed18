"""The demo's expected outcomes, each checked against what was observed (pure).

The demo exits 0 only when every one holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.deviceplugin import DEVICE_PLUGIN_HOLDER_PREFIX
from sim.demo.observe import ApiState, ContainerView, Observed, WorkloadRow

TRAININGS = ("train-llama", "train-bert")
INFERENCE = ("inference-0", "inference-1")
GANG = ("gang-worker-0", "gang-worker-1")
GANG_CLAIMS = ("gang-worker-0-gpus", "gang-worker-1-gpus")
A100_NODES = ("a100-1", "a100-2")
CANNOT_FIT = "h100-full-node"
GANG_WAITING_REASON = "GpuDraGangWaiting"
UNSCHEDULABLE_REASON = "GpuDraUnschedulable"


@dataclass(frozen=True)
class Expectation:
    name: str
    ok: bool
    detail: str


def _row(rows: list[WorkloadRow], name: str) -> WorkloadRow | None:
    return next((r for r in rows if r.name == name), None)


def _missing(name: str) -> str:
    return f"pod {name} was not found"


def trainings(rows: list[WorkloadRow]) -> Expectation:
    parts, ok = [], True
    for name in TRAININGS:
        r = _row(rows, name)
        if r is None or not r.claims:
            return Expectation("trainings-one-node-one-nvlink-domain", False, _missing(name) + " or it has no claim")
        devices = [d for c in r.claims for d in c.devices]
        nodes = {d.pool for d in devices}
        domains = {d.attributes.get("nvlinkDomain") for d in devices}
        products = {str(d.attributes.get("productName")) for d in devices}
        good = (len(devices) == 4 and len(nodes) == 1 and nodes <= set(A100_NODES) and len(domains) == 1
                and None not in domains and all("A100" in p for p in products) and r.phase in ("Running", "Succeeded"))
        ok &= good
        parts.append(f"{name}: {len(devices)} GPUs on {','.join(sorted(nodes)) or '-'} in NVLink domain(s) "
                     f"{','.join(sorted(str(d) for d in domains)) or '-'} ({r.phase})")
    return Expectation("trainings-one-node-one-nvlink-domain", ok, "; ".join(parts))


def inference(rows: list[WorkloadRow], obs: Observed) -> Expectation:
    name = "inference-replicas-share-one-gpu-time-slicing"
    found = [_row(rows, n) for n in INFERENCE]
    if any(r is None for r in found):
        return Expectation(name, False, "inference pods missing")
    rs = [r for r in found if r is not None]
    not_running = [r.name for r in rs if r.phase != "Running"]
    if not_running:
        return Expectation(name, False, f"not Running: {', '.join(not_running)}")
    claims = {c.claim for r in rs for c in r.claims}
    device_sets = {tuple((d.pool, d.device) for c in r.claims for d in c.devices) for r in rs}
    cdi_sets = {tuple(i for c in r.claims for d in c.devices for i in d.cdi_device_ids) for r in rs}
    if len(claims) != 1 or len(device_sets) != 1 or len(cdi_sets) != 1:
        return Expectation(name, False, f"replicas use claims {sorted(claims)}, devices {sorted(device_sets)}")
    claim = rs[0].claims[0]
    devices = list(claim.devices)
    if len(devices) != 1 or not all(d.shared and d.sharing == "TimeSlicing" for d in devices):
        return Expectation(name, False, f"claim {claim.claim}: devices {[(d.device, d.sharing) for d in devices]}")
    dev = devices[0]
    disk = obs.disk.get(dev.pool)
    record = (disk.claims.get(claim.uid) if disk else None) or {}
    applied = {((d.get("sharing") or {}).get("sharing") or {}).get("strategy") for d in record.get("devices") or []}
    in_spec = disk is not None and set(dev.cdi_device_ids) <= disk.cdi_device_names(claim.uid)
    ok = applied == {"TimeSlicing"} and in_spec and "H100" in str(dev.attributes.get("productName"))
    return Expectation(name, ok, (
        f"{' and '.join(INFERENCE)} both use claim {claim.claim}: {dev.pool}/{dev.device} "
        f"({dev.attributes.get('productName')}), CDI id {', '.join(dev.cdi_device_ids)} "
        f"{'in' if in_spec else 'NOT in'} the claim's CDI spec; checkpoint records sharing {sorted(map(str, applied))} "
        "(time-slicing is a GPU setting, compute mode DEFAULT + timeslice, so it adds no container edit)"
    ))


def mig(rows: list[WorkloadRow]) -> Expectation:
    name = "mig-worker-on-1g.10gb-of-h100-1"
    r = _row(rows, "mig-worker")
    if r is None:
        return Expectation(name, False, _missing("mig-worker"))
    devices = [d for c in r.claims for d in c.devices]
    ok = (r.phase == "Running" and len(devices) == 1 and devices[0].pool == "h100-1"
          and devices[0].attributes.get("type") == "mig" and devices[0].attributes.get("profile") == "1g.10gb")
    desc = ", ".join(f"{d.pool}/{d.device} (type {d.attributes.get('type')}, profile {d.attributes.get('profile')})" for d in devices)
    return Expectation(name, ok, f"mig-worker {r.phase} on {desc or 'no device'}")


def notebook(rows: list[WorkloadRow]) -> Expectation:
    name = "notebook-on-v100-1"
    r = _row(rows, "notebook")
    if r is None:
        return Expectation(name, False, _missing("notebook"))
    devices = [d for c in r.claims for d in c.devices]
    ok = r.phase == "Running" and len(devices) == 1 and devices[0].pool == "v100-1" and "V100" in str(devices[0].attributes.get("productName"))
    desc = ", ".join(f"{d.pool}/{d.device} ({d.attributes.get('productName')})" for d in devices)
    return Expectation(name, ok, f"notebook {r.phase} on {desc or 'no device'}")


def legacy(rows: list[WorkloadRow], obs: Observed) -> Expectation:
    name = "legacy-pod-gpu-through-shim-not-held-by-dra"
    r = _row(rows, "legacy-cuda")
    if r is None:
        return Expectation(name, False, _missing("legacy-cuda"))
    if r.phase != "Running" or len(r.legacy_devices) != 1:
        return Expectation(name, False, f"legacy-cuda is {r.phase} on {r.node or '-'} with device plugin devices {list(r.legacy_devices)}")
    gpu = r.legacy_devices[0]
    dra_gpus = {str(d.attributes.get("parentUUID") or d.attributes.get("uuid"))
                for w in rows if w.phase == "Running" for c in w.claims for d in c.devices}
    disk = obs.disk.get(r.node)
    holders = disk.ledger.get(gpu, []) if disk else []
    ok = gpu not in dra_gpus and bool(holders) and all(h.startswith(DEVICE_PLUGIN_HOLDER_PREFIX) for h in holders)
    return Expectation(name, ok, (
        f"legacy-cuda on {r.node} got {gpu} from the device plugin (CDI {', '.join(r.legacy_cdi_devices) or '-'}); "
        f"ledger holders {holders}; {'no' if gpu not in dra_gpus else 'A'} DRA claim holds it"
    ))


def _gang_claims_allocated(state: ApiState) -> list[str]:
    return [n for n in GANG_CLAIMS if ((state.claims.get(n) or {}).get("status") or {}).get("allocation")]


def gang(rows: list[WorkloadRow], obs: Observed) -> Expectation:
    name = "gang-waits-in-act-1-placed-on-both-a100-nodes-in-act-2"
    act1_allocated = _gang_claims_allocated(obs.act1)
    act1_phases = {n: str(((obs.act1.pods.get(n) or {}).get("status") or {}).get("phase") or "Pending") for n in GANG}
    act1_waiting = all(any(e.get("reason") == GANG_WAITING_REASON for e in obs.act1.events_for(n)) for n in GANG)
    final = [_row(rows, n) for n in GANG]
    nodes = sorted({d.pool for r in final if r is not None for c in r.claims for d in c.devices})
    per_pod = [(r.name, r.phase, sorted({d.pool for c in r.claims for d in c.devices}), sum(len(c.devices) for c in r.claims))
               for r in final if r is not None]
    ok = (not act1_allocated and all(p != "Running" for p in act1_phases.values()) and act1_waiting
          and len(per_pod) == 2 and all(ph == "Running" and len(ns) == 1 and n == 8 for _, ph, ns, n in per_pod)
          and nodes == sorted(A100_NODES))
    return Expectation(name, ok, (
        f"act 1: {len(act1_allocated)} of {len(GANG_CLAIMS)} gang claims allocated, pods {act1_phases}, "
        f"gang-waiting events {'posted' if act1_waiting else 'missing'}; act 2: "
        + "; ".join(f"{n} {ph} with {k} GPUs on {','.join(ns) or '-'}" for n, ph, ns, k in per_pod)
    ))


def cannot_fit(rows: list[WorkloadRow]) -> Expectation:
    name = "cannot-fit-pending-with-explanation"
    r = _row(rows, CANNOT_FIT)
    if r is None:
        return Expectation(name, False, _missing(CANNOT_FIT))
    ok = r.phase == "Pending" and r.reason == UNSCHEDULABLE_REASON and "nodes are available" in r.message
    return Expectation(name, ok, f"{CANNOT_FIT} {r.phase}: {r.reason or 'no event'}: {r.message or '-'}")


def trainings_released(rows: list[WorkloadRow], obs: Observed) -> Expectation:
    name = "finished-trainings-released"
    parts, ok = [], True
    for n in TRAININGS:
        r = _row(rows, n)
        if r is None:
            return Expectation(name, False, _missing(n))
        for c in r.claims:
            node = c.node
            disk = obs.disk.get(node)
            still = disk is not None and (c.uid in disk.specs or c.uid in disk.claims)
            in_api = c.claim in obs.final.claims and bool((obs.final.claims[c.claim].get("status") or {}).get("allocation"))
            good = r.phase == "Succeeded" and not still and not in_api
            ok &= good
            parts.append(f"{n} {r.phase}: claim {c.claim} {'still allocated' if in_api else 'released'}, "
                         f"{'CDI spec/checkpoint entry left' if still else 'unprepared on ' + node}")
    return Expectation(name, ok, "; ".join(parts))


def disk_matches(rows: list[WorkloadRow], obs: Observed) -> Expectation:
    """Every node's CDI specs and checkpoint hold exactly the claims of its running pods, with the same ids."""
    name = "cdi-specs-and-checkpoints-match-prepared-claims"
    problems: list[str] = []
    expected: dict[str, dict[str, set[str]]] = {node: {} for node in obs.disk}
    for r in rows:
        if r.phase != "Running":
            continue
        for c in r.claims:
            for d in c.devices:
                expected.setdefault(d.pool, {}).setdefault(c.uid, set()).update(d.cdi_device_ids)
    total = 0
    for node, disk in sorted(obs.disk.items()):
        want = expected.get(node, {})
        problems += list(disk.problems)
        if set(disk.specs) != set(want):
            problems.append(f"{node}: CDI specs for claims {sorted(disk.specs)}, running pods' claims {sorted(want)}")
        if set(disk.claims) != set(want):
            problems.append(f"{node}: checkpoint holds claims {sorted(disk.claims)}, running pods' claims {sorted(want)}")
        for uid, ids in want.items():
            total += 1
            if not ids or not ids <= disk.cdi_device_names(uid):
                problems.append(f"{node}: claim {uid}: CDI ids {sorted(ids)} not all in its spec file")
            recorded = {i for d in (disk.claims.get(uid) or {}).get("devices") or [] for i in d.get("cdi_device_ids") or []}
            if recorded != ids:
                problems.append(f"{node}: claim {uid}: checkpoint CDI ids {sorted(recorded)} != kubelet's {sorted(ids)}")
            if (disk.claims.get(uid) or {}).get("phase") != "PrepareCompleted":
                problems.append(f"{node}: claim {uid}: checkpoint phase {(disk.claims.get(uid) or {}).get('phase')}")
        for uid, errors in disk.spec_errors.items():
            problems.append(f"{node}: CDI spec of claim {uid} is invalid: {'; '.join(errors)}")
    detail = "; ".join(problems) if problems else f"{total} prepared claims: spec files, checkpoints and kubelet answers agree"
    return Expectation(name, not problems, detail)


# ---- what the containers saw (with a container runtime) ------------------------------------------------------


def expected_view(row: WorkloadRow) -> tuple[set[str], set[str], set[str]]:
    """(GPU UUIDs, MIG UUIDs, NVIDIA_VISIBLE_DEVICES entries) a workload's container should see: its claims'
    devices (a MIG device shows under its parent GPU) and its device plugin GPUs."""
    gpus, migs, visible = set(row.legacy_devices), set(), set(row.legacy_devices)
    for c in row.claims:
        for d in c.devices:
            uuid = str(d.attributes.get("uuid") or "")
            if d.attributes.get("type") == "mig":
                migs.add(uuid)
                gpus.add(str(d.attributes.get("parentUUID") or ""))
            else:
                gpus.add(uuid)
            visible.add(uuid)
    return gpus, migs, visible


def view_problems(row: WorkloadRow, view: ContainerView) -> list[str]:
    gpus, migs, visible = expected_view(row)
    where = f"{row.name}/{view.name}"
    if not view.probed:
        return [f"{where}: no record of what it saw (its probe did not run)"]
    problems = []
    if sorted(view.gpu_uuids) != sorted(gpus):
        problems.append(f"{where}: nvidia-smi -L listed GPUs {view.gpu_uuids}, its devices are {sorted(gpus)}")
    if sorted(view.mig_uuids) != sorted(migs):
        problems.append(f"{where}: nvidia-smi -L listed MIG devices {view.mig_uuids}, its devices are {sorted(migs)}")
    seen_visible = set(filter(None, (view.visible_devices or "").split(",")))
    # "void": the spec tells an NVIDIA runtime hook to inject nothing itself (CDI already did); not a device list.
    if view.visible_devices != "void" and seen_visible != visible:
        problems.append(f"{where}: NVIDIA_VISIBLE_DEVICES={view.visible_devices!r}, expected {sorted(visible)}")
    if len(view.gpu_nodes) != len(gpus):
        problems.append(f"{where}: GPU device nodes {view.gpu_nodes}, expected {len(gpus)}")
    return problems


def containers_saw_their_devices(rows: list[WorkloadRow]) -> Expectation:
    name = "containers-saw-exactly-their-devices"
    problems, count = [], 0
    for r in rows:
        for v in r.containers:
            count += 1
            problems += view_problems(r, v)
    ran = [r.name for r in rows if r.containers]
    if not ran:
        return Expectation(name, False, "no container ran")
    return Expectation(name, not problems, "; ".join(problems) or (
        f"{count} containers in {len(ran)} pods: each nvidia-smi -L listed exactly its claim's (or device plugin's) "
        "GPUs and MIG devices, NVIDIA_VISIBLE_DEVICES named exactly them, and only their GPU device nodes existed"))


def _views(rows: list[WorkloadRow], name: str) -> list[ContainerView]:
    r = _row(rows, name)
    return list(r.containers) if r is not None else []


def inference_saw_same_gpu(rows: list[WorkloadRow]) -> Expectation:
    name = "inference-replicas-saw-the-same-gpu"
    seen = {n: [u for v in _views(rows, n) for u in v.gpu_uuids] for n in INFERENCE}
    ok = all(len(u) == 1 for u in seen.values()) and len({tuple(u) for u in seen.values()}) == 1
    return Expectation(name, ok, "; ".join(f"{n} saw {', '.join(u) or 'no GPU'}" for n, u in seen.items()))


def mig_worker_saw_only_its_mig(rows: list[WorkloadRow]) -> Expectation:
    name = "mig-worker-saw-only-its-mig-device"
    r = _row(rows, "mig-worker")
    views = _views(rows, "mig-worker")
    if r is None or not views:
        return Expectation(name, False, "mig-worker did not run a container")
    gpus, migs, _ = expected_view(r)
    seen_migs = [u for v in views for u in v.mig_uuids]
    seen_gpus = [u for v in views for u in v.gpu_uuids]
    ok = len(migs) == 1 and seen_migs == sorted(migs) and seen_gpus == sorted(gpus)
    return Expectation(name, ok, f"mig-worker saw MIG devices {seen_migs} on GPU {seen_gpus}; its claim: {sorted(migs)}")


def legacy_saw_its_gpu(rows: list[WorkloadRow]) -> Expectation:
    name = "legacy-pod-saw-its-device-plugin-gpu"
    r = _row(rows, "legacy-cuda")
    views = _views(rows, "legacy-cuda")
    if r is None or not views:
        return Expectation(name, False, "legacy-cuda did not run a container")
    seen = [u for v in views for u in v.gpu_uuids]
    ok = len(r.legacy_devices) == 1 and seen == list(r.legacy_devices)
    return Expectation(name, ok, f"legacy-cuda saw {seen or 'no GPU'}; the device plugin gave it {list(r.legacy_devices)}")


def trainings_ended_by_command(rows: list[WorkloadRow]) -> Expectation:
    name = "trainings-ended-by-their-command"
    parts, ok = [], True
    for n in TRAININGS:
        r = _row(rows, n)
        views = _views(rows, n)
        codes = [v.exit_code for v in views]
        good = r is not None and r.phase == "Succeeded" and bool(views) and all(c == 0 for c in codes)
        ok &= good
        parts.append(f"{n} {r.phase if r else 'missing'}: container exit codes {codes}")
    return Expectation(name, ok, "; ".join(parts))


def check_all(rows: list[WorkloadRow], obs: Observed) -> list[Expectation]:
    runtime = [
        containers_saw_their_devices(rows),
        inference_saw_same_gpu(rows),
        mig_worker_saw_only_its_mig(rows),
        legacy_saw_its_gpu(rows),
        trainings_ended_by_command(rows),
    ] if obs.runtime == "podman" else []
    return runtime + [
        trainings(rows),
        inference(rows, obs),
        mig(rows),
        notebook(rows),
        legacy(rows, obs),
        gang(rows, obs),
        cannot_fit(rows),
        trainings_released(rows, obs),
        disk_matches(rows, obs),
    ]
