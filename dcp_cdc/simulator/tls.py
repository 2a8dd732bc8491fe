"""The test producer's TLS: its server context (:func:`server_context`), client-certificate
authentication as Couchbase Server does it (:class:`ClientCertAuth`), and one connection's TLS
over memory buffers (:class:`TlsSession`).

Client-certificate authentication: with ``state`` ``mandatory`` the handshake requires a
certificate signed by the given CA, with ``enable`` it asks for one; a certificate presented
is mapped to a user by the first rule (``prefixes``: a ``path`` among ``subject.cn``,
``san.dnsname``, ``san.email``, ``san.uri``, a ``prefix`` stripped from the value's start, a
``delimiter``'s characters ending the name) that matches. The connection is then
authenticated as that user and refuses SASL; a certificate that maps to no rule, or to a
user the cluster does not have, is refused by closing the connection after the handshake.
The settings are written as Couchbase's ``/settings/clientCertAuth`` takes them.

:class:`TlsSession` drives the TLS itself (rather than an asyncio TLS transport) so that a
refused handshake sends its alert before the connection closes, as an OpenSSL server does;
Python 3.11's asyncio drops it, and a client would only see the connection close.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CERT_PATHS = ("subject.cn", "san.dnsname", "san.email", "san.uri")
_SAN_TYPES = {"san.dnsname": "DNS", "san.email": "email", "san.uri": "URI"}
"""A rule's path → the subjectAltName type of :meth:`ssl.SSLSocket.getpeercert`."""
READ_BYTES = 1 << 16

PeerCert = Mapping[str, Any]
"""A verified peer certificate as :meth:`ssl.SSLObject.getpeercert` returns it."""


@dataclass(frozen=True)
class CertRule:
    """One rule: which field of a certificate names the user, and how."""

    path: str = "subject.cn"
    prefix: str = ""
    delimiter: str = ""

    def __post_init__(self) -> None:
        if self.path not in CERT_PATHS:
            raise ValueError(
                f"client certificate rule: path {self.path!r} is not one of {CERT_PATHS}"
            )

    def _values(self, cert: PeerCert) -> list[str]:
        if self.path == "subject.cn":  # the first common name, as Couchbase reads it
            names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
            return names[:1]
        kind = _SAN_TYPES[self.path]
        return [v for k, v in cert.get("subjectAltName", ()) if k == kind]

    def user_of(self, cert: PeerCert) -> str | None:
        """The user this rule reads from ``cert``; None when the field is missing or no value
        starts with the prefix."""
        for value in self._values(cert):
            if self.prefix:
                if not value.startswith(self.prefix):
                    continue
                value = value[len(self.prefix) :]
            if self.delimiter:
                cut = [i for i, c in enumerate(value) if c in self.delimiter]
                value = value[: cut[0]] if cut else value
            if value:
                return value
        return None


@dataclass(frozen=True)
class ClientCertAuth:
    """Client-certificate authentication: the CA that signs client certificates, whether one is
    required, and the rules that map one to a user."""

    ca_file: Path
    state: Literal["enable", "mandatory"] = "mandatory"
    rules: tuple[CertRule, ...] = (CertRule(),)

    @classmethod
    def from_json(cls, ca_file: Path, text: str) -> ClientCertAuth:
        """From Couchbase's settings, ``{"state": "mandatory", "prefixes": [{"path":
        "subject.cn", "prefix": "", "delimiter": ""}]}``; ValueError says what is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"client certificate settings are not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("client certificate settings: expected a JSON object")
        state = raw.get("state", "mandatory")
        if state not in ("enable", "mandatory"):
            raise ValueError(
                f"client certificate settings: state {state!r} is not enable or mandatory"
            )
        prefixes = raw.get("prefixes", [{"path": "subject.cn"}])
        if not isinstance(prefixes, list) or not prefixes:
            raise ValueError("client certificate settings: prefixes must be a list of rules")
        rules = []
        for item in prefixes:
            if not isinstance(item, dict) or set(item) - {"path", "prefix", "delimiter"}:
                raise ValueError(f"client certificate settings: bad rule {item!r}")
            rules.append(CertRule(**{k: str(v) for k, v in item.items()}))
        return cls(ca_file, state, tuple(rules))

    def user_of(self, cert: PeerCert) -> str | None:
        """The user of the first rule that matches ``cert``; None when none does."""
        for rule in self.rules:
            user = rule.user_of(cert)
            if user is not None:
                return user
        return None

    def apply(self, context: ssl.SSLContext) -> None:
        """Make ``context`` ask for (``enable``) or require (``mandatory``) a client
        certificate signed by :attr:`ca_file`."""
        context.load_verify_locations(cafile=str(self.ca_file))
        context.verify_mode = ssl.CERT_REQUIRED if self.state == "mandatory" else ssl.CERT_OPTIONAL


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS server context with the nodes' certificate and key (PEM)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


class TlsSession:
    """The server side of one TLS connection over memory buffers: bytes from the socket in
    (:meth:`receive`, which returns the plaintext they complete), plaintext out
    (:meth:`send`), and what to write to the socket (:meth:`to_send`)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False
        """True once the handshake is done (the peer certificate, if any, verified)."""

    def receive(self, data: bytes) -> bytes:
        """The plaintext that ``data`` completes (the handshake first). ssl.SSLError when the
        handshake fails or a record is bad; the alert to send is then in :meth:`to_send`."""
        self._incoming.write(data)
        if not self.established:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.established = True
        chunks = []
        while True:
            try:
                chunk = self._ssl.read(READ_BYTES)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, data: bytes) -> None:
        """Encrypt ``data`` (into :meth:`to_send`)."""
        view = memoryview(data)
        while view:
            view = view[self._ssl.write(view) :]

    def to_send(self) -> bytes:
        """The bytes to write to the socket now (records, handshake messages, an alert)."""
        return self._outgoing.read()

    def peer_certificate(self) -> PeerCert | None:
        """The client's certificate, verified; None when it presented none (or none was asked)."""
        return self._ssl.getpeercert() or None
