"""NodePrepareResources for compute-domain.nvidia.com claims.

- A channel claim (ComputeDomainChannelConfig) labels the node with its domain (so the domain's IMEX daemon
  DaemonSet places a daemon here), and is prepared only once that daemon reports Ready in the domain's
  ComputeDomainClique: until then the kubelet gets an error naming what it waits for, and retries. Its CDI spec
  gives the container `/dev/nvidia-caps-imex-channels/channel<N>` (every channel with allocationMode All).
- A daemon claim (ComputeDomainDaemonConfig) only writes CDI, as NVIDIA's plugin does: the domain's config
  directory (with the IMEX config template, driver.computedomain.imex) mounted at /imexd, the env the daemon pod's
  `gpu-dra compute-domain-daemon run` reads (CLIQUE_ID, COMPUTE_DOMAIN_UUID/NAME/NAMESPACE), and what nvidia-imex
  needs to run, as NVIDIA's daemon device gives it (its management-mode `device=all` plus the fabric-imex-mgmt
  node): every GPU's device node, /dev/nvidiactl (and nvidia-uvm's when loaded), the driver's fabric-imex-mgmt
  capability node, the driver's libraries and tools (driver.driverfiles) and its `nvidia-imex` and
  `nvidia-imex-ctl` at /usr/bin. That command, in the pod, runs the IMEX daemon.

Prepared claims are kept in a checkpoint (atomic JSON) so a restarted agent unprepares what it prepared.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.cdi import DeviceNumbers, minimum_version
from driver.prepare import ClaimNotFound, ClaimRef, ClaimResult, DeviceResult
from gpudra import computedomain as cd
from gpudra.atomicfile import atomic_write

log = logging.getLogger("gpu-dra.compute-domain.prepare")

CDI_VENDOR = "k8s.compute-domain.nvidia.com"
CDI_KIND = f"{CDI_VENDOR}/claim"
SPEC_PREFIX = f"{CDI_VENDOR}-claim_"


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    kind: str  # "channel" or "daemon"
    domain: str
    devices: tuple[DeviceResult, ...]

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name, "kind": self.kind,
                "domain": self.domain, "devices": [{"requests": list(d.request_names), "pool": d.pool_name,
                                                     "device": d.device_name, "cdi": list(d.cdi_device_ids)}
                                                    for d in self.devices]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(str(data["uid"]), str(data["namespace"]), str(data["name"]), str(data["kind"]),
                   str(data["domain"]), tuple(DeviceResult(tuple(d["requests"]), d["pool"], d["device"], tuple(d["cdi"]))
                                              for d in data.get("devices") or []))


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = {}
        try:
            data = json.loads(path.read_text())
            self.claims = {c["uid"]: PreparedClaim.from_json(c) for c in data.get("claims") or []}
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.error("event=checkpoint-corrupt path=%s error=%r", path, str(exc))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"version": 1, "claims": [c.to_json() for c in sorted(self.claims.values(), key=lambda c: c.uid)]}
        atomic_write(self.path, json.dumps(body, indent=1).encode())


class NotReady(Exception):
    """The claim cannot be prepared yet (the kubelet retries)."""


class DaemonNotReady(NotReady):
    """A channel waits for its domain's IMEX daemon on this node."""

    def __init__(self, message: str, domain: str) -> None:
        super().__init__(message)
        self.domain = domain


# How long a channel's prepare waits for its IMEX daemon before failing: the kubelet gives the whole call 45 s and
# retries the pod only after its back-off (more than a minute on the upstream testbed), so a daemon that starts a
# few seconds after the workers (the usual case: the channel's prepare is what places it on the node) would cost
# every worker that long.
DAEMON_WAIT_S = 25.0


# (namespace, name) -> the claim; (domain uid) -> ComputeDomain or None; clique object or None.
Lookup = Callable[[str], "Mapping[str, Any] | None"]


@dataclass
class NodeContext:
    node: str
    clique: str | None
    # Writes the domain's config directory (the IMEX config template) and returns it.
    domain_dir: Callable[[str], Path]
    device_numbers: Callable[[], DeviceNumbers]
    # The driver's IMEX binaries (host path, container path) the daemon's container gets.
    imex_binaries: Callable[[], list[tuple[str, str]]] = lambda: []
    # What else the daemon's container needs to run nvidia-imex, as NVIDIA's daemon device gets it: the GPU,
    # control and fabric-imex-mgmt device nodes and the driver's files (CDI containerEdits; raises NotReady
    # naming what the node lacks).
    daemon_edits: Callable[[], dict[str, Any]] = dict


class ComputeDomainPreparer:
    def __init__(self, ctx: NodeContext, checkpoint: Checkpoint, cdi_dir: Path, *,
                 get_claim: Callable[[str, str], Mapping[str, Any]], get_domain: Lookup,
                 daemon_ready: Callable[[str], tuple[bool, str]], label_node: Callable[[str | None], None],
                 on_change: Callable[[], None] = lambda: None, daemon_wait_s: float = 0.0,
                 poll_s: float = 0.5) -> None:
        self.ctx = ctx
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir
        self.get_claim = get_claim
        self.get_domain = get_domain
        self.daemon_ready = daemon_ready
        self.label_node = label_node
        self.on_change = on_change
        self.daemon_wait_s = daemon_wait_s
        self.poll_s = poll_s
        self._lock = threading.Lock()

    # ----- kubelet calls -------------------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        out: dict[str, ClaimResult] = {}
        waiting: dict[str, list[ClaimRef]] = {}
        with self._lock:
            for ref in claims:
                domain = self._prepare_one(ref, out)
                if domain is not None:
                    waiting.setdefault(domain, []).append(ref)
        # The daemon's own pod has a claim this preparer prepares, so the wait holds no lock.
        deadline = time.monotonic() + self.daemon_wait_s
        for domain, refs in waiting.items():
            while not self.daemon_ready(domain)[0] and time.monotonic() < deadline:
                time.sleep(self.poll_s)
            with self._lock:
                for ref in refs:
                    self._prepare_one(ref, out)
        self.on_change()
        return out

    def _prepare_one(self, ref: ClaimRef, out: dict[str, ClaimResult]) -> str | None:
        """Prepare `ref` into `out` (lock held); the domain whose IMEX daemon it waits for, if that is why not."""
        done = self.checkpoint.claims.get(ref.uid)
        if done is not None and done.kind == "daemon":
            out[ref.uid] = ClaimResult(done.devices)
            return None
        try:
            out[ref.uid] = ClaimResult(self._prepare(ref, done))
        except DaemonNotReady as exc:
            out[ref.uid] = ClaimResult(error=str(exc))
            return exc.domain
        except NotReady as exc:
            out[ref.uid] = ClaimResult(error=str(exc))
        except ClaimNotFound:
            out[ref.uid] = ClaimResult(error=f"{ref}: not found")
        except Exception as exc:  # noqa: BLE001 - one bad claim must not fail the others or the agent
            log.exception("event=prepare-failed claim=%s", ref)
            out[ref.uid] = ClaimResult(error=f"{ref}: {type(exc).__name__}: {exc}")
        return None

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._lock:
            for ref in claims:
                done = self.checkpoint.claims.pop(ref.uid, None)
                (self.cdi_dir / f"{SPEC_PREFIX}{ref.uid}.json").unlink(missing_ok=True)
                out[ref.uid] = ""
                if done is not None:
                    self.checkpoint.save()
                    log.info("event=unprepared claim=%s kind=%s domain=%s", ref, done.kind, done.domain)
            self._relabel()
        self.on_change()
        return out

    # ----- internals -----------------------------------------------------------------------------------------

    def _relabel(self) -> None:
        """The node carries the domain label while a channel of that domain is prepared or being waited for here."""
        domains = {c.domain for c in self.checkpoint.claims.values() if c.kind == "channel"}
        self.label_node(next(iter(sorted(domains)), None))

    def _config(self, claim: Mapping[str, Any], ref: ClaimRef) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
        devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        results = [r for r in devices.get("results") or [] if r.get("driver") == cd.DRIVER]
        if not results:
            raise NotReady(f"{ref}: no devices of {cd.DRIVER} are allocated to it")
        params = None
        for entry in devices.get("config") or []:
            opaque = entry.get("opaque") or {}
            if opaque.get("driver") == cd.DRIVER:
                params = opaque.get("parameters")
        if not isinstance(params, Mapping):
            raise NotReady(f"{ref}: has no {cd.CHANNEL_CONFIG_KIND} or {cd.DAEMON_CONFIG_KIND} for {cd.DRIVER}; the "
                           "ComputeDomain controller's ResourceClaimTemplates carry one (use the template the "
                           "domain names in spec.channel.resourceClaimTemplate)")
        problems = cd.validate_config(params)
        if problems:
            raise NotReady(f"{ref}: opaque parameters: {'; '.join(problems)}")
        return results, params

    def _prepare(self, ref: ClaimRef, done: PreparedClaim | None) -> tuple[DeviceResult, ...]:
        claim = self.get_claim(ref.namespace, ref.name)
        results, params = self._config(claim, ref)
        domain_uid = str(params["domainID"])
        domain = self.get_domain(domain_uid)
        if domain is None:
            raise NotReady(f"{ref}: ComputeDomain with uid {domain_uid} does not exist")
        where = f"ComputeDomain {domain['metadata'].get('namespace')}/{domain['metadata']['name']}"
        if self.ctx.clique is None:
            raise NotReady(f"{ref}: node {self.ctx.node} has no NVLink fabric clique; {where} needs GB200-class "
                           "nodes (nvidia.com/gpu.clique)")
        if params["kind"] == cd.DAEMON_CONFIG_KIND:
            devices = tuple(self._device(ref, r) for r in results)
            meta = domain["metadata"]
            mounts = [{"hostPath": str(self.ctx.domain_dir(domain_uid)), "containerPath": "/imexd",
                       "options": ["rw", "nosuid", "nodev", "bind"]}]
            extra = self.ctx.daemon_edits()
            mounts += [*extra.get("mounts", []), *(
                {"hostPath": host, "containerPath": path, "options": ["ro", "nosuid", "nodev", "bind"]}
                for host, path in self.ctx.imex_binaries())]
            env = [f"CLIQUE_ID={self.ctx.clique}", f"COMPUTE_DOMAIN_UUID={domain_uid}",
                   f"COMPUTE_DOMAIN_NAME={meta.get('name')}", f"COMPUTE_DOMAIN_NAMESPACE={meta.get('namespace')}"]
            daemon = {"env": env, "mounts": mounts, **{k: v for k, v in extra.items() if k != "mounts" and v}}
            spec = self._spec(ref.uid, [(d.device_name, daemon) for d in devices])
            self._write_spec(ref.uid, spec)
            self.checkpoint.claims[ref.uid] = PreparedClaim(ref.uid, ref.namespace, ref.name, "daemon", domain_uid,
                                                            devices)
            self.checkpoint.save()
            log.info("event=prepared claim=%s kind=daemon domain=%s", ref, domain_uid)
            return devices
        # A channel: the node joins the domain (the label places its daemon here), then waits for that daemon.
        other = {c.domain for c in self.checkpoint.claims.values() if c.kind == "channel"} - {domain_uid}
        if other:
            raise NotReady(f"{ref}: node {self.ctx.node} is already in ComputeDomain {sorted(other)[0]}; a node joins "
                           f"one ComputeDomain at a time (its IMEX daemon serves one domain)")
        pending = done or PreparedClaim(ref.uid, ref.namespace, ref.name, "channel", domain_uid, ())
        self.checkpoint.claims[ref.uid] = pending
        self.checkpoint.save()
        self._relabel()
        ready, why = self.daemon_ready(domain_uid)
        if not ready:
            raise DaemonNotReady(f"{ref}: waiting for the IMEX daemon of {where} on node {self.ctx.node} to be "
                                 f"ready ({why})", domain_uid)
        mode = params.get("allocationMode") or "Single"
        devices = tuple(self._device(ref, r) for r in results)
        numbers = self.ctx.device_numbers()
        major = numbers.majors.get(cd.CHANNEL_MAJOR_NAME)
        edits = []
        for d, r in zip(devices, results):
            ids = range(cd.MAX_CHANNELS) if mode == "All" else [int(str(r["device"]).rsplit("-", 1)[1])]
            nodes = [{"path": cd.channel_path(i), **({"type": "c", "major": major, "minor": i, "permissions": "rw"}
                                                      if major is not None else {})} for i in ids]
            edits.append((d.device_name, {"deviceNodes": nodes}))
        self._write_spec(ref.uid, self._spec(ref.uid, edits))
        self.checkpoint.claims[ref.uid] = PreparedClaim(ref.uid, ref.namespace, ref.name, "channel", domain_uid,
                                                        devices)
        self.checkpoint.save()
        log.info("event=prepared claim=%s kind=channel domain=%s mode=%s", ref, domain_uid, mode)
        return devices

    @staticmethod
    def _device(ref: ClaimRef, result: Mapping[str, Any]) -> DeviceResult:
        name = str(result["device"])
        return DeviceResult((str(result.get("request")),), str(result.get("pool")), name,
                            (f"{CDI_KIND}={ref.uid}-{name}",))

    @staticmethod
    def _spec(uid: str, devices: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND,
                                "devices": [{"name": f"{uid}-{name}", "containerEdits": edits} for name, edits in devices]}
        spec["cdiVersion"] = minimum_version(spec)  # the oldest that has what it uses, so older runtimes read it
        return spec

    def _write_spec(self, uid: str, spec: Mapping[str, Any]) -> None:
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.cdi_dir / f"{SPEC_PREFIX}{uid}.json", json.dumps(spec, indent=2).encode(), mode=0o644,
                     durable=False)

    def rewrite_specs_on_start(self) -> None:
        """CDI dirs are tmpfs on real nodes: after a reboot the specs are gone while the checkpoint is not.
        Daemon claims are kept (their pods still run); channel claims are prepared again on the kubelet's retry."""
        with self._lock:
            for uid, claim in list(self.checkpoint.claims.items()):
                if claim.kind == "channel" and not (self.cdi_dir / f"{SPEC_PREFIX}{uid}.json").exists():
                    self.checkpoint.claims[uid] = PreparedClaim(uid, claim.namespace, claim.name, "channel",
                                                                claim.domain, ())
            self.checkpoint.save()
