"""The upstream cluster's certificates and kubeconfigs, as kubeadm lays them out: one cluster CA, the API
server's serving certificate, the ServiceAccount signing key, and one client certificate per identity (the admin
in system:masters, each kubelet as system:node:NAME in system:nodes, the scheduler, the controller-manager,
kube-proxy, and the API server's own client to the kubelets)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpudra.atomicfile import atomic_write

_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Identity:
    """A client certificate's subject: what the x509 authenticator makes the user name and groups."""
    file: str
    common_name: str
    organizations: tuple[str, ...] = ()


ADMIN = Identity("admin", "kubernetes-admin", ("system:masters",))
SCHEDULER = Identity("scheduler", "system:kube-scheduler")
CONTROLLER_MANAGER = Identity("controller-manager", "system:kube-controller-manager")
KUBE_PROXY = Identity("kube-proxy", "system:kube-proxy")
# kube-apiserver's client to kubelets (logs, exec, port-forward), bound to system:kubelet-api-admin by the
# ClusterRoleBinding the cluster applies at start.
APISERVER_KUBELET_CLIENT = Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client")


def node_identity(node: str) -> Identity:
    return Identity(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name(attrs + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Pki:
    """A directory of PEM files (0600 keys), made once per cluster and kept across restarts."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca_key_file = self.dir / "ca.key"
        if not ca_key_file.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            name = _name("gpu-dra-upstream-ca")
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                    .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                 content_commitment=False, key_encipherment=True,
                                                 data_encipherment=False, key_agreement=False, encipher_only=False,
                                                 decipher_only=False), critical=True)
                    .sign(key, hashes.SHA256()))
            atomic_write(self.dir / "ca.crt", cert.public_bytes(serialization.Encoding.PEM))
            atomic_write(ca_key_file, _key_pem(key), mode=0o600)
        self._ca_key: Any = serialization.load_pem_private_key(ca_key_file.read_bytes(), None)
        self._ca = x509.load_pem_x509_certificate((self.dir / "ca.crt").read_bytes())

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def _issue(self, stem: str, subject: x509.Name, usage: x509.ObjectIdentifier,
               sans: list[x509.GeneralName]) -> tuple[Path, Path]:
        cert_file, key_file = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        if cert_file.exists() and key_file.exists():
            return cert_file, key_file
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self._ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        atomic_write(key_file, _key_pem(key), mode=0o600)
        atomic_write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return cert_file, key_file

    def serving(self, stem: str, common_name: str, dns: list[str], ips: list[str]) -> tuple[Path, Path]:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        return self._issue(stem, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, who: Identity) -> tuple[Path, Path]:
        return self._issue(who.file, _name(who.common_name, who.organizations), ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def service_account_keys(self) -> tuple[Path, Path]:
        """The ServiceAccount token signing key and its public half (kube-apiserver's --service-account-*)."""
        key_file, pub_file = self.dir / "sa.key", self.dir / "sa.pub"
        if not key_file.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            atomic_write(pub_file, key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
            atomic_write(key_file, _key_pem(key), mode=0o600)
        return key_file, pub_file

    def kubeconfig(self, who: Identity, server: str, target: Path, *, context: str = "default") -> Path:
        """A kubeconfig that authenticates as `who` with its certificate, the CA inlined."""
        cert_file, key_file = self.client(who)
        config = kubeconfig_document(context, server, self.ca_file.read_bytes(), cert_file.read_bytes(),
                                     key_file.read_bytes())
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(target, yaml.safe_dump(config).encode(), mode=0o600)
        return target


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_document(name: str, server: str, ca: bytes, cert: bytes, key: bytes) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
            "users": [{"name": name, "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
