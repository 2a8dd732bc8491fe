"""Mutual TLS over real sockets on 127.0.0.1: the capture agent presents a client certificate
(no password), and the test producer requires it, checks its issuer and maps it to a user as
Couchbase Server does. A missing, untrusted or unmapped certificate is a typed error naming
the node; the key and the password never show."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.agent.tls import client_context
from dcp_cdc.errors import AuthenticationError, ClientCertificateError, ConfigError, TlsError
from dcp_cdc.protocol import ClientOpcode, Status
from dcp_cdc.simulator.commands import ProducerCommands
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from dcp_cdc.simulator.tls import CertRule, ClientCertAuth, server_context
from tests.support.capture_harness import assert_captures_equal_truth
from tests.support.capture_harness import in_process_settings as settings
from tests.support.tls_certs import (
    Certificates,
    ClientCertificate,
    make_certificates,
    make_client_certificate,
)
from tests.unit.test_producer_server import Client

USER, PASSWORD = "dcp-reader", "s3cret-Passw0rd"
REPO = Path(__file__).resolve().parents[2]
TLS_VERSIONS = {"tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}


def mtls_server(
    certs: Certificates,
    *,
    nodes: int = 1,
    auth: ClientCertAuth | None = None,
    tls_version: str = "tls1.3",
    docs: int = 100,
) -> ProducerServer:
    context = server_context(certs.cert, certs.key)
    context.maximum_version = TLS_VERSIONS[tls_version]
    return ProducerServer(
        SimConfig(docs=docs, ops=0, vbuckets=8),
        nodes=nodes,
        users={USER: PASSWORD},
        tls_context=context,
        client_certs=auth or ClientCertAuth(certs.ca),
    )


def tls_string(server: ProducerServer) -> str:
    return "couchbases://" + ",".join(f"127.0.0.1:{p}" for p in server.tls_ports)


def cert_settings(
    tmp: Path, server: ProducerServer, certs: Certificates, client: ClientCertificate | None
) -> CaptureSettings:
    """The agent's settings: with ``client``, its certificate and no user or password."""
    auth: dict[str, Any] = {"username": USER, "password": PASSWORD}
    if client is not None:
        auth = {"username": "", "password": "", "tls_cert_file": client.cert}
        auth["tls_key_file"] = client.key
    return settings(tmp, tls_string(server), tls_ca_file=certs.ca, **auth)


def assert_no_secret(error: BaseException, client: ClientCertificate | None) -> None:
    text = str(error)
    assert PASSWORD not in text
    if client is not None:
        body = "".join(client.key.read_text().splitlines()[1:-1])
        assert body[:40] not in text


def test_the_right_certificate_captures_without_a_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = make_certificates(tmp_path / "certs")
    client = make_client_certificate(certs, tmp_path / "client", USER)
    mapped: list[str] = []
    by_certificate = ProducerCommands.authenticate_by_certificate

    def recording(self: ProducerCommands, user: str) -> None:
        mapped.append(user)
        by_certificate(self, user)

    monkeypatch.setattr(ProducerCommands, "authenticate_by_certificate", recording)

    async def scenario() -> None:
        async with mtls_server(certs, nodes=2, docs=300) as server:
            await server.run_workload(300, batch=100)
            s = cert_settings(tmp_path, server, certs, client)
            done = await asyncio.wait_for(capture(s), 30)
            assert sorted(done.done) == list(range(8)) and done.sessions == 2
            server.write_truth(tmp_path / "t")
        assert assert_captures_equal_truth(s.landing, tmp_path / "t") > 200

    asyncio.run(scenario())
    # every connection (the seed's, then one per node) was the certificate's user's; a SASL
    # request on one would have been refused (NOT_SUPPORTED) and failed the capture
    assert len(mapped) == 3 and set(mapped) == {USER}


@pytest.mark.parametrize("tls_version", sorted(TLS_VERSIONS))
def test_a_missing_client_certificate_names_the_node(tmp_path: Path, tls_version: str) -> None:
    certs = make_certificates(tmp_path / "certs")

    async def scenario() -> None:
        async with mtls_server(certs, tls_version=tls_version) as server:
            s = cert_settings(tmp_path, server, certs, None)
            with pytest.raises(TlsError) as info:
                await asyncio.wait_for(capture(s), 20)
            assert info.value.node == f"127.0.0.1:{server.tls_ports[0]}"
            assert "set tls_cert_file and tls_key_file" in info.value.cause
            if tls_version == "tls1.3":  # the alert comes after the client's handshake
                assert isinstance(info.value, ClientCertificateError)
                assert "it requires a client certificate" in info.value.cause
            else:  # TLS 1.2 has no alert of its own for it
                assert "SSLV3_ALERT_HANDSHAKE_FAILURE" in info.value.cause
            assert_no_secret(info.value, None)

    asyncio.run(scenario())


@pytest.mark.parametrize("tls_version", sorted(TLS_VERSIONS))
def test_a_certificate_of_another_ca_names_the_node(tmp_path: Path, tls_version: str) -> None:
    certs = make_certificates(tmp_path / "certs")
    other = make_certificates(tmp_path / "other", ca_name="another CA")
    client = make_client_certificate(other, tmp_path / "client", USER)

    async def scenario() -> None:
        async with mtls_server(certs, tls_version=tls_version) as server:
            s = cert_settings(tmp_path, server, certs, client)
            with pytest.raises(ClientCertificateError) as info:
                await asyncio.wait_for(capture(s), 20)
            node = f"127.0.0.1:{server.tls_ports[0]}"
            assert info.value.node == node
            assert str(info.value) == (
                f"{node}: the node refused the client certificate: it does not trust the "
                "certificate's issuer (tlsv1 alert unknown ca)"
            )
            assert_no_secret(info.value, client)

    asyncio.run(scenario())


def test_a_certificate_that_maps_to_no_user_names_the_node(tmp_path: Path) -> None:
    """Couchbase closes the connection after the handshake, with no alert: the agent says
    what that means, once, and does not try again."""
    certs = make_certificates(tmp_path / "certs")
    client = make_client_certificate(certs, tmp_path / "client", "nobody")

    async def scenario() -> None:
        async with mtls_server(certs) as server:
            s = cert_settings(tmp_path, server, certs, client)
            with pytest.raises(ClientCertificateError) as info:
                await asyncio.wait_for(capture(s), 20)
            assert info.value.node == f"127.0.0.1:{server.tls_ports[0]}"
            assert "right after the TLS handshake, before any reply" in info.value.cause
            assert "maps to no user" in info.value.cause
            assert_no_secret(info.value, client)

    asyncio.run(scenario())


def test_enable_mode_takes_a_password_or_a_certificate_by_san(tmp_path: Path) -> None:
    """With ``state = enable`` a client without a certificate authenticates by SASL; one with
    a certificate is its user's, read here from an e-mail subjectAltName by a prefix-less rule
    with a delimiter, after a rule that does not match."""
    certs = make_certificates(tmp_path / "certs")
    client = make_client_certificate(
        certs, tmp_path / "client", "not-a-user", emails=(f"{USER}@example.com",)
    )
    auth = ClientCertAuth(
        certs.ca,
        "enable",
        (CertRule("san.uri", prefix="spiffe://"), CertRule("san.email", delimiter="@")),
    )

    async def scenario() -> None:
        async with mtls_server(certs, auth=auth) as server:
            for name, client_cert in (("sasl", None), ("cert", client)):
                s = cert_settings(tmp_path / name, server, certs, client_cert)
                done = await asyncio.wait_for(capture(s), 20)
                assert sorted(done.done) == list(range(8))

    asyncio.run(scenario())


def test_a_certificate_authenticated_connection_refuses_sasl(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    client = make_client_certificate(certs, tmp_path / "client", USER)
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(client.cert, client.key)

    async def scenario() -> None:
        async with mtls_server(certs) as server:
            port = server.tls_ports[0]
            assert port is not None
            c = await Client.connect(port, context)
            for opcode in (ClientOpcode.SASL_LIST_MECHS, ClientOpcode.SASL_AUTH):
                reply = await c.call(opcode, key=b"PLAIN", value=f"\0{USER}\0{PASSWORD}".encode())
                assert reply[2] == Status.NOT_SUPPORTED
            await c.open_dcp(server.config.bucket)  # authenticated already
            c.writer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("cert", "rules", "user"),
    [
        ({"subject": ((("commonName", "alice"),),)}, [CertRule()], "alice"),
        (
            {"subject": ((("commonName", "x"),), (("commonName", "y"),))},
            [CertRule()],
            "x",  # the first common name, as Couchbase reads it
        ),
        (
            {"subjectAltName": (("email", "bob@corp.example"),)},
            [CertRule("san.email", delimiter="@")],
            "bob",
        ),
        (
            {"subjectAltName": (("URI", "spiffe://corp/dcp/carol"), ("URI", "urn:x"))},
            [CertRule("san.uri", prefix="spiffe://corp/dcp/")],
            "carol",
        ),
        (
            {"subjectAltName": (("DNS", "www.host-1.corp"),)},
            [CertRule("san.dnsname", prefix="www.", delimiter=".")],
            "host-1",
        ),
        (
            {"subject": ((("commonName", "svc-dave"),),)},
            [CertRule("san.email"), CertRule(prefix="svc-")],
            "dave",  # the first rule finds no e-mail: the next one is tried
        ),
        ({"subject": ((("commonName", "dave"),),)}, [CertRule(prefix="svc-")], None),
        ({"subjectAltName": (("DNS", "h"),)}, [CertRule()], None),
    ],
)
def test_certificate_rules_map_a_certificate_to_a_user(
    cert: dict[str, Any], rules: list[CertRule], user: str | None
) -> None:
    assert ClientCertAuth(Path("ca.pem"), rules=tuple(rules)).user_of(cert) == user


def test_client_cert_settings_read_as_couchbase_writes_them() -> None:
    auth = ClientCertAuth.from_json(
        Path("ca.pem"),
        json.dumps(
            {
                "state": "enable",
                "prefixes": [
                    {"path": "san.email", "prefix": "", "delimiter": "@"},
                    {"path": "subject.cn", "prefix": "svc-", "delimiter": ""},
                ],
            }
        ),
    )
    assert auth.state == "enable"
    assert auth.rules == (CertRule("san.email", "", "@"), CertRule("subject.cn", "svc-", ""))
    for text, message in [
        ('{"state": "disable"}', "not enable or mandatory"),
        ('{"prefixes": [{"path": "subject.ou"}]}', "path 'subject.ou'"),
        ('{"prefixes": [{"path": "subject.cn", "colour": 1}]}', "bad rule"),
        ("[]", "JSON object"),
    ]:
        with pytest.raises(ValueError, match=message):
            ClientCertAuth.from_json(Path("ca.pem"), text)


def test_a_key_that_is_not_the_certificates_or_is_encrypted_is_a_config_error(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives import serialization

    certs = make_certificates(tmp_path / "certs")
    one = make_client_certificate(certs, tmp_path / "client", USER, name="one")
    two = make_client_certificate(certs, tmp_path / "client", USER, name="two")
    key = serialization.load_pem_private_key(one.key.read_bytes(), password=None)
    encrypted = tmp_path / "client" / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )

    def context(cert: Path, key: Path) -> None:
        client_context(
            settings(
                tmp_path,
                "couchbases://127.0.0.1",
                password="",
                tls_ca_file=certs.ca,
                tls_cert_file=cert,
                tls_key_file=key,
            )
        )

    with pytest.raises(ConfigError, match=f"tls_key_file {two.key} is not the private key"):
        context(one.cert, two.key)
    with pytest.raises(ConfigError, match="the key is encrypted"):
        context(one.cert, encrypted)  # and no passphrase prompt on the terminal
    with pytest.raises(ConfigError, match="expected a PEM certificate and its PEM private key"):
        context(one.key, one.key)
    with pytest.raises(ConfigError, match="set both or neither"):
        settings(tmp_path, "couchbases://127.0.0.1", tls_cert_file=one.cert)
    with pytest.raises(ConfigError, match="needs couchbases://"):
        settings(tmp_path, "couchbase://127.0.0.1", tls_cert_file=one.cert, tls_key_file=one.key)


def test_the_producer_command_and_dcp_cdc_capture_with_a_client_certificate(
    tmp_path: Path,
) -> None:
    """``python -m dcp_cdc.simulator.server --tls-client-ca`` requires client certificates;
    ``dcp-cdc capture`` with ``tls_cert_file``, ``tls_key_file`` and no password captures."""
    from pipelines.app.cli import main

    certs = make_certificates(tmp_path / "certs")
    make_client_certificate(certs, tmp_path / "conf" / "tls", USER)
    ports = tmp_path / "ports.json"
    command = [sys.executable, "-m", "dcp_cdc.simulator.server", "--nodes", "2",
               "--vbuckets", "8", "--docs", "100", "--ops", "0", "--port-file", str(ports),
               "--users", f"{USER}:{PASSWORD}", "--tls-cert", str(certs.cert),
               "--tls-key", str(certs.key), "--tls-client-ca", str(certs.ca)]  # fmt: skip
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not ports.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "producer did not start"
            time.sleep(0.05)
        tls_ports = json.loads(ports.read_text())["tls_ports"]
        config = tmp_path / "conf" / "conf.toml"
        config.write_text(
            f'landing = "{tmp_path / "landing"}"\nwarehouse = "{tmp_path / "warehouse"}"\n'
            '[[buckets]]\nname = "travel-sample"\n[buckets.capture]\n'
            'connection_string = "couchbases://'
            + ",".join(f"127.0.0.1:{p}" for p in tls_ports)
            + f'"\ntls_ca_file = "{certs.ca}"\n'
            'tls_cert_file = "tls/client.pem"\ntls_key_file = "tls/client.key"\n'
            "rotate_seconds = 0.5\nconnect_timeout_s = 5\n"
        )
        out = StringIO()
        assert main(["capture", "--config", str(config)], out) == 0
        assert "capture (until-now): 8 vbuckets" in out.getvalue()
        assert "vbuckets done: 8" in out.getvalue()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_certificate_the_node_does_not_ask_for_is_an_authentication_error(
    tmp_path: Path,
) -> None:
    """A node whose client-certificate handling is off does not ask for the certificate; the
    agent sends no password, so the connection has no user and the bucket is refused: an
    error naming the node and what to check."""
    certs = make_certificates(tmp_path / "certs")
    client = make_client_certificate(certs, tmp_path / "client", USER)

    async def scenario() -> None:
        server = ProducerServer(
            SimConfig(docs=20, ops=0, vbuckets=4),
            nodes=1,
            users={USER: PASSWORD},
            tls_context=server_context(certs.cert, certs.key),
        )
        async with server:
            s = cert_settings(tmp_path, server, certs, client)
            with pytest.raises(AuthenticationError) as info:
                await asyncio.wait_for(capture(s), 20)
            assert info.value.node == f"127.0.0.1:{server.tls_ports[0]}"
            assert info.value.cause.startswith(
                "the user of the client certificate may not access bucket 'travel-sample' "
                "(does the cluster authenticate by client certificates"
            )

    asyncio.run(scenario())
