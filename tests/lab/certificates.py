"""Certificates for a lab whose engines listen on TCP behind TLS both ways (Docker's "protect the daemon
socket"): a CA of the lab's own, each engine's certificate for its address, and a client certificate for the
portal in a folder of Docker's names (ca.pem, cert.pem, key.pem: PORTAL_DOCKER_TLS_DIR)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.lab.lab import Node

Key = ec.EllipticCurvePrivateKey


def _key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def _write(folder: Path, stem: str, certificate: x509.Certificate, key: Key | None = None) -> None:
    (folder / f"{stem}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_file = folder / f"{stem.replace('cert', 'key')}.pem"
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_file.chmod(0o600)


def _signed(
    name: str, key: Key, issuer: x509.Name, signer: Key, *, ca: bool = False, usage: x509.ObjectIdentifier | None = None
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder


def make(folder: Path, nodes: Iterable[Node]) -> Path:
    """The CA and each node's engine certificate in ``folder`` (``<node>-cert.pem``, ``<node>-key.pem``); returns
    the portal's client folder (``folder/client``)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-portal lab CA")])
    ca = _signed("gpu-portal lab CA", ca_key, ca_name, ca_key, ca=True).sign(ca_key, hashes.SHA256())
    _write(folder, "ca", ca)
    for node in nodes:
        key = _key()
        names = [x509.DNSName(node.name), x509.IPAddress(ipaddress.IPv4Address(node.address))]
        builder = _signed(node.name, key, ca_name, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        _write(folder, f"{node.name}-cert", builder.sign(ca_key, hashes.SHA256()), key)
    client = folder / "client"
    client.mkdir(exist_ok=True)
    key = _key()
    builder = _signed("gpu-portal", key, ca_name, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(client, "cert", builder.sign(ca_key, hashes.SHA256()), key)
    _write(client, "ca", ca)
    return client
