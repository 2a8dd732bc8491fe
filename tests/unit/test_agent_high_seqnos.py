"""The cluster's high seqnos asked once (what ``dcp-cdc status`` measures the capture against),
over the capture agent's own connections, against the test producer on 127.0.0.1: every
vbucket of the range from its active node, a node that is down, no seed answering, a wrong
password, TLS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dcp_cdc.agent.high_seqnos import ask_high_seqnos
from dcp_cdc.errors import AuthenticationError, CaptureConnectionError
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.capture_harness import in_process_settings as settings
from tests.support.ports import free_port


def _model_highs(server: ProducerServer) -> dict[int, int]:
    return {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}


def test_every_vbucket_from_its_active_node_and_the_range_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="basic", docs=300, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=4) as server:
            answer = await ask_high_seqnos(settings(tmp_path, server.connection_string))
            highs = _model_highs(server)
            assert answer.seqnos == highs and sum(highs.values()) > 300
            assert answer.vbuckets == 16 and answer.problems == ()
            assert sorted(answer.nodes) == sorted(f"127.0.0.1:{p}" for p in server.ports)

            server.changes(40)
            after = _model_highs(server)
            assert sum(after.values()) - sum(highs.values()) == 40  # one seqno a change
            ranged = settings(tmp_path, server.connection_string, vbuckets=(4, 9))
            answer = await ask_high_seqnos(ranged)
            assert answer.seqnos == {vb: after[vb] for vb in range(4, 10)}
            assert answer.vbuckets == 6
            owners = {server.cluster.owner(vb) for vb in range(4, 10)}
            assert len(answer.nodes) == len(owners)  # only the nodes that hold them

    asyncio.run(scenario())


def test_a_node_that_is_down_leaves_its_vbuckets_unknown(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="basic", docs=200, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2) as server:
            down = asyncio.create_task(server.restart_node(1, 5.0))
            await asyncio.sleep(0.1)  # node 1 listens no more
            answer = await ask_high_seqnos(settings(tmp_path, server.connection_string))
            node1 = [vb for vb in range(8) if server.cluster.owner(vb) == 1]
            highs = _model_highs(server)
            assert answer.seqnos == {vb: highs[vb] for vb in range(8) if vb not in node1}
            assert answer.nodes == (f"127.0.0.1:{server.ports[0]}",)
            (problem,) = answer.problems
            assert f"127.0.0.1:{server.ports[1]}" in problem
            assert f"({len(node1)} vbuckets unknown)" in problem
            down.cancel()

    asyncio.run(scenario())


def test_no_seed_answers(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port()  # nothing listens there
        s = settings(tmp_path, f"couchbase://127.0.0.1:{port}", connect_timeout_s=1.0)
        with pytest.raises(CaptureConnectionError, match=f"127.0.0.1:{port}.*cannot connect"):
            await asyncio.wait_for(ask_high_seqnos(s), 10)

    asyncio.run(scenario())


def test_a_wrong_password_is_the_agents_typed_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ProducerServer(SimConfig(docs=10, ops=0, vbuckets=4), nodes=1) as server:
            s = settings(tmp_path, server.connection_string, password="wrong")
            with pytest.raises(AuthenticationError) as info:
                await asyncio.wait_for(ask_high_seqnos(s), 10)
            assert "wrong" not in str(info.value)

    asyncio.run(scenario())


def test_over_tls(tmp_path: Path) -> None:
    import ssl

    from tests.support import tls_certs

    async def scenario() -> None:
        certs = tls_certs.make_certificates(tmp_path / "certs")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.cert, certs.key)
        config = SimConfig(scenario="basic", docs=100, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2, tls_context=context) as server:
            tls = "couchbases://" + ",".join(f"127.0.0.1:{p}" for p in server.tls_ports)
            answer = await ask_high_seqnos(settings(tmp_path, tls, tls_ca_file=certs.ca))
            assert answer.seqnos == _model_highs(server)
            assert sorted(answer.nodes) == sorted(f"127.0.0.1:{p}" for p in server.tls_ports)

    asyncio.run(scenario())
