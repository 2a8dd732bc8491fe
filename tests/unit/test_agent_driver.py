"""The capture agent's driver against the test DCP producer, in process, on 127.0.0.1.

A first ``until-now`` capture, then ``follow`` through a live workload with every fault the
producer has (a too-slow stream end, a failover that forces a rollback, a rebalance that moves
a vbucket, a node's connections cut), then ``until-now`` again to catch up from the checkpoint:
the reference consumer, reading every capture file in session order, must end with the
bucket's truth.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.driver import CaptureSettings, capture
from dcp_cdc.errors import AuthenticationError, CaptureConnectionError, ConfigError
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.reference_consumer import ReferenceConsumer

BUCKET = "travel-sample"


def settings(tmp: Path, connection_string: str, **changes: Any) -> CaptureSettings:
    base: dict[str, Any] = {
        "connection_string": connection_string,
        "bucket": BUCKET,
        "username": "Administrator",
        "password": "password",
        "landing": tmp / "landing",
        "staging": tmp / "landing" / ".dcp-cdc-capture",
        "state_dir": tmp / "state",
        "buffer_bytes": 1 << 16,
        "connect_timeout_s": 5.0,
        "rotate_seconds": 0.3,
        "backoff_s": 0.05,
        "noop_interval_s": 2,
    }
    base.update(changes)
    return CaptureSettings(**base)


def truth(server: ProducerServer, out: Path) -> dict[tuple[int, bytes], tuple[int, int]]:
    server.write_truth(out)
    docs = {}
    for line in (out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"].encode() if "key" in d else base64.b64decode(d["key_b64"])
        docs[(d["collection_id"], key)] = (d["seqno"], d["rev_seqno"])
    return docs


def captured(landing: Path) -> dict[tuple[int, bytes], tuple[int, int]]:
    consumer = ReferenceConsumer()
    consumer.consume(landing)
    assert consumer.errors == []
    return {k: (v.seqno, v.rev_seqno) for k, v in consumer.state().items()}


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
            await asyncio.sleep(0.2)
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
