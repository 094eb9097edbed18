"""kubectl 1.37's streaming commands against `gpu-dra cluster up` with podman: `exec -it` on a terminal (its size,
a resize mid-session, the exit code), `attach` to a TTY container and to a plain one, `run -it --rm`, and
`port-forward` over the WebSocket tunnel (kubectl's default) and over plain SPDY (its fallback), including a
port nothing listens on. kubectl runs on a pseudo-terminal where a session needs one."""

from __future__ import annotations

import functools
import fcntl
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import termios
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from gpudra.kubeapi import KubeApi
from sim.runtime import podman_missing
from tests.polling import until
from tests.cluster_helpers import KUBECTL, cluster_up

pytestmark = pytest.mark.process

NAME = "streams"
T = TypeVar("T")


_until = functools.partial(until, timeout=60.0)


@dataclass
class Cluster:
    env: dict[str, str]
    api: KubeApi

    def kubectl(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, *args], env={**self.env, **(env or {})}, capture_output=True, text=True,
                              input=stdin, timeout=timeout)

    def apply(self, manifest: str) -> None:
        done = self.kubectl("apply", "-f", "-", stdin=manifest)
        assert done.returncode == 0, done.stderr

    def running(self, pod: str) -> None:
        _until(f"pod {pod} Running", lambda: (self.api.get("Pod", pod, namespace="default").get("status") or {})
               .get("phase") == "Running")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    missing = podman_missing()
    if missing:
        pytest.skip(f"podman cannot run here: {'; '.join(missing)}")
    with cluster_up(NAME, "n1=v100-4", "podman") as up:
        api = KubeApi.connect(kubeconfig=str(up.kubeconfig))
        try:
            yield Cluster(up.env, api)
        finally:
            api.close()


class Terminal:
    """kubectl on a pseudo-terminal of `cols`x`rows`: what it printed, keys typed into it, resizes."""

    def __init__(self, env: dict[str, str], args: list[str], cols: int = 111, rows: int = 33) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: kubectl with the terminal as its stdin, stdout and stderr
            os.execve(KUBECTL, [KUBECTL, *args], env)
        self.resize(cols, rows, signal_child=False)
        self.output = b""
        self.code: int | None = None

    def resize(self, cols: int, rows: int, *, signal_child: bool = True) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signal_child:
            os.kill(self.pid, signal.SIGWINCH)  # what a terminal emulator's resize sends

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: kubectl is gone
            chunk = b""
        self.output += chunk
        return bool(chunk)

    def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            assert time.monotonic() < deadline and self._read(0.2), \
                f"{text!r} not printed; got {self.output.decode(errors='replace')!r}"
        return self.output.decode(errors="replace")

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.1) and len(self.output) < 1 << 20:
                    pass
                os.close(self.fd)
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise AssertionError(f"kubectl did not exit; printed {self.output.decode(errors='replace')!r}")
            self._read(0.1)


SERVER_POD = """
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: web
    image: busybox
    command: ["sh", "-c", "mkdir -p /tmp/www && echo served-from-the-pod > /tmp/www/index.html && httpd -f -p 8080 -h /tmp/www"]
    ports: [{containerPort: 8080, name: http}]
"""


def test_exec_it_gets_a_terminal_of_the_clients_size_follows_resizes_and_returns_the_exit_code(cluster: Cluster) -> None:
    cluster.apply(SERVER_POD)
    cluster.running("web")
    term = Terminal(cluster.env, ["exec", "-it", "web", "--", "sh"], cols=111, rows=33)
    term.type("stty size; tty; echo marker-$((6*7))\r")
    term.expect("marker-42")
    shown = term.output.decode(errors="replace")
    assert "33 111" in shown and "/dev/pts/" in shown, shown
    term.resize(150, 40)
    # kubectl's resize goes on channel 4 while the shell waits; asked again until it has arrived.
    for attempt in range(10):
        term.type(f"stty size; echo resized-$(({attempt}+1))\r")
        term.expect(f"resized-{attempt + 1}")
        if "40 150" in term.output.decode(errors="replace"):
            break
        time.sleep(0.5)
    assert "40 150" in term.output.decode(errors="replace")
    term.type("exit 5\r")
    assert term.wait() == 5, term.output
    assert "command terminated with exit code 5" in term.output.decode(errors="replace")
    # stdin without a terminal still works.
    piped = cluster.kubectl("exec", "-i", "web", "--", "sh", "-c", "read x; echo got-$x", stdin="it\n")
    assert piped.returncode == 0 and piped.stdout == "got-it\n", piped.stderr


def test_attach_to_a_tty_container_and_to_a_plain_one(cluster: Cluster) -> None:
    cluster.apply("""
apiVersion: v1
kind: Pod
metadata: {name: console}
spec:
  containers: [{name: sh, image: busybox, command: ["sh"], stdin: true, tty: true}]
""")
    cluster.running("console")
    term = Terminal(cluster.env, ["attach", "-it", "console"], cols=90, rows=20)
    term.expect("If you don't see a command prompt, try pressing enter.")
    # kubectl's first resize may reach the shell while stty runs (SIGWINCH: "Interrupted system call"), as on a
    # real node; the size itself must be the client's.
    for attempt in range(5):
        term.type(f"stty size; echo attached-$(({attempt}+5))\r")
        term.expect(f"attached-{attempt + 5}")
        if "20 90" in term.output.decode(errors="replace"):
            break
    assert "20 90" in term.output.decode(errors="replace")
    term.type("exit\r")  # the container's shell ends; the attach ends with it
    assert term.wait() == 0, term.output
    assert "Session ended, resume using 'kubectl attach console -c sh -n default -i -t' command" in \
        term.output.decode(errors="replace")
    _until("the console restarted", lambda: any(c.get("restartCount") for c in (
        cluster.api.get("Pod", "console", namespace="default").get("status") or {}).get("containerStatuses") or []))
    # A plain container: what it prints from now on, stdout and stderr apart, until it exits.
    cluster.apply("""
apiVersion: v1
kind: Pod
metadata: {name: ticker}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "sleep 2; for i in 1 2 3; do echo tick-$i; echo tock-$i >&2; sleep 0.3; done"]
""")
    cluster.running("ticker")
    attached = cluster.kubectl("attach", "ticker")
    assert attached.returncode == 0, attached.stderr
    assert [line for line in attached.stdout.splitlines() if line] == ["tick-1", "tick-2", "tick-3"]
    assert [line for line in attached.stderr.splitlines() if line.startswith("tock")] == ["tock-1", "tock-2", "tock-3"]


def test_run_it_rm_returns_the_containers_exit_code_and_deletes_the_pod(cluster: Cluster) -> None:
    term = Terminal(cluster.env, ["run", "-it", "--rm", "--restart=Never", "oneoff", "--image=busybox", "--", "sh"])
    term.expect("If you don't see a command prompt, try pressing enter.", timeout=60)
    term.type("echo inside-$((3*3)); exit 4\r")
    code = term.wait(timeout=60)
    shown = term.output.decode(errors="replace")
    assert "inside-9" in shown and 'pod "oneoff" deleted' in shown, shown
    assert code == 4, shown
    assert cluster.kubectl("get", "pod", "oneoff").returncode != 0


def _http_get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=10) as answer:
        return str(answer.read().decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_forward(cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    local = _free_port()
    proc = subprocess.Popen([KUBECTL, "port-forward", *args[:-1], f"{local}:{args[-1]}"],
                            env={**cluster.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(f"Forwarding from 127.0.0.1:{local} -> "), line + proc.stderr.read() if proc.stderr else ""
    return proc, local


def _stop(proc: subprocess.Popen[Any]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
    out, err = proc.communicate(timeout=30)
    return out, err


@pytest.mark.parametrize("transport", ["websocket", "spdy"])
def test_port_forward_reaches_the_pods_port(cluster: Cluster, transport: str) -> None:
    cluster.apply(SERVER_POD)
    cluster.running("web")
    # kubectl 1.37 tunnels SPDY in a WebSocket; with the gate off it upgrades to SPDY itself (its fallback).
    env = {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"} if transport == "spdy" else {}
    proc, local = _port_forward(cluster, "pod/web", "http", env=env)
    try:
        assert _until("the forwarded page", lambda: _http_get(local)) == "served-from-the-pod\n"
        assert _http_get(local) == "served-from-the-pod\n"  # a second connection on the same session
    finally:
        out, err = _stop(proc)
    assert out.count(f"Handling connection for {local}") >= 2, out + err


def test_port_forward_to_a_port_nothing_listens_on_reports_the_kubelets_error(cluster: Cluster) -> None:
    cluster.apply(SERVER_POD)
    cluster.running("web")
    proc, local = _port_forward(cluster, "pod/web", "9999")
    try:
        with socket.create_connection(("127.0.0.1", local), timeout=10) as conn:
            conn.settimeout(10)
            assert conn.recv(100) == b""  # closed: nothing behind the port
        code = proc.wait(timeout=30)
    finally:
        out, err = _stop(proc)
    uid = cluster.api.get("Pod", "web", namespace="default")["metadata"]["uid"]
    assert code == 1, out + err
    assert f"error forwarding port 9999 to pod web_default, uid {uid}: failed to connect to localhost:9999" in err, err
    assert "dial tcp4 127.0.0.1:9999: connect: connection refused" in err and "error: lost connection to pod" in err
    # A pod that is not running is refused by kubectl before any stream, as on a cluster.
    cluster.apply("""
apiVersion: v1
kind: Pod
metadata: {name: done}
spec:
  restartPolicy: Never
  containers: [{name: main, image: busybox, command: ["true"]}]
""")
    _until("pod done Succeeded", lambda: (cluster.api.get("Pod", "done", namespace="default").get("status") or {})
           .get("phase") == "Succeeded")
    refused = cluster.kubectl("port-forward", "pod/done", "8080")
    assert refused.returncode != 0
    assert "unable to forward port because pod is not running. Current status=Succeeded" in refused.stderr
    attach_done = cluster.kubectl("exec", "done", "--", "true")
    assert "cannot exec into a container in a completed pod; current phase is Succeeded" in attach_done.stderr
