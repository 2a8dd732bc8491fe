"""The capture agent's driver against the test DCP producer, in process, on 127.0.0.1.

A first ``until-now`` capture, then ``follow`` through a live workload with every fault the
producer has (a too-slow stream end, a failover that forces a rollback, a rebalance that moves
a vbucket, a node's connections cut), then ``until-now`` again to catch up from the checkpoint:
the reference consumer, reading every capture file in session order, must end with the
bucket's truth.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.driver import capture
from dcp_cdc.errors import AuthenticationError, CaptureConnectionError, ConfigError, TlsError
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.capture_harness import assert_captures_equal_truth
from tests.support.capture_harness import captured_seqnos as captured
from tests.support.capture_harness import in_process_settings as settings
from tests.support.capture_harness import truth_seqnos as truth


async def streams_open(server: ProducerServer, vbuckets: range, timeout_s: float = 30) -> None:
    """Wait until each of ``vbuckets`` has an open stream on some connection: a failover then
    ends a stream that was sent the changes it loses, so the consumer must roll back, however
    slowly the machine started the follow session's streams."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not all(any(vb in c.streams for c in server.cluster.connections) for vb in vbuckets):
        assert loop.time() < deadline, f"no open stream on some of {vbuckets} in {timeout_s} s"
        await asyncio.sleep(0.01)


def test_capture_until_now_follow_with_faults_and_resume(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=4) as server:
            s = settings(tmp_path, server.connection_string)
            first = await asyncio.wait_for(capture(s, mode="until-now"), 30)
            highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
            assert {vb: p.seqno for vb, p in first.positions.items()} == highs
            assert sorted(first.done) == list(range(16)) and first.sessions == 4
            assert all(p.parent == s.landing for p in first.files)
            assert captured(s.landing) == truth(server, tmp_path / "t1")

            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
            work = asyncio.create_task(server.run_workload(1500, batch=100, pause_s=0.02))
            await streams_open(server, range(16))  # the faults below hit open streams
            server.too_slow(1)
            await asyncio.sleep(0.1)
            server.failover(2)
            await asyncio.sleep(0.1)
            server.rebalance(3, (server.cluster.owner(3) + 1) % 4)
            await asyncio.sleep(0.1)
            server.cut_node(0)
            await work
            await asyncio.sleep(0.3)
            stop.set()
            followed = await asyncio.wait_for(follow, 30)
            assert followed.rollbacks >= 1 and followed.moves >= 1 and followed.reconnects == 1

            last = await asyncio.wait_for(capture(s, mode="until-now"), 30)
            highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
            assert {vb: p.seqno for vb, p in last.positions.items()} == highs
            assert captured(s.landing) == truth(server, tmp_path / "t2")
            assert not list(s.staging.glob("*.partial"))

    asyncio.run(scenario())


def test_wrong_password_names_the_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ProducerServer(SimConfig(docs=10, ops=0, vbuckets=4), nodes=1) as server:
            s = settings(tmp_path, server.connection_string, password="wrong")
            with pytest.raises(AuthenticationError) as info:
                await asyncio.wait_for(capture(s), 10)
            assert info.value.node == f"127.0.0.1:{server.ports[0]}"
            assert "wrong" not in str(info.value)

    asyncio.run(scenario())


def test_no_seed_answers(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        s = settings(tmp_path, f"couchbase://127.0.0.1:{port}", connect_timeout_s=1.0)
        with pytest.raises(CaptureConnectionError, match=f"127.0.0.1:{port}"):
            await asyncio.wait_for(capture(s), 10)

    asyncio.run(scenario())


def test_a_range_beyond_the_bucket_is_a_config_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ProducerServer(SimConfig(docs=10, ops=0, vbuckets=4), nodes=1) as server:
            s = settings(tmp_path, server.connection_string, vbuckets=(8, 9))
            with pytest.raises(ConfigError, match="4 vbuckets"):
                await asyncio.wait_for(capture(s), 10)

    asyncio.run(scenario())


def test_collection_filter_and_filter_empty(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with ProducerServer(SimConfig(docs=200, ops=0, vbuckets=8), nodes=2) as server:
            coll = server.colls[0]
            name = f"inventory.{coll.name}"
            s = settings(tmp_path, server.connection_string, collections=(name,))
            first = await asyncio.wait_for(capture(s), 20)
            assert sorted(first.done) == list(range(8))
            keys = captured(s.landing)
            assert keys and {cid for cid, _ in keys} == {coll.collection_id}
            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
            await asyncio.sleep(0.3)
            server.drop_collection(coll.collection_id)
            # every stream ends FILTER_EMPTY: nothing is left to follow, the capture ends
            summary = await asyncio.wait_for(follow, 20)
            assert not stop.is_set()
            assert sorted(summary.filter_empty) == list(range(8))

    asyncio.run(scenario())


def test_tls_and_an_untrusted_certificate(tmp_path: Path) -> None:
    import ssl

    from tests.support import tls_certs

    async def scenario() -> None:
        certs = tls_certs.make_certificates(tmp_path / "certs")
        other = tls_certs.make_certificates(tmp_path / "other", ca_name="another CA")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs.cert, certs.key)
        config = SimConfig(docs=400, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2, tls_context=context) as server:
            tls = "couchbases://" + ",".join(f"127.0.0.1:{p}" for p in server.tls_ports)
            s = settings(tmp_path, tls, tls_ca_file=certs.ca)
            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
            await server.run_workload(600, batch=100, pause_s=0.01)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.wait_for(follow, 20)
            done = await asyncio.wait_for(capture(s), 20)
            assert sorted(done.done) == list(range(8))
            assert all(p.name.endswith(".dcpcap") for p in done.files)
            server.write_truth(tmp_path / "t")
            assert assert_captures_equal_truth(s.landing, tmp_path / "t") > 300
            untrusted = settings(tmp_path / "u", tls, tls_ca_file=other.ca)
            with pytest.raises(TlsError, match="certificate verification failed") as info:
                await asyncio.wait_for(capture(untrusted), 20)
            assert info.value.node == f"127.0.0.1:{server.tls_ports[0]}"

    asyncio.run(scenario())


def test_until_now_ends_when_a_failover_lowered_the_high_seqno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a bounded run is the high seqno at its start. A failover that loses the
    last changes of a vbucket after that (here: as its stream is about to open) leaves an end
    the new branch never reaches; the agent asks the high seqnos again, lowers the end and
    finishes, with the captures equal to the bucket after the failover."""
    from dcp_cdc.agent.placement import Placement

    async def scenario() -> None:
        config = SimConfig(docs=400, ops=0, vbuckets=4)
        async with ProducerServer(config, nodes=2) as server:
            lowered: list[int] = []
            open_many = Placement.open_many

            async def failing_over(self: Any, node: Any, vbuckets: list[int]) -> None:
                if 1 in vbuckets and not lowered and 1 in self.end_seqnos:
                    # 5 changes written, then lost: the new branch starts where they began.
                    # The agent's end is as if its GET_ALL_VB_SEQNOS had answered between
                    # the writes and the failover.
                    lowered.append(server.failover(1, lost=5))
                    self.end_seqnos[1] = lowered[0] + 5
                await open_many(self, node, vbuckets)

            monkeypatch.setattr(Placement, "open_many", failing_over)
            s = settings(tmp_path, server.connection_string)
            done = await asyncio.wait_for(capture(s), 20)
            assert lowered and sorted(done.done) == list(range(4))
            assert done.positions[1].seqno == lowered[0]
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_until_now_names_what_each_vbucket_not_done_waits_for(tmp_path: Path) -> None:
    """A run that waits long for its last vbuckets says, per vbucket, its seqno, its end and
    whether a stream, a placement or nothing has it (what a stalled run is debugged from)."""
    from dcp_cdc.agent.placement import Placement
    from dcp_cdc.agent.positions import VbPosition

    agent = Placement(settings(tmp_path, "couchbase://127.0.0.1"), "until-now", asyncio.Event())
    agent.pending = {3, 5, 9}
    agent.end_seqnos = {3: 23, 5: 22}
    agent.durable = {3: VbPosition(3, 21, 77)}
    agent.placing = {5}
    assert agent.waiting({3}) == (
        "vbucket 3 at seqno 21 of end 23 (streaming); "
        "vbucket 5 at seqno None of end 22 (placing); "
        "vbucket 9 at seqno None of end None (idle)"
    )
