"""Serving over TLS, as kube-apiserver always does: kubectl (client-go) sends credentials only over TLS, so the
person's token reaches the server only this way.

A self-signed cluster CA and a serving certificate for the loopback names (127.0.0.1, ::1, localhost) are made
at start (`cryptography`), and a TLS front terminates connections and relays their bytes to an internal plain
listener on loopback whose requests are authenticated strictly: a request there without credentials is
`system:anonymous`, never the admin.

Client certificates (kube-apiserver's --client-ca-file): the front asks every client for one and, when it
presents one the client CA signed for client authentication, tells the listener behind it who the connection
is (CN the user, each O a group) by the address of the relayed connection (`ClientIdentities`). Python's ssl
verifies during the handshake, so an untrusted or expired certificate ends the handshake with a TLS alert
where kube-apiserver (Go, which verifies after the handshake) answers 401."""

from __future__ import annotations

import datetime
import ipaddress
import os
import selectors
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HANDSHAKE_TIMEOUT_S = 10.0
_MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class Certificates:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    # The CA's key, to issue client certificates (empty for a kept directory made before it was kept).
    ca_key_pem: bytes = b""


@dataclass(frozen=True)
class PeerIdentity:
    """What a verified client certificate says: the subject's CN and Os."""
    common_name: str
    organizations: tuple[str, ...]


class ClientIdentities:
    """Verified client certificates by the (host, port) of the relayed connection to the listener behind the
    front: registered before the first byte is relayed, removed when the connection ends."""

    def __init__(self) -> None:
        self._by_address: dict[tuple[str, int], PeerIdentity] = {}

    def __call__(self, address: tuple[str, int]) -> PeerIdentity | None:
        return self._by_address.get((address[0], address[1]))

    def add(self, address: tuple[str, int], identity: PeerIdentity) -> None:
        self._by_address[(address[0], address[1])] = identity

    def remove(self, address: tuple[str, int]) -> None:
        self._by_address.pop((address[0], address[1]), None)


def peer_identity(peercert: dict[str, Any] | None) -> PeerIdentity | None:
    """The identity of a certificate `SSLSocket.getpeercert()` verified; None without one (or without a CN,
    which kube-apiserver's x509 authenticator does not authenticate)."""
    if not peercert:
        return None
    cn, orgs = "", []
    for rdn in peercert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationName":
                orgs.append(value)
    return PeerIdentity(cn, tuple(orgs)) if cn else None


def make_certificates(valid_days: int = 365) -> Certificates:
    """A cluster CA and a serving certificate it signed for 127.0.0.1, ::1 and localhost (EC P-256)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise RuntimeError("TLS serving needs the `cryptography` package (pip install cryptography), or run "
                           "without TLS (--no-tls)") from exc
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-dra-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=valid_days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.DNSName("kubernetes.default.svc"),
             x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return Certificates(ca.public_bytes(pem), cert.public_bytes(pem), _key_pem(key), _key_pem(ca_key))


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def issue_client_certificate(certs: Certificates, common_name: str, organizations: tuple[str, ...] = (),
                             valid_days: int = 365) -> tuple[bytes, bytes]:
    """A client certificate (PEM) and its key, signed by the cluster CA: CN `common_name`, one O per group,
    extended key usage clientAuth (what kubeadm puts in admin.conf)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not certs.ca_key_pem:
        raise RuntimeError("the cluster CA's key is not kept (ca.key): client certificates cannot be issued")
    ca_key = serialization.load_pem_private_key(certs.ca_key_pem, None)
    ca = x509.load_pem_x509_certificate(certs.ca_pem)
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def load_or_make(directory: Path) -> Certificates:
    """The certificates kept in `directory` (ca.crt, tls.crt, tls.key, ca.key), made there when absent, so that
    clients keep trusting the server across restarts (as a cluster's CA outlives its apiservers)."""
    files = [directory / n for n in ("ca.crt", "tls.crt", "tls.key")]
    ca_key = directory / "ca.key"
    if all(f.exists() for f in files):
        ca_pem, cert_pem, key_pem = (f.read_bytes() for f in files)
        return Certificates(ca_pem, cert_pem, key_pem, ca_key.read_bytes() if ca_key.exists() else b"")
    certs = make_certificates()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f, data in zip([*files, ca_key], (certs.ca_pem, certs.cert_pem, certs.key_pem, certs.ca_key_pem)):
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return certs


def read_ca_bundle(path: Path) -> bytes:
    """A PEM CA bundle file's bytes; ValueError naming the path when it cannot be read or holds no certificate."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    try:
        ssl.create_default_context(cadata=data.decode())
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a PEM CA certificate bundle ({exc})") from None
    return data


def server_context(certs: Certificates, client_ca_pem: bytes | None = None) -> ssl.SSLContext:
    """The front's context; with `client_ca_pem`, clients may present a certificate that CA signed (one that
    does not verify fails the handshake)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca_pem:
        try:
            context.load_verify_locations(cadata=client_ca_pem.decode())
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"not a PEM CA certificate bundle ({exc})") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(certs.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(certs.key_pem)
        context.load_cert_chain(str(cert), str(key))
    return context


class TlsFront:
    """Accepts TLS connections on `listener` and relays each one's bytes to `backend` (host, port)."""

    def __init__(self, listener: socket.socket, backend: tuple[str, int], context: ssl.SSLContext,
                 identities: ClientIdentities | None = None) -> None:
        self.listener = listener
        self.backend = backend
        self.context = context
        self.identities = identities or ClientIdentities()
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.listener.settimeout(0.5)
        self._thread = threading.Thread(target=self._accept_loop, name="apiserver-tls", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.listener.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            if not self._slots.acquire(blocking=False):
                sock.close()  # at the connection limit: refuse rather than queue
                continue
            threading.Thread(target=self._relay, args=(sock,), name="apiserver-tls-conn", daemon=True).start()

    def _relay(self, raw: socket.socket) -> None:
        tls: ssl.SSLSocket | None = None
        backend: socket.socket | None = None
        local: tuple[str, int] | None = None
        try:
            raw.settimeout(_HANDSHAKE_TIMEOUT_S)
            tls = self.context.wrap_socket(raw, server_side=True)
            backend = socket.create_connection(self.backend, timeout=_HANDSHAKE_TIMEOUT_S)
            backend.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            identity = peer_identity(tls.getpeercert())
            if identity is not None:
                local = backend.getsockname()[:2]
                self.identities.add(local, identity)
            tls.setblocking(False)
            backend.setblocking(False)
            self._pump(tls, backend)
        except (OSError, ssl.SSLError):
            pass
        finally:
            if local is not None:
                self.identities.remove(local)
            for s in (tls, backend, raw):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
            self._slots.release()

    def _pump(self, tls: ssl.SSLSocket, backend: socket.socket) -> None:
        """Relay both ways until either side closes; TLS records already decrypted are drained before waiting."""
        sel = selectors.DefaultSelector()
        sel.register(tls, selectors.EVENT_READ)
        sel.register(backend, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                ready = [k.fileobj for k, _ in sel.select(0.5)] if not tls.pending() else [tls]
                for src in ready:
                    dst = backend if src is tls else tls
                    try:
                        data = src.recv(65536)  # type: ignore[union-attr]
                    except (ssl.SSLWantReadError, BlockingIOError):
                        continue
                    if not data:
                        return
                    _send_all(dst, data)
        finally:
            sel.close()


def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
            view = view[sent:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            poll = selectors.DefaultSelector()
            poll.register(sock, selectors.EVENT_WRITE)
            poll.select(30)
            poll.close()
