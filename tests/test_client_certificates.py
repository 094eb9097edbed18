"""x509 client-certificate authentication over the HTTPS front, as kube-apiserver's --client-ca-file: the CN
is the user and each O a group, a certificate wins over a token, one no trusted CA signed (or expired, or not
for client authentication) is 401 like a bad token, and kubectl 1.37 authenticates with client-certificate-data."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from controlplane import EmbeddedApiServer
from controlplane.tls import (
    ClientIdentities,
    PeerIdentity,
    issue_client_certificate,
    make_certificates,
    peer_identity,
    read_ca_bundle,
)

KUBECTL = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "kubectl"


def _whoami(srv: EmbeddedApiServer, tmp: Path, cert: bytes | None, key: bytes | None,
            token: str | None = None) -> tuple[int, dict[str, object]]:
    assert srv.certificates is not None
    context = ssl.create_default_context(cadata=srv.certificates.ca_pem.decode())
    if cert is not None and key is not None:
        (tmp / "c.crt").write_bytes(cert)
        (tmp / "c.key").write_bytes(key)
        context.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(srv.tls_url + "/apis/authentication.k8s.io/v1/selfsubjectreviews", data=body,
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _chain(pem: bytes) -> list[x509.Certificate]:
    return [x509.load_pem_x509_certificate(pem)]


def test_peer_identity_reads_cn_and_every_o_of_a_verified_certificate() -> None:
    certs, other = make_certificates(), make_certificates()
    cas = [x509.load_pem_x509_certificate(certs.ca_pem)]
    cert, _ = issue_client_certificate(certs, "alice", ("team-a", "system:masters"))
    assert peer_identity(_chain(cert), cas) == PeerIdentity("alice", ("team-a", "system:masters"))
    assert peer_identity(None, cas) is None and peer_identity([], cas) is None
    foreign, _ = issue_client_certificate(other, "mallory", ("system:masters",))
    refused = peer_identity(_chain(foreign), cas)
    assert refused is not None and refused.common_name == "mallory" and refused.refused
    expired, _ = issue_client_certificate(certs, "old", valid_days=-1)
    assert peer_identity(_chain(expired), cas).refused  # type: ignore[union-attr]
    # A serving certificate is not for client authentication.
    assert peer_identity(_chain(certs.cert_pem), cas).refused  # type: ignore[union-attr]
    ids = ClientIdentities()
    ids.add(("127.0.0.1", 5), PeerIdentity("a", ()))
    assert ids(("127.0.0.1", 5)) == PeerIdentity("a", ())
    ids.remove(("127.0.0.1", 5))
    assert ids(("127.0.0.1", 5)) is None


def test_read_ca_bundle_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing.pem: No such file"):
        read_ca_bundle(tmp_path / "missing.pem")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="bad.pem: not a PEM CA certificate bundle"):
        read_ca_bundle(tmp_path / "bad.pem")
    (tmp_path / "ca.pem").write_bytes(make_certificates().ca_pem)
    assert read_ca_bundle(tmp_path / "ca.pem").startswith(b"-----BEGIN CERTIFICATE-----")


def test_client_certificate_is_its_cn_in_its_os_and_wins_over_a_token(tmp_path: Path) -> None:
    with EmbeddedApiServer(tls=True, unauthenticated_as_admin=False) as srv:
        cert, key = srv.client_certificate("alice", ("team-a", "team-b"))
        code, review = _whoami(srv, tmp_path, cert, key)
        assert code == 201, review
        assert review["status"] == {"userInfo": {"username": "alice",  # type: ignore[comparison-overlap]
                                                 "groups": ["team-a", "team-b", "system:authenticated"]}}
        # x509 comes before the token authenticators: the certificate is who asks, even with a bogus token.
        code, review = _whoami(srv, tmp_path, cert, key, token="bogus")
        assert code == 201 and review["status"]["userInfo"]["username"] == "alice"  # type: ignore[index]
        # RBAC applies to the certificate's user: alice may not list nodes, a system:masters certificate may.
        status, body = _get(srv, tmp_path, "/api/v1/nodes")
        assert status == 403 and 'User "alice" cannot list resource "nodes"' in str(body.get("message"))
        admin_cert, admin_key = srv.client_certificate("root", ("system:masters",))
        (tmp_path / "c.crt").write_bytes(admin_cert)
        (tmp_path / "c.key").write_bytes(admin_key)
        assert _get(srv, tmp_path, "/api/v1/nodes")[0] == 200
        # Without a certificate, nothing is remembered of an earlier connection's.
        code, review = _whoami(srv, tmp_path, None, None, token=srv.admin_token)
        assert review["status"]["userInfo"]["username"] == "kubernetes-admin"  # type: ignore[index]


def _get(srv: EmbeddedApiServer, tmp: Path, path: str) -> tuple[int, dict[str, object]]:
    assert srv.certificates is not None
    context = ssl.create_default_context(cadata=srv.certificates.ca_pem.decode())
    context.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
    try:
        with urllib.request.urlopen(urllib.request.Request(srv.tls_url + path), context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_an_untrusted_or_expired_certificate_is_401_like_a_bad_token(tmp_path: Path) -> None:
    other = make_certificates()
    cert, key = issue_client_certificate(other, "mallory", ("system:masters",))
    with EmbeddedApiServer(tls=True, unauthenticated_as_admin=False) as srv:
        code, body = _whoami(srv, tmp_path, cert, key)
        assert (code, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
        assert srv.certificates is not None
        expired, expired_key = issue_client_certificate(srv.certificates, "old", valid_days=-1)
        assert _whoami(srv, tmp_path, expired, expired_key)[0] == 401
        # A refused certificate does not stop a valid token (the authenticators' union), a bogus one is 401.
        code, review = _whoami(srv, tmp_path, cert, key, token=srv.admin_token)
        assert code == 201 and review["status"]["userInfo"]["username"] == "kubernetes-admin"  # type: ignore[index]
        assert _whoami(srv, tmp_path, cert, key, token="bogus")[0] == 401
    # --client-ca-file: that other CA is trusted, the server's own is not.
    with EmbeddedApiServer(tls=True, unauthenticated_as_admin=False, client_ca=other.ca_pem) as srv:
        code, review = _whoami(srv, tmp_path, cert, key)
        assert code == 201 and review["status"]["userInfo"]["username"] == "mallory"  # type: ignore[index]
        own_cert, own_key = srv.client_certificate("alice")
        assert _whoami(srv, tmp_path, own_cert, own_key)[0] == 401


def test_a_bad_client_ca_is_a_clear_error() -> None:
    srv = EmbeddedApiServer(tls=True, client_ca=b"junk")
    with pytest.raises(ValueError, match="the client CA: not a PEM CA certificate bundle"):
        srv.start()


@pytest.mark.process  # kubectl
def test_kubectl_authenticates_with_client_certificate_data(tmp_path: Path) -> None:
    with EmbeddedApiServer(tls=True, tls_dir=tmp_path / "pki", unauthenticated_as_admin=False) as srv:
        config = srv.kubeconfig()
        cert, key = srv.client_certificate("jane", ("system:masters", "devs"))
        config["users"] = [{"name": "gpu-dra", "user": {
            "client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key).decode()}}]
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        who = subprocess.run([str(KUBECTL), "--kubeconfig", str(path), "auth", "whoami", "-o", "json"],
                             capture_output=True, text=True, timeout=60)
        assert who.returncode == 0, who.stderr
        info = json.loads(who.stdout)["status"]["userInfo"]
        assert info == {"username": "jane", "groups": ["system:masters", "devs", "system:authenticated"]}
        listed = subprocess.run([str(KUBECTL), "--kubeconfig", str(path), "get", "namespaces", "-o", "name"],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and "namespace/default" in listed.stdout, listed.stderr
        # A kept CA directory keeps its key: a restarted server still issues and trusts client certificates.
        assert (tmp_path / "pki" / "ca.key").exists()
