"""The capture agent's TLS (``couchbases://``): the client context every data-node connection
uses (:func:`client_context`: the CA to trust and, for mutual TLS, the client certificate),
and what a TLS failure means, as a typed error naming the node (:func:`tls_failure`,
:func:`closed_after_handshake`).

With TLS 1.3 a client's handshake ends before the server has checked the client's
certificate, so a node that refuses the certificate (or its absence) answers the client's
first request with an alert, a reset or a close: never with a reply. A node that trusts the
certificate but maps it to no user of the cluster closes the connection, without an alert.
"""

from __future__ import annotations

import ssl

from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.errors import CaptureConnectionError, ClientCertificateError, ConfigError, TlsError

_REFUSALS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a client certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "it does not trust the certificate's issuer",
    "SSLV3_ALERT_BAD_CERTIFICATE": "bad certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "certificate unknown",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "unsupported certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the certificate has expired",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "the certificate is revoked",
    "TLSV1_ALERT_ACCESS_DENIED": "access denied",
}
"""The TLS alerts with which a server refuses a client certificate → what they mean."""

_SET_ONE = "set tls_cert_file and tls_key_file (mutual TLS)"


def client_context(settings: CaptureSettings) -> ssl.SSLContext:
    """The TLS context of every connection to a data node: the nodes' certificates checked
    against ``tls_ca_file`` (else the system's trust store), and the client certificate
    presented when one is set. :class:`ConfigError` names the setting and the file."""
    try:
        cafile = str(settings.tls_ca_file) if settings.tls_ca_file else None
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_ca_file {settings.tls_ca_file}: {exc}") from None
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if cert is None or key is None:
        return context

    def encrypted() -> bytes:  # asked for a passphrase: an error, never a terminal prompt
        raise ConfigError(
            f"tls_key_file {key}: the key is encrypted; the agent reads a PEM key without a "
            "passphrase (keep the file chmod 600)"
        )

    try:
        context.load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as exc:  # OpenSSL's reason only: never the file's contents
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"tls_key_file {key} is not the private key of tls_cert_file {cert}"
            ) from None
        raise ConfigError(
            f"tls_cert_file {cert}, tls_key_file {key}: expected a PEM certificate and its "
            f"PEM private key ({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"tls_cert_file {cert}, tls_key_file {key}: cannot be read ({exc.strerror or exc})"
        ) from None
    return context


def tls_failure(node: str, exc: ssl.SSLError, *, client_certificate: bool) -> TlsError:
    """The typed error of a TLS failure on ``node``'s connection, in the handshake or on a
    read before the node answered: a :class:`ClientCertificateError` when the node refused
    the client certificate (or its absence), else a :class:`TlsError`."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsError(node, f"certificate verification failed: {exc.verify_message}")
    reason = exc.reason or ""
    meaning = _REFUSALS.get(reason)
    if meaning is None:
        hint = ""
        if reason == "SSLV3_ALERT_HANDSHAKE_FAILURE" and not client_certificate:
            hint = f" (a node that requires a client certificate says so over TLS 1.2: then {_SET_ONE})"
        return TlsError(node, f"TLS handshake failed: {reason or exc}{hint}")
    alert = reason.lower().replace("_", " ")
    if not client_certificate:
        return ClientCertificateError(
            node,
            f"the node refused the connection: {meaning} ({alert}), and none is set: {_SET_ONE}",
        )
    return ClientCertificateError(
        node, f"the node refused the client certificate: {meaning} ({alert})"
    )


def closed_after_handshake(
    node: str, what: str, *, client_certificate: bool
) -> CaptureConnectionError:
    """The error of a node that ``what`` ("closed the connection", "reset the connection")
    after the TLS handshake and before its first reply: what a node does when it refuses a
    client certificate. With one set, a :class:`ClientCertificateError`; without, a
    :class:`CaptureConnectionError` (tried again) that says what to set if the cluster
    requires client certificates."""
    if client_certificate:
        return ClientCertificateError(
            node,
            f"the node {what} right after the TLS handshake, before any reply, as a node does "
            "when it refuses the client certificate (one whose issuer it does not trust, or "
            "one that maps to no user: see the cluster's client-certificate settings)",
        )
    return CaptureConnectionError(
        node,
        f"the node {what} right after the TLS handshake, before any reply (a node that "
        f"requires client certificates does so: then {_SET_ONE})",
    )
