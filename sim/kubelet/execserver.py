"""The kubelet's streaming server for `kubectl exec`: GET /exec/<namespace>/<pod>/<container>?command=...&stdin=
&stdout=&stderr=&tty= upgraded to WebSocket (sim.kubelet.wsstream), the command run in the container through the
runtime (`podman exec`), its output streamed on channels 1 and 2 and its exit on channel 3. The embedded control
plane proxies pods/exec here (the port is the Node's status.daemonEndpoints.kubeletEndpoint). TTYs and resize are
not simulated (tty=true is refused)."""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from sim.kubelet import wsstream as ws

log = logging.getLogger("sim.kubelet.exec")

# (namespace, pod, container) -> argv that runs `command` in that container with stdin kept open, or None.
ExecArgv = Callable[[str, str, str, Sequence[str]], "list[str] | None"]


class ExecServer:
    def __init__(self, exec_argv: ExecArgv, host: str = "127.0.0.1") -> None:
        self.exec_argv = exec_argv
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

            def do_GET(self) -> None:  # noqa: N802
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

    def _refuse(self, h: BaseHTTPRequestHandler, code: int, message: str) -> None:
        body = message.encode()
        h.send_response(code)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        if len(parts) != 4 or parts[0] != "exec":
            self._refuse(h, 404, f"{url.path}: not found; serving /exec/NAMESPACE/POD/CONTAINER")
            return
        _, namespace, pod, container = parts
        command = query.get("command") or []
        if not command:
            self._refuse(h, 400, "you must specify at least 1 command")
            return
        if (query.get("tty") or ["false"])[0] in ("true", "1"):
            self._refuse(h, 400, "tty is not supported by the gpu-dra kubelet simulator; use kubectl exec without -t")
            return
        protocol = ws.choose_protocol(h.headers.get("Sec-WebSocket-Protocol") or "")
        if (h.headers.get("Upgrade") or "").lower() != "websocket" or protocol is None:
            self._refuse(h, 400, "only WebSocket streams are served (subprotocols "
                                 f"{', '.join(ws.PROTOCOLS)}); SPDY is not")
            return
        argv = self.exec_argv(namespace, pod, container, command)
        if argv is None:
            self._refuse(h, 404, f'container "{container}" of pod {namespace}/{pod} is not running on this node')
            return
        key = h.headers.get("Sec-WebSocket-Key") or ""
        h.wfile.write((f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Accept: {ws.accept_key(key)}\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n")
                      .encode())
        h.wfile.flush()
        h.close_connection = True
        self._stream(h, argv, stdin=(query.get("stdin") or ["false"])[0] in ("true", "1"))

    def _stream(self, h: BaseHTTPRequestHandler, argv: list[str], *, stdin: bool) -> None:
        sock = h.connection
        send_lock = threading.Lock()

        def send(payload: bytes) -> None:
            with send_lock:
                sock.sendall(ws.frame(ws.OP_BINARY, payload))

        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            send(ws.status_message(None, f"starting the command failed: {exc}"))
            return
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        if not stdin:
            proc.stdin.close()

        def pump(stream: object, channel: int) -> None:
            while chunk := stream.read1(65536):  # type: ignore[attr-defined]
                try:
                    send(bytes([channel]) + chunk)
                except OSError:
                    return

        pumps = [threading.Thread(target=pump, args=(proc.stdout, ws.STDOUT), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, ws.STDERR), daemon=True)]
        for t in pumps:
            t.start()

        def read_client() -> None:
            try:
                while True:
                    op, data = ws.read_message(sock)
                    if op == ws.OP_CLOSE:
                        break
                    if op == ws.OP_PING:
                        with send_lock:
                            sock.sendall(ws.frame(ws.OP_PONG, data))
                        continue
                    if op != ws.OP_BINARY or not data:
                        continue
                    if data[0] == ws.STDIN and stdin and not proc.stdin.closed:  # type: ignore[union-attr]
                        proc.stdin.write(data[1:])  # type: ignore[union-attr]
                        proc.stdin.flush()  # type: ignore[union-attr]
                    elif data[0] == ws.CLOSE and data[1:2] == bytes([ws.STDIN]) and not proc.stdin.closed:  # type: ignore[union-attr]
                        proc.stdin.close()  # type: ignore[union-attr]
            except (ws.WsError, OSError, ValueError):
                pass
            if proc.poll() is None and not proc.stdin.closed:  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]

        threading.Thread(target=read_client, daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(timeout=5)
        try:
            send(ws.status_message(code))
            with send_lock:
                sock.sendall(ws.frame(ws.OP_CLOSE, b"\x03\xe8"))
        except OSError:
            pass
        log.info("event=exec-done argv0=%s exit_code=%d", argv[0], code)
