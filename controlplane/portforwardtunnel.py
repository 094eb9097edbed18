"""pods/portforward for a WebSocket client, as kube-apiserver 1.31+ serves kubectl's default: the client's SPDY/3.1
session comes tunneled in WebSocket binary messages (subprotocol SPDY/3.1+portforward.k8s.io); the kubelet is
reached with a plain SPDY/3.1 upgrade, and the session's bytes are unwrapped towards it and wrapped back. Nothing
here looks inside SPDY."""

from __future__ import annotations

import socket
import threading
from typing import Any

from controlplane import execproxy
from controlplane import status as st
from controlplane import wsstream as ws

TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"
KUBELET_PROTOCOL = "portforward.k8s.io"


def is_websocket(headers: Any) -> bool:
    return str(headers.get("Upgrade") or "").lower() == "websocket"


def serve(client: socket.socket, headers: Any, host: str, port: int, namespace: str, pod: str,
          credential: str) -> None:
    offered = [p.strip() for p in str(headers.get("Sec-WebSocket-Protocol") or "").split(",") if p.strip()]
    if TUNNEL_PROTOCOL not in offered:
        raise st.bad_request(f"unable to upgrade: port-forward over WebSocket needs subprotocol {TUNNEL_PROTOCOL} "
                             f"(offered: {', '.join(offered) or 'none'})")
    upstream, head = execproxy.open_upstream(
        host, port, "POST", execproxy.kubelet_path("portforward", namespace, pod, "", ""),
        {"Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": KUBELET_PROTOCOL}, credential)
    early = head.split(b"\r\n\r\n", 1)[1]
    send_lock = threading.Lock()

    def to_client(opcode: int, payload: bytes) -> None:
        with send_lock:
            client.sendall(ws.frame(opcode, payload))

    upstream.settimeout(None)
    client.settimeout(None)
    client.sendall((f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {ws.accept_key(str(headers.get('Sec-WebSocket-Key') or ''))}\r\n"
                    f"Sec-WebSocket-Protocol: {TUNNEL_PROTOCOL}\r\n\r\n").encode())

    def from_client() -> None:
        try:
            while True:
                op, data = ws.read_message(client)
                if op == ws.OP_CLOSE:
                    break
                if op == ws.OP_PING:
                    to_client(ws.OP_PONG, data)
                elif op in (ws.OP_BINARY, ws.OP_TEXT) and data:
                    upstream.sendall(data)
        except (ws.WsError, OSError):
            pass
        try:
            upstream.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    reader = threading.Thread(target=from_client, name="portforward-tunnel", daemon=True)
    reader.start()
    try:
        if early:
            to_client(ws.OP_BINARY, early)
        while chunk := upstream.recv(65536):
            to_client(ws.OP_BINARY, chunk)
        to_client(ws.OP_CLOSE, b"\x03\xe8")
    except OSError:
        pass
    finally:
        upstream.close()
        reader.join(timeout=5)
