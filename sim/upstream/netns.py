"""The cluster's network namespace, and the forwarder that lets the machine's loopback reach the API server in it.

A net namespace is per thread in Linux (setns(2) with CLONE_NEWNET changes only the calling thread), so one
process can listen on the machine's 127.0.0.1 and connect inside the cluster's namespace: the forwarder's
listening socket is made before the process enters the namespace, its outgoing sockets after.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import socket
import subprocess
import threading
from pathlib import Path

from sim.upstream.layout import ADDRESS_LINK, API_ADDRESS, NETWORK, NodePlan

_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    pass


def _ip(*argv: str) -> None:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(argv)}: {result.stderr.strip()}")


def exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def create(name: str, nodes: tuple[NodePlan, ...]) -> None:
    """The namespace with loopback up, a port-less bridge holding the API server's and the nodes' addresses (the
    kernel may lack the dummy link type), and IPv4 forwarding on (pods reach the API server's address and each
    other through the nodes' bridges). A namespace half made is deleted again."""
    if exists(name):
        raise NetnsError(f"network namespace {name} exists already (a cluster of that name is up, or was not "
                         f"taken down: gpu-dra cluster down, or `ip netns delete {name}`)")
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", ADDRESS_LINK, "type", "bridge")
        _ip("-n", name, "addr", "add", f"{API_ADDRESS}/{NETWORK.prefixlen}", "dev", ADDRESS_LINK)
        for node in nodes:
            _ip("-n", name, "addr", "add", f"{node.address}/32", "dev", ADDRESS_LINK)
        _ip("-n", name, "link", "set", ADDRESS_LINK, "up")
        _ip("netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    except NetnsError:
        delete(name)
        raise


def delete(name: str) -> None:
    if exists(name):
        _ip("netns", "delete", name)


def pids(name: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def enter(name: str) -> None:
    """Move the calling thread (call it before starting any other) into the namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise NetnsError(f"setns {name}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def host_listener() -> socket.socket:
    """A listening socket on the machine's 127.0.0.1 (call before `enter`)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return listener


class Forwarder:
    """Relays each connection accepted on `listener` to `target` (bytes only: TLS passes through to the API
    server, which sees the client's certificate or token itself)."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self.listener, self.target = listener, target
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> None:
        threading.Thread(target=self._accept, name="forwarder", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        pair = {client: upstream, upstream: client}
        sel = selectors.DefaultSelector()
        for sock in pair:
            sel.register(sock, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=1.0):
                    src = key.fileobj
                    assert isinstance(src, socket.socket)
                    data = src.recv(65536)
                    if not data:
                        return
                    pair[src].sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            upstream.close()
