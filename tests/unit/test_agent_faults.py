"""The capture agent against the server behaviours a real cluster shows and our producer once
did not: a failover whose new branch is shorter than what the agent holds, a stream opener
that wakes after its vbucket's stream ended OK, a connection lost while streams are being
opened, a node that goes away for a few seconds, and the cluster state each session ends
with. In process, on 127.0.0.1, against :class:`~dcp_cdc.simulator.server.ProducerServer`;
each test also checks the captures against the bucket's truth.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.node import Node
from dcp_cdc.agent.placement import Placement
from dcp_cdc.capture import iter_capture
from dcp_cdc.errors import CaptureConnectionError, ConnectionLostError
from dcp_cdc.events import FailoverLogResponse, StreamRequest
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.capture_harness import captured_seqnos as captured
from tests.support.capture_harness import in_process_settings as settings
from tests.support.capture_harness import truth_seqnos as truth


def stream_requests(landing: Path) -> Counter[tuple[str, int, int, int]]:
    """(file, vbucket, start, end) of every STREAM_REQ in the captures, counted."""
    out: Counter[tuple[str, int, int, int]] = Counter()
    for path in sorted(landing.glob("*.dcpcap")):
        for event in iter_capture(path):
            if isinstance(event, StreamRequest):
                out[(path.name, event.header.vbucket, event.start_seqno, event.end_seqno)] += 1
    return out


def test_until_now_rolls_back_after_a_failover_to_a_shorter_branch(tmp_path: Path) -> None:
    """Run 2 captures vbucket 3 up to seqno H2. The node then fails over to a replica that
    had it only up to H1, where run 1 stopped, and the new branch grows by 2 changes only:
    the cluster's high seqno is below the agent's position. Run 3 (``until-now``) must still
    ask the node, be told to roll back to H1, and capture the new branch: the captures end
    equal to the bucket, not to the abandoned branch. (The new branch starts at a point the
    agent captured whole, so the versions the failover restores are ones it received.)"""

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string)
            first = await asyncio.wait_for(capture(s), 30)
            server.changes(400)
            second = await asyncio.wait_for(capture(s), 30)
            vb = server.sim.bucket.vbuckets[3]
            h1, h2 = first.positions[3].seqno, second.positions[3].seqno
            old_uuid = second.positions[3].vb_uuid
            assert h2 == vb.high_seqno and h2 - h1 >= 3
            point = server.failover(3, lost=0, back=h2 - h1, grow=2)
            assert point == h1 and vb.high_seqno == h1 + 2 < h2

            third = await asyncio.wait_for(capture(s), 30)
            assert third.rollbacks >= 1
            assert third.positions[3].seqno == vb.high_seqno
            assert third.positions[3].vb_uuid == vb.uuid != old_uuid
            assert sorted(third.done) == list(range(16))
            assert captured(s.landing) == truth(server, tmp_path / "t")
            # run 3 asked for every vbucket, the unchanged ones from their end to their end
            asked = {
                event.header.vbucket
                for path in third.files
                for event in iter_capture(path)
                if isinstance(event, StreamRequest)
            }
            assert asked == set(range(16))

    asyncio.run(scenario())


def test_an_opener_that_wakes_after_its_stream_ended_ok_stands_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A placement or a high-seqnos reply may spawn a stream opener that runs only after the
    vbucket's stream ended OK, before its frames are durable. It must not ask for the stream
    again (from the old durable position: the same seqnos a second time in one session)."""
    vb_done = Placement.vb_done
    late: set[int] = set()

    def done_then_a_late_opener(self: Any, vb: int) -> None:
        vb_done(self, vb)
        if vb not in late:  # once per vbucket: the opener that was already on its way
            late.add(vb)
            for node in list(self.nodes.values()):
                if vb in node.owned:
                    self.spawn(self.open_many(node, (vb,)))

    monkeypatch.setattr(Placement, "vb_done", done_then_a_late_opener)

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=400, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string, rotate_seconds=30.0)
            summary = await asyncio.wait_for(capture(s), 30)
            assert sorted(summary.done) == list(range(8)) and late == set(range(8))
            twice = {k: n for k, n in stream_requests(s.landing).items() if n > 1}
            per_vb: Counter[int] = Counter()
            for (_f, vb, _s, _e), n in stream_requests(s.landing).items():
                per_vb[vb] += n
            assert not twice and set(per_vb.values()) == {1}, per_vb
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_a_connection_lost_while_streams_are_opened_is_the_nodes_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream opener's send meets a reset connection: its node's session closes durably and
    its vbuckets resume on a new connection; the run finishes (it used to fail with the
    reset)."""
    send = Node._send
    failed: list[str] = []

    async def reset_once(self: Any) -> None:
        if not failed and self.conn is not None and self.conn.streaming():
            failed.append(self.label)
            assert self.writer is not None
            self.writer.transport.abort()  # the socket is gone, as after a reset
            raise ConnectionLostError(self.label, "[Errno 104] Connection reset by peer")
        await send(self)

    monkeypatch.setattr(Node, "_send", reset_once)

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=400, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string)
            summary = await asyncio.wait_for(capture(s), 30)
            assert failed and summary.reconnects >= 1
            assert sorted(summary.done) == list(range(16))
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_a_reset_at_a_stream_request_is_survived(tmp_path: Path) -> None:
    """The producer resets a node's connection (TCP RST) when it receives its 5th stream
    request, twice: the run reconnects and ends with the captures equal to the truth."""

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=600, ops=0, vbuckets=32)
        async with ProducerServer(config, nodes=2) as server:
            server.cluster.cut_after_requests(0, 5)
            s = settings(tmp_path, server.connection_string)
            first = await asyncio.wait_for(capture(s), 30)
            assert first.reconnects >= 1
            server.changes(300)
            server.cluster.cut_after_requests(1, 5)
            second = await asyncio.wait_for(capture(s), 30)
            assert second.reconnects >= 1 and sorted(second.done) == list(range(32))
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_a_node_that_restarts_within_the_reconnect_timeout_costs_a_pause(
    tmp_path: Path,
) -> None:
    """A node goes away for 3 s while the agent follows a workload (its connections reset,
    nothing listens). Every placement of its vbuckets waits on one backoff per node; the
    node comes back and the capture goes on: nothing fails, nothing is lost."""

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string, reconnect_timeout_s=30.0)
            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
            work = asyncio.create_task(server.run_workload(1200, batch=50, pause_s=0.02))
            await asyncio.sleep(0.4)
            reset = await server.restart_node(1, 3.0)
            assert reset >= 1
            await work
            await asyncio.sleep(0.5)
            stop.set()
            followed = await asyncio.wait_for(follow, 30)
            assert followed.reconnects >= 1
            last = await asyncio.wait_for(capture(s), 30)
            assert sorted(last.done) == list(range(16))
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_a_node_down_when_a_run_starts_is_waited_for(tmp_path: Path) -> None:
    """``until-now`` starts while one of two nodes is down: its vbuckets, placed together,
    wait on the node's backoff (with the map asked again) and are placed anew; once it is
    back every vbucket is captured, each asked for once."""

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=16)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string, reconnect_timeout_s=30.0)
            restart = asyncio.create_task(server.restart_node(1, 1.0))
            await asyncio.sleep(0)  # node 1 stops listening
            done = await asyncio.wait_for(capture(s), 30)
            await restart
            assert sorted(done.done) == list(range(16))
            per_vb: Counter[int] = Counter()
            for (_f, vb, _s, _e), n in stream_requests(s.landing).items():
                per_vb[vb] += n
            assert per_vb == dict.fromkeys(range(16), 1)
            assert captured(s.landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_a_node_down_for_longer_than_the_reconnect_timeout_ends_the_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(tmp_path, server.connection_string, reconnect_timeout_s=1.5)
            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            restart = asyncio.create_task(server.restart_node(1, 20.0))
            with pytest.raises(CaptureConnectionError, match="reconnect_timeout_s") as info:
                await asyncio.wait_for(follow, 20)
            took = time.monotonic() - started
            restart.cancel()
            assert info.value.node == f"127.0.0.1:{server.ports[1]}"
            assert "unreachable for" in info.value.cause and "password" not in str(info.value)
            assert 1.0 < took < 15.0

    asyncio.run(scenario())


def test_each_session_ends_with_the_cluster_state_recorded(tmp_path: Path) -> None:
    """The last file of each session holds the node's high seqnos and the failover log of
    each of our vbuckets it holds: what the quality check holds silver against."""

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2) as server:
            server.changes(200)
            server.failover(2, lost=3)
            s = settings(tmp_path, server.connection_string)
            await asyncio.wait_for(capture(s), 30)
            logs = {}
            for path in sorted(s.landing.glob("*.dcpcap")):
                for event in iter_capture(path):
                    if isinstance(event, FailoverLogResponse):
                        logs[event.header.opaque] = event.failover_log
            expected = {vb.vbid: tuple(vb.failover_log) for vb in server.sim.bucket.vbuckets}
            assert logs == expected and len(expected[2]) == 2

    asyncio.run(scenario())
