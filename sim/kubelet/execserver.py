"""The kubelet's streaming server, where the embedded control plane proxies pods/exec, pods/attach and
pods/portforward (the port is the Node's status.daemonEndpoints.kubeletEndpoint):

- GET /exec/<namespace>/<pod>/<container>?command=...&stdin=&stdout=&stderr=&tty= and
  GET /attach/<namespace>/<pod>/<container>?stdin=&stdout=&stderr=&tty=, upgraded to WebSocket (controlplane.wsstream,
  subprotocols v5/v4.channel.k8s.io) and run through the runtime (`podman exec`, `podman attach`) by
  sim.kubelet.procstream: TTY, resize and stdin as kubectl sends them, the exit on channel 3.
- GET|POST /portForward/<namespace>/<pod>, upgraded to SPDY/3.1 (X-Stream-Protocol-Version portforward.k8s.io)
  and served by sim.kubelet.portforward, dialing the pod's ports inside its network namespace.

Only the API server may use it, as a kubelet with --anonymous-auth=false and the API server's client credential
authorized: a request whose Authorization the `authenticate` check refuses (none, a user's token, a node's) is
401 Unauthorized, as the kubelet's authentication filter answers, before anything is looked up.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from controlplane import wsstream as ws
from sim.kubelet import procstream
from sim.kubelet.portforward import PortForwardSession

log = logging.getLogger("sim.kubelet.exec")

PORT_FORWARD_PROTOCOL = "portforward.k8s.io"


class StreamTargets(Protocol):
    """What the streaming server needs of the node: argv for exec and attach, a dialer for port-forward."""

    def exec_argv(self, namespace: str, pod: str, container: str, command: Sequence[str], tty: bool) -> list[str] | None:
        """argv running `command` in the container, or None when it is not running on this node."""
        ...

    def attach_argv(self, namespace: str, pod: str, container: str, stdin: bool) -> tuple[list[str], bool] | None:
        """(argv attaching to the container, whether the container has a TTY), or None when it is not running."""
        ...

    def pod_uid(self, namespace: str, pod: str) -> str | None:
        """The uid of a pod this node runs, or None."""
        ...

    def dial(self, namespace: str, pod: str, port: int) -> socket.socket:
        """A socket connected to `port` inside the pod's network namespace (raises with the reason)."""
        ...


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[0] in ("true", "1")


def _exec_result(code: int) -> bytes:
    return ws.status_message(code)


def _attach_result(code: int) -> bytes:
    # The kubelet reports Success once an attach ends, whatever the container's exit; a podman failure (125:
    # the attach itself could not be made) is an error attaching.
    if code == 125:
        return ws.status_message(None, "error attaching to container: the runtime refused the attach (podman exit 125)")
    return ws.status_message(0)


class ExecServer:
    def __init__(self, targets: StreamTargets, authenticate: Callable[[str | None], bool],
                 host: str = "127.0.0.1") -> None:
        """`authenticate` says whether a request's Authorization header is the API server's credential."""
        self.targets = targets
        self.authenticate = authenticate
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

            def do_GET(self) -> None:  # noqa: N802
                outer.handle(self)

            def do_POST(self) -> None:  # noqa: N802
                outer.handle(self)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-exec", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def _refuse(h: BaseHTTPRequestHandler, code: int, message: str) -> None:
        body = message.encode()
        h.send_response(code)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if not self.authenticate(h.headers.get("Authorization")):
            log.warning("event=stream-refused reason=unauthenticated client=%s path=%s", h.client_address[0],
                        urlsplit(h.path).path)
            self._refuse(h, 401, "Unauthorized")
            return
        url = urlsplit(h.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if len(parts) == 3 and parts[0] == "portForward":
            self._port_forward(h, parts[1], parts[2])
            return
        if len(parts) != 4 or parts[0] not in ("exec", "attach"):
            self._refuse(h, 404, f"{url.path}: not found; serving /exec/NAMESPACE/POD/CONTAINER, "
                                 "/attach/NAMESPACE/POD/CONTAINER and /portForward/NAMESPACE/POD")
            return
        verb, namespace, pod, container = parts
        stdin, tty = _flag(query, "stdin"), _flag(query, "tty")
        if tty and _flag(query, "stderr"):
            self._refuse(h, 400, "stderr may not be set if tty is set")
            return
        protocol = ws.choose_protocol(h.headers.get("Sec-WebSocket-Protocol") or "")
        if (h.headers.get("Upgrade") or "").lower() != "websocket" or protocol is None:
            self._refuse(h, 400, "only WebSocket streams are served (subprotocols "
                                 f"{', '.join(ws.PROTOCOLS)}); SPDY is not")
            return
        if verb == "exec":
            command = query.get("command") or []
            if not command:
                self._refuse(h, 400, "you must specify at least 1 command")
                return
            argv = self.targets.exec_argv(namespace, pod, container, command, tty)
        else:
            attach = self.targets.attach_argv(namespace, pod, container, stdin)
            argv = None
            if attach is not None:
                argv, container_tty = attach
                tty = container_tty  # the container's terminal is what there is to attach to
        if argv is None:
            self._refuse(h, 404, f'container "{container}" of pod {namespace}/{pod} is not running on this node')
            return
        self._switch(h, f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
                        f"{ws.accept_key(h.headers.get('Sec-WebSocket-Key') or '')}\r\n"
                        f"Sec-WebSocket-Protocol: {protocol}\r\n")
        code = procstream.serve(h.connection, argv, stdin=stdin, tty=tty,
                                result=_exec_result if verb == "exec" else _attach_result,
                                detach_on_close=verb == "attach")
        log.info("event=%s-done pod=%s/%s container=%s tty=%s exit_code=%s", verb, namespace, pod, container, tty, code)

    @staticmethod
    def _switch(h: BaseHTTPRequestHandler, headers: str) -> None:
        h.wfile.write(f"HTTP/1.1 101 Switching Protocols\r\n{headers}\r\n".encode())
        h.wfile.flush()
        h.close_connection = True

    def _port_forward(self, h: BaseHTTPRequestHandler, namespace: str, pod: str) -> None:
        if (h.headers.get("Upgrade") or "").lower() != "spdy/3.1":
            self._refuse(h, 400, "port-forward is served as an SPDY/3.1 upgrade (Upgrade: SPDY/3.1)")
            return
        offered = [p.strip() for p in (h.headers.get("X-Stream-Protocol-Version") or "").split(",") if p.strip()]
        if offered and PORT_FORWARD_PROTOCOL not in offered:
            self._refuse(h, 403, f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                                 f"server supports [{PORT_FORWARD_PROTOCOL}]")
            return
        uid = self.targets.pod_uid(namespace, pod)
        if uid is None:
            self._refuse(h, 404, f"pod {namespace}/{pod} is not running on this node")
            return
        self._switch(h, f"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {PORT_FORWARD_PROTOCOL}\r\n")
        sock = h.connection
        reader = h.rfile  # bytes the client sent right after its request head are buffered here

        def recv(n: int) -> bytes:
            return reader.read1(n)

        session = PortForwardSession(recv, sock.sendall, lambda port: self.targets.dial(namespace, pod, port),
                                     f"{pod}_{namespace}", uid)
        session.serve()
        log.info("event=portforward-done pod=%s/%s", namespace, pod)
