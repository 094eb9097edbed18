"""GET pods/NAME/log (`kubectl logs`, `-f`): container logs read from the testbed's log source as the kubelet
serves them; a followed log, like a watch, leaves the worker pool."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from controlplane import status as st
from controlplane.params import bool_param, int_param
from controlplane.podlogs import parse_cri_log
from controlplane.routing import Responder, Route, start_chunked

_LOG_FOLLOW_POLL_S = 0.2  # how often a followed log is checked for new lines


class PodLogStream:
    def __init__(self, handler: Responder) -> None:
        self.h = handler
        self.ctx = handler.ctx
        self.wfile = handler.wfile

    def serve(self, r: Route, query: dict[str, str]) -> None:
        """GET pods/NAME/log: container, follow, previous, timestamps, tailLines, as the kubelet serves them."""
        assert r.name is not None
        pod = self.ctx.store.get(r.rt, r.namespace, r.name)
        spec = pod.get("spec") or {}
        names = [str(c.get("name")) for part in ("initContainers", "containers") for c in spec.get(part) or []]
        main = [str(c.get("name")) for c in spec.get("containers") or []]
        container = query.get("container") or ""
        if not container:
            if len(main) != 1:
                raise st.bad_request(f"a container name must be specified for pod {r.name}, choose one of: "
                                     f"[{' '.join(main)}]")
            container = main[0]
        elif container not in names:
            raise st.bad_request(f"container {container} is not valid for pod {r.name}")
        tail = int_param(query, "tailLines")
        timestamps = query.get("timestamps") == "true"
        previous = query.get("previous") == "true"
        source = self.ctx.pod_logs
        path = source.log_file(r.namespace, r.name, str(pod["metadata"].get("uid")), container, previous) if source else None
        if path is None or not path.exists():
            if source is None:
                raise st.bad_request(f"container {container!r} in pod {r.name!r}: no logs: this API server has no "
                                     "container log source (pods on simulated nodes with a container runtime have logs)")
            if previous:
                raise st.bad_request(f'previous terminated container "{container}" in pod "{r.name}" not found')
            raise st.bad_request(f'container "{container}" in pod "{r.name}" is waiting to start: '
                                 f"{_waiting_reason(pod, container)}")

        def render(raw: str) -> bytes:
            return "".join((f"{line.timestamp} " if timestamps else "") + line.text for line in parse_cri_log(raw)).encode()

        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        text = complete.decode(errors="replace")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail > 0 else ""
        if not bool_param(query, "follow"):
            self.h._send(200, render(text), "text/plain")
            return
        # A followed log is long-lived, like a watch.
        start_chunked(self.h, "text/plain", "too many watches and followed logs are open; retry later")
        offset = len(complete)
        try:
            self._log_chunk(render(text))
            while not self.ctx.stopping:
                ended = self._container_ended(r, container, str(pod["metadata"].get("uid")))
                try:
                    data = path.read_bytes()
                except OSError:
                    break
                end = data.rfind(b"\n") + 1
                if end > offset:
                    self._log_chunk(render(data[offset:end].decode(errors="replace")))
                    offset = end
                if ended:
                    break
                time.sleep(_LOG_FOLLOW_POLL_S)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return

    def _container_ended(self, r: Route, container: str, uid: str) -> bool:
        """The pod is gone (or replaced) or this container's latest run has terminated: a followed log ends."""
        try:
            pod = self.ctx.store.get(r.rt, r.namespace, r.name or "")
        except st.StatusError:
            return True
        if str(pod["metadata"].get("uid")) != uid:
            return True
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return True
        for c in status.get("containerStatuses") or []:
            if c.get("name") == container:
                return "terminated" in (c.get("state") or {})
        return False

    def _log_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()


def _waiting_reason(pod: Mapping[str, Any], container: str) -> str:
    """Why the container has not started, as its status says (the kubelet's validateContainerLogStatus):
    CreateContainerConfigError, PodInitializing, ...; ContainerCreating while it has no status yet."""
    status = pod.get("status") or {}
    for entry in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if isinstance(entry, Mapping) and entry.get("name") == container:
            waiting = (entry.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return str(waiting["reason"])
    return "ContainerCreating"
