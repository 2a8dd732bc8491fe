"""SASL SCRAM (RFC 5802, RFC 7677) as Couchbase's memcached speaks it, both sides, pure.

The mechanisms are named ``SCRAM-SHA512``, ``SCRAM-SHA256`` and ``SCRAM-SHA1`` on the wire
(no hyphen after SHA). The client sends SASL_AUTH with the client-first message, the server
answers AUTH_CONTINUE with the server-first message, SASL_STEP carries the client-final
message and the success reply the server-final one. No channel binding (``n,,``).

Nonces are arguments (tests pass fixed ones); :func:`new_nonce` makes a random one. Nothing
here logs or keeps the password beyond the salted form it needs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from dcp_cdc.errors import ScramError

MECHANISMS = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
"""Wire name → hashlib name, strongest first (the order a client prefers)."""


def new_nonce() -> str:
    return base64.b64encode(secrets.token_bytes(18)).decode()


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unsaslname(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: bytes, what: str) -> dict[str, str]:
    try:
        text = message.decode()
        return dict(part.split("=", 1) for part in text.split(","))
    except (UnicodeDecodeError, ValueError):
        raise ScramError(f"SCRAM {what} message does not parse: {message[:80]!r}") from None


def _hash(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unknown SCRAM mechanism {mechanism!r}") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


def _hmac(digest: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, digest).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


class ScramClient:
    """One client authentication: :meth:`first`, :meth:`final`, :meth:`verify`, in order."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str) -> None:
        self.mechanism = mechanism
        self._digest = _hash(mechanism)
        self._username = username
        self._password = password
        self._nonce = nonce
        self._bare = f"n={_saslname(username)},r={nonce}"
        self._server_signature = b""

    def __repr__(self) -> str:  # never the password
        return f"ScramClient({self.mechanism!r}, {self._username!r})"

    def first(self) -> bytes:
        """The client-first message (SASL_AUTH's value)."""
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message (SASL_STEP's value) for the server-first message."""
        attrs = _attributes(server_first, "server-first")
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        except (KeyError, ValueError):
            raise ScramError(f"server-first message lacks r, s or i: {server_first!r}") from None
        if not nonce.startswith(self._nonce) or iterations < 1:
            raise ScramError("server-first message: the nonce is not ours or iterations < 1")
        salted = salted_password(self.mechanism, self._password, salt, iterations)
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{server_first.decode()},{without_proof}".encode()
        client_key = _hmac(self._digest, salted, b"Client Key")
        stored_key = hashlib.new(self._digest, client_key).digest()
        signature = _hmac(self._digest, stored_key, auth_message)
        proof = base64.b64encode(_xor(client_key, signature)).decode()
        server_key = _hmac(self._digest, salted, b"Server Key")
        self._server_signature = _hmac(self._digest, server_key, auth_message)
        return f"{without_proof},p={proof}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature: a server that does not know the password fails."""
        attrs = _attributes(server_final, "server-final")
        if "e" in attrs:
            raise ScramError(f"server-final message is an error: {attrs['e']}")
        got = base64.b64decode(attrs.get("v", ""))
        if not self._server_signature or not hmac.compare_digest(got, self._server_signature):
            raise ScramError("the server's SCRAM signature does not match")


@dataclass(frozen=True)
class StoredCredential:
    """What a server keeps of a password (RFC 5802 §3): never the password itself."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(
        cls, mechanism: str, password: str, salt: bytes, iterations: int = 4096
    ) -> StoredCredential:
        digest = _hash(mechanism)
        salted = salted_password(mechanism, password, salt, iterations)
        client_key = _hmac(digest, salted, b"Client Key")
        return cls(
            salt,
            iterations,
            hashlib.new(digest, client_key).digest(),
            _hmac(digest, salted, b"Server Key"),
        )


class ScramServer:
    """One server authentication: :meth:`first` then :meth:`final`.

    ``lookup(username)`` returns the user's :class:`StoredCredential`, or None. A wrong user
    or proof raises :class:`ScramError`; the caller answers AUTH_ERROR.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], StoredCredential | None],
        nonce: str,
    ) -> None:
        self.mechanism = mechanism
        self._digest = _hash(mechanism)
        self._lookup = lookup
        self._nonce = nonce
        self._credential: StoredCredential | None = None
        self._auth_prefix = ""
        self.username: str | None = None
        self._full_nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """The server-first message for the client-first message."""
        if not client_first.startswith(b"n,,"):
            raise ScramError(f"client-first message must start with 'n,,': {client_first!r}")
        bare = client_first[3:]
        attrs = _attributes(bare, "client-first")
        if "n" not in attrs or "r" not in attrs:
            raise ScramError("client-first message lacks n or r")
        self.username = _unsaslname(attrs["n"])
        credential = self._lookup(self.username)
        if credential is None:
            raise ScramError(f"unknown user {self.username!r}")
        self._credential = credential
        nonce = attrs["r"] + self._nonce
        salt = base64.b64encode(credential.salt).decode()
        server_first = f"r={nonce},s={salt},i={credential.iterations}"
        self._auth_prefix = f"{bare.decode()},{server_first}"
        self._full_nonce = nonce
        return server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """The server-final message; raises :class:`ScramError` on a wrong proof."""
        if self._credential is None:
            raise ScramError("client-final message before client-first")
        attrs = _attributes(client_final, "client-final")
        if attrs.get("r") != self._full_nonce or "p" not in attrs:
            raise ScramError("client-final message: wrong nonce or no proof")
        without_proof = client_final.decode().rsplit(",p=", 1)[0]
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        cred = self._credential
        signature = _hmac(self._digest, cred.stored_key, auth_message)
        client_key = _xor(base64.b64decode(attrs["p"]), signature)
        if not hmac.compare_digest(hashlib.new(self._digest, client_key).digest(), cred.stored_key):
            raise ScramError(f"wrong password for user {self.username!r}")
        server_signature = _hmac(self._digest, cred.server_key, auth_message)
        return f"v={base64.b64encode(server_signature).decode()}".encode()
