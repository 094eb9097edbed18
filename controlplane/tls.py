"""Serving over TLS, as kube-apiserver always does: kubectl (client-go) sends credentials only over TLS, so the
person's token reaches the server only this way.

A self-signed cluster CA and a serving certificate for the loopback names (127.0.0.1, ::1, localhost) are made
at start (`cryptography`), and a TLS front terminates connections and relays their bytes to an internal plain
listener on loopback whose requests are authenticated strictly: a request there without credentials is
`system:anonymous`, never the admin.

Client certificates (kube-apiserver's --client-ca-file): the front asks every client for one, accepts whatever
it presents and verifies it after the handshake (as Go's `RequestClientCert` and the x509 authenticator do:
pyOpenSSL, since Python's ssl can only refuse an untrusted certificate in the handshake), then tells the
listener behind it what the certificate says, by the address of the relayed connection (`ClientIdentities`):
the CN and Os of one the client CA signed for client authentication, or why it is refused (401 there, as a
bad token is)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import selectors
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HANDSHAKE_TIMEOUT_S = 10.0
_MAX_CONNECTIONS = 1024
# One TLS record's plaintext at most: what one recv can return (pyOpenSSL allocates the whole buffer each call).
_TLS_RECORD = 16384


@dataclass(frozen=True)
class Certificates:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    # The CA's key, to issue client certificates (empty for a kept directory made before it was kept).
    ca_key_pem: bytes = b""


@dataclass(frozen=True)
class PeerIdentity:
    """What a client certificate says: the subject's CN and Os, or `refused`, why it does not verify."""
    common_name: str
    organizations: tuple[str, ...]
    refused: str = ""


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


def peer_identity(chain: list[Any] | None, client_cas: list[Any]) -> PeerIdentity | None:
    """What the x509 authenticator makes of the chain a client presented (cryptography certificates, leaf
    first): None without one, or for one without a CN (which it does not authenticate); refused when no client
    CA signed it for client authentication or it is not valid now."""
    if not chain:
        return None
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    from cryptography.x509.verification import Criticality, ExtensionPolicy, PolicyBuilder, Store, VerificationError

    leaf = chain[0]
    cn = [a.value for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = tuple(str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    if not cn or not cn[0]:
        return None
    if not client_cas:
        return PeerIdentity(str(cn[0]), orgs, "no client CA is configured")
    # Go's x509 checks, not the Web PKI's: signatures, validity and CA basic constraints along the chain (the
    # web profile would also want key identifiers and SANs that client certificates need not have), and the
    # leaf's extended key usage, when it has one, naming client authentication.
    policy = ExtensionPolicy.permit_all()
    try:
        verifier = (PolicyBuilder().store(Store(client_cas))
                    .extension_policies(ca_policy=policy.require_present(x509.BasicConstraints, Criticality.AGNOSTIC,
                                                                         None), ee_policy=policy)
                    .build_client_verifier())
        verifier.verify(leaf, chain[1:])
    except (VerificationError, ValueError, x509.UnsupportedGeneralNameType) as exc:
        return PeerIdentity(str(cn[0]), orgs, f"verifying certificate: {exc}")
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    if usages is not None and not {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE} \
            & set(usages):
        return PeerIdentity(str(cn[0]), orgs, "verifying certificate: not for client authentication")
    return PeerIdentity(str(cn[0]), orgs)


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
                             valid_days: float = 365) -> tuple[bytes, bytes]:
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
    not_after = now + datetime.timedelta(days=valid_days)  # in the past for a negative valid_days (tests)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now - datetime.timedelta(minutes=5), not_after - datetime.timedelta(hours=1)))
            .not_valid_after(not_after)
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


@dataclass(frozen=True)
class FrontContext:
    """The front's TLS context and the client CAs its certificates are verified against."""
    ssl: Any  # OpenSSL.SSL.Context
    client_cas: list[Any]


def _accept_any(*_: Any) -> bool:
    return True  # the certificate is verified after the handshake (peer_identity), as Go's server does


def server_context(certs: Certificates, client_ca_pem: bytes | None = None) -> FrontContext:
    """The front's context: TLS 1.2 and up with the serving certificate; with `client_ca_pem`, clients are
    asked for a certificate (and told the CAs' names), which is checked afterwards."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from OpenSSL import SSL

    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.use_certificate(x509.load_pem_x509_certificate(certs.cert_pem))
    context.use_privatekey(load_pem_private_key(certs.key_pem, None))  # type: ignore[arg-type]
    context.check_privatekey()
    cas: list[Any] = []
    if client_ca_pem:
        try:
            cas = x509.load_pem_x509_certificates(client_ca_pem)
        except ValueError as exc:
            raise ValueError(f"not a PEM CA certificate bundle ({exc})") from None
        context.set_verify(SSL.VERIFY_PEER, _accept_any)
        for ca in cas:
            context.add_client_ca(ca)
    return FrontContext(context, cas)
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

    def __init__(self, listener: socket.socket, backend: tuple[str, int], context: FrontContext,
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
        from OpenSSL import SSL

        backend: socket.socket | None = None
        local: tuple[str, int] | None = None
        try:
            raw.setblocking(False)
            tls = SSL.Connection(self.context.ssl, raw)
            tls.set_accept_state()
            _handshake(tls, raw)
            backend = socket.create_connection(self.backend, timeout=_HANDSHAKE_TIMEOUT_S)
            backend.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A server's peer chain leaves the leaf out (SSL_get_peer_cert_chain): it is asked for apart.
            leaf = tls.get_peer_certificate(as_cryptography=True)
            rest = [c for c in tls.get_peer_cert_chain(as_cryptography=True) or () if c != leaf]
            identity = peer_identity([leaf, *rest] if leaf is not None else None, self.context.client_cas)
            if identity is not None:
                local = backend.getsockname()[:2]
                self.identities.add(local, identity)
            backend.setblocking(False)
            self._pump(tls, raw, backend)
        except (OSError, SSL.Error, TimeoutError):
            pass
        finally:
            if local is not None:
                self.identities.remove(local)
            for s in (backend, raw):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
            self._slots.release()

    def _pump(self, tls: Any, raw: socket.socket, backend: socket.socket) -> None:
        """Relay both ways until either side closes; TLS records already decrypted are drained before waiting."""
        from OpenSSL import SSL

        sel = selectors.DefaultSelector()
        sel.register(raw, selectors.EVENT_READ)
        sel.register(backend, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                ready = [k.fileobj for k, _ in sel.select(0.5)] if not tls.pending() else [raw]
                for src in ready:
                    if src is raw:
                        try:
                            data = tls.recv(_TLS_RECORD)
                        except SSL.WantReadError:
                            continue
                        except (SSL.ZeroReturnError, SSL.SysCallError):
                            return
                        if not data:
                            return
                        _send_all(backend, data)
                    else:
                        try:
                            data = backend.recv(65536)
                        except BlockingIOError:
                            continue
                        if not data:
                            return
                        _send_all_tls(tls, raw, data)
        finally:
            sel.close()


def _wait(sock: socket.socket, events: int, timeout: float) -> None:
    poll = selectors.DefaultSelector()
    try:
        poll.register(sock, events)
        if not poll.select(timeout):
            raise TimeoutError("the TLS peer did not answer in time")
    finally:
        poll.close()


def _handshake(tls: Any, raw: socket.socket) -> None:
    from OpenSSL import SSL

    deadline = time.monotonic() + _HANDSHAKE_TIMEOUT_S
    while True:
        try:
            tls.do_handshake()
            return
        except SSL.WantReadError:
            _wait(raw, selectors.EVENT_READ, deadline - time.monotonic())
        except SSL.WantWriteError:
            _wait(raw, selectors.EVENT_WRITE, deadline - time.monotonic())


def _send_all_tls(tls: Any, raw: socket.socket, data: bytes) -> None:
    from OpenSSL import SSL

    view = memoryview(data)
    while view:
        try:
            view = view[tls.send(view):]
        except SSL.WantWriteError:
            _wait(raw, selectors.EVENT_WRITE, 30)
        except SSL.WantReadError:
            _wait(raw, selectors.EVENT_READ, 30)


def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
            view = view[sent:]
        except (BlockingIOError, InterruptedError):
            _wait(sock, selectors.EVENT_WRITE, 30)
