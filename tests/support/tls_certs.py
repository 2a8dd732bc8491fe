"""Throw-away certificates for TLS tests: a CA, a server certificate it signs, and client
certificates (mutual TLS) it signs.

The server certificate names ``localhost`` and ``127.0.0.1`` (what the tests dial); a client
certificate names its user in its common name, or in a subjectAltName. Made with
``cryptography`` (a dependency of the test tools), written as PEM files into a folder the
test owns; nothing is kept.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certificates:
    ca: Path
    """The CA certificate (PEM): what a client trusts."""
    cert: Path
    """The server's certificate (PEM), signed by the CA."""
    key: Path
    """The server's private key (PEM, unencrypted)."""
    ca_key: Path
    """The CA's private key (PEM, unencrypted): what signs client certificates."""


@dataclass(frozen=True)
class ClientCertificate:
    cert: Path
    """The client's certificate (PEM), signed by a test CA."""
    key: Path
    """Its private key (PEM, unencrypted)."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificates(folder: Path, *, ca_name: str = "dcp-cdc test CA") -> Certificates:
    """A CA and a server certificate for ``localhost``/``127.0.0.1`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    out = Certificates(
        folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "ca.key"
    )
    out.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(_key_pem(key))
    out.ca_key.write_bytes(_key_pem(ca_key))
    return out


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_client_certificate(
    ca: Certificates,
    folder: Path,
    common_name: str,
    *,
    emails: tuple[str, ...] = (),
    uris: tuple[str, ...] = (),
    name: str = "client",
) -> ClientCertificate:
    """A client certificate signed by ``ca``: ``common_name`` in its subject, ``emails`` and
    ``uris`` as subjectAltNames; ``<name>.pem`` and ``<name>.key`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.RFC822Name(e) for e in emails]
    sans += [x509.UniformResourceIdentifier(u) for u in uris]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = ClientCertificate(folder / f"{name}.pem", folder / f"{name}.key")
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(_key_pem(key))
    return out
