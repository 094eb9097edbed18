"""pods/exec, pods/attach and pods/portforward as kube-apiserver serves them: the request (a WebSocket upgrade, as
kubectl 1.30+ sends it, or SPDY) is passed to the kubelet of the pod's node (its Node's
status.daemonEndpoints.kubeletEndpoint, on the node's InternalIP or loopback) at /exec/<namespace>/<pod>/<container>,
/attach/... or /portForward/<namespace>/<pod>, and once the kubelet has switched protocols, bytes are relayed both
ways until either side closes. The kubelet speaks the channel protocol for exec and attach; nothing here looks
inside it. Port-forward reaches the kubelet as SPDY; a WebSocket client's tunneled SPDY
(controlplane.portforwardtunnel) is unwrapped on the way."""

from __future__ import annotations

import select
import socket
from typing import Any
from urllib.parse import quote

from controlplane import status as st

_HOP_HEADERS = ("Upgrade", "Connection", "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Protocol",
                "X-Stream-Protocol-Version")
CONNECT_TIMEOUT_S = 10.0
MAX_HEAD = 64 * 1024


SUBRESOURCES = ("exec", "attach", "portforward")


def target(store: Any, pod_rt: Any, node_rt: Any, namespace: str, name: str, container: str | None,
           subresource: str = "exec") -> tuple[str, int, str]:
    """(kubelet host, port, container) for pods/<subresource> of namespace/name; StatusErrors as kube-apiserver's
    (container is "" for portforward)."""
    pod = store.get(pod_rt, namespace, name)
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        raise st.bad_request(f"pod {name} does not have a host assigned")
    phase = (pod.get("status") or {}).get("phase")
    chosen = ""
    if subresource != "portforward":
        if phase in ("Succeeded", "Failed"):
            raise st.bad_request(f"cannot {subresource} into a container in a completed pod; current phase is {phase}")
        containers = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []]
        inits = [str(c.get("name")) for c in (pod.get("spec") or {}).get("initContainers") or []]
        chosen = container or (containers[0] if containers else "")
        if chosen not in containers + inits:
            raise st.bad_request(f"container {chosen} is not valid for pod {name}")
    node = store.get(node_rt, "", node_name)
    status = node.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise st.StatusError(503, "ServiceUnavailable", f"node {node_name} publishes no kubelet endpoint")
    host = next((a.get("address") for a in status.get("addresses") or []
                 if a.get("type") == "InternalIP" and a.get("address")), "127.0.0.1")
    return str(host), port, chosen


def kubelet_path(subresource: str, namespace: str, pod: str, container: str, query: str) -> str:
    ns, name = quote(namespace, safe=""), quote(pod, safe="")
    if subresource == "portforward":
        return f"/portForward/{ns}/{name}"
    return f"/{subresource}/{ns}/{name}/{quote(container, safe='')}?{query}"


def open_upstream(host: str, port: int, method: str, path: str, headers: dict[str, str],
                  credential: str) -> tuple[socket.socket, bytes]:
    """Send the upgrade request to the kubelet with the server's kubelet client `credential` (a bearer token:
    the kubelet serves only the API server); (its socket, its 101 response head and any bytes after it).
    A refusal is raised as kube-apiserver relays it."""
    headers = {**headers, "Authorization": f"Bearer {credential}"}
    try:
        upstream = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise st.StatusError(502, "BadGateway", f"error dialing the kubelet at {host}:{port}: {exc}") from exc
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"] + [f"{k}: {v}" for k, v in headers.items()]
    upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = upstream.recv(4096)
        if not chunk or len(head) > MAX_HEAD:
            upstream.close()
            raise st.StatusError(502, "BadGateway", "the kubelet closed the stream before answering")
        head += chunk
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    if " 101 " not in first + " ":
        body = head.split(b"\r\n\r\n", 1)[1].decode(errors="replace").strip()
        upstream.close()
        code = int(first.split()[1]) if len(first.split()) > 1 and first.split()[1].isdigit() else 502
        raise st.StatusError(code if 400 <= code < 600 else 502, "BadRequest" if code == 400 else "NotFound"
                             if code == 404 else "InternalError", body or first)
    return upstream, head


def relay(client: socket.socket, headers: Any, host: str, port: int, subresource: str, namespace: str, pod: str,
          container: str, query: str, credential: str) -> None:
    """Open the kubelet's stream and relay it to `client` (whose request head has been read)."""
    path = kubelet_path(subresource, namespace, pod, container, query)
    hop = {h: str(headers.get(h)) for h in _HOP_HEADERS if headers.get(h)}
    upstream, head = open_upstream(host, port, "GET" if subresource != "portforward" else "POST", path, hop,
                                   credential)
    client.sendall(head)
    upstream.settimeout(None)
    client.settimeout(None)
    try:
        while True:
            ready, _, _ = select.select([client, upstream], [], [])
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                (upstream if src is client else client).sendall(data)
    except OSError:
        return
    finally:
        upstream.close()
