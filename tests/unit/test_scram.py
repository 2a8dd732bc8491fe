"""SCRAM both ways: the RFC 7677 test vector (SCRAM-SHA-256), then client against server."""

from __future__ import annotations

import pytest

from dcp_cdc.errors import ScramError
from dcp_cdc.scram import MECHANISMS, ScramClient, ScramServer, StoredCredential

# RFC 7677 §3: user "user", password "pencil".
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc7677_client_messages() -> None:
    client = ScramClient("SCRAM-SHA256", "user", "pencil", CLIENT_NONCE)
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final(SERVER_FIRST) == CLIENT_FINAL
    client.verify(SERVER_FINAL)
    with pytest.raises(ScramError, match="signature"):
        client.verify(b"v=" + b"A" * 44)


def test_rfc7677_server_messages() -> None:
    import base64

    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = StoredCredential.make("SCRAM-SHA256", "pencil", salt, 4096)
    server = ScramServer("SCRAM-SHA256", {"user": cred}.get, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == SERVER_FIRST
    assert server.final(CLIENT_FINAL) == SERVER_FINAL


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize(("user", "password", "ok"), [("a,b=c", "sécret", True), ("u", "x", False)])
def test_client_against_server(mechanism: str, user: str, password: str, ok: bool) -> None:
    cred = StoredCredential.make(mechanism, "sécret", b"salt-salt", 64)
    server = ScramServer(mechanism, {"a,b=c": cred, "u": cred}.get, "srv")
    client = ScramClient(mechanism, user, password, "cli")
    server_first = server.first(client.first())
    client_final = client.final(server_first)
    if not ok:
        with pytest.raises(ScramError, match="wrong password for user 'u'"):
            server.final(client_final)
        return
    client.verify(server.final(client_final))
    assert server.username == "a,b=c"
    assert "sécret" not in repr(client)


def test_unknown_user_and_garbage() -> None:
    server = ScramServer("SCRAM-SHA512", {}.get, "srv")
    with pytest.raises(ScramError, match="unknown user 'nobody'"):
        server.first(b"n,,n=nobody,r=abc")
    with pytest.raises(ScramError, match="must start"):
        ScramServer("SCRAM-SHA512", {}.get, "s").first(b"p=tls,,n=x,r=y")
    with pytest.raises(ScramError, match="nonce is not ours"):
        ScramClient("SCRAM-SHA512", "u", "p", "abc").final(b"r=zzz,s=AAAA,i=1")
    with pytest.raises(ScramError, match="unknown SCRAM mechanism"):
        ScramClient("SCRAM-MD5", "u", "p", "abc")
