"""The placement's bookkeeping of which node owns a vbucket, in the races a live run has.

A node commits the positions of the vbuckets it owns when it closes a file; a vbucket that
leaves ``owned`` while its frames are still queued there is never committed by that node. An
``until-now`` capture once ended with a vbucket done but missing from the checkpoint: a
GET_ALL_VB_SEQNOS reply took the vbucket out of ``owned`` to reopen it, a reopen opened it
first, and the opener stood down without giving it back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dcp_cdc.agent.consumer_events import HighSeqnos
from dcp_cdc.agent.placement import Placement
from dcp_cdc.config.capture import HostPort
from tests.support.capture_harness import in_process_settings


class _Core:
    """A connection core whose vbucket 0 is between two streams, then streaming again."""

    def __init__(self) -> None:
        self.open: set[int] = set()
        self.ready = True

    def streaming(self) -> frozenset[int]:
        return frozenset(self.open)

    def is_streaming(self, vb: int) -> bool:
        return vb in self.open

    def positions(self) -> dict[int, Any]:
        return {}

    def requested_end(self, vb: int) -> int | None:
        return None


def test_a_reply_that_races_a_reopen_leaves_the_vbucket_owned(tmp_path: Path) -> None:
    async def main() -> set[int]:
        agent = Placement(
            in_process_settings(tmp_path, "couchbase://127.0.0.1:1"), "until-now", asyncio.Event()
        )
        agent.pending = {0}
        core = _Core()
        node: Any = SimpleNamespace(
            conn=core, dead=False, owned={0}, endpoint=HostPort("127.0.0.1", 11210)
        )
        agent.nodes[node.endpoint] = node
        await agent.on_event(node, HighSeqnos({0: 40}))  # 0 is not streaming: open it again
        core.open.add(0)  # ... but a reopen's request went out first
        await asyncio.gather(*agent.tasks)  # the opener sees it streaming and stands down
        return set(node.owned)

    assert asyncio.run(main()) == {0}


class _AskingCore(_Core):
    """A connection core that counts its GET_ALL_VB_SEQNOS requests and the streams opened."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.answered = 0

    @property
    def asking_high_seqnos(self) -> bool:
        return self.asked > self.answered

    def request_high_seqnos(self) -> None:
        self.asked += 1

    def open_stream(self, vb: int, position: Any, **_: Any) -> None:
        self.open.add(vb)


def test_vbuckets_placed_on_a_node_share_one_request_for_their_end_seqnos(tmp_path: Path) -> None:
    """``until-now``: 256 vbuckets placed on a node before its high seqnos arrived ask for them
    once, not once each (each reply walks every vbucket owned: 256 replies of 256 vbuckets
    cost a capture of 1,024 vbuckets seconds), and the one reply opens them all."""

    async def main() -> tuple[int, set[int]]:
        agent = Placement(
            in_process_settings(tmp_path, "couchbase://127.0.0.1:1"), "until-now", asyncio.Event()
        )
        vbuckets = range(256)
        agent.pending = vbuckets
        core = _AskingCore()
        node: Any = SimpleNamespace(
            conn=core,
            dead=False,
            owned=set(),
            endpoint=HostPort("127.0.0.1", 11210),
            session_started=1.0,
        )
        node.send = _sent
        agent.nodes[node.endpoint] = node
        for vb in vbuckets:
            await agent.open_many(node, (vb,))
        asked = core.asked
        core.answered = core.asked
        await agent.on_event(node, HighSeqnos({vb: 40 for vb in vbuckets}))
        await asyncio.gather(*agent.tasks)
        assert agent.failure is None
        return asked, set(core.open)

    asked, opened = asyncio.run(main())
    assert asked == 1
    assert opened == set(range(256))


async def _sent() -> None:
    return None


def test_the_streams_a_reply_opens_on_a_node_go_out_in_one_send(tmp_path: Path) -> None:
    """``until-now``: the high seqnos of a node's 256 vbuckets open their 256 streams in one
    task and one write to the socket, not a task and a send per vbucket (at 1,024 vbuckets
    those cost the agent, and the node reading the requests one by one, a tenth of a
    second); the ones already streaming are left alone."""

    async def main() -> tuple[int, int, set[int]]:
        agent = Placement(
            in_process_settings(tmp_path, "couchbase://127.0.0.1:1"), "until-now", asyncio.Event()
        )
        vbuckets = range(256)
        agent.pending = vbuckets
        core = _AskingCore()
        core.open.add(7)  # a reopen asked for this one already
        sends = []

        async def send() -> None:
            sends.append(sorted(core.open))

        node: Any = SimpleNamespace(
            conn=core,
            dead=False,
            owned=set(vbuckets),
            endpoint=HostPort("127.0.0.1", 11210),
            session_started=1.0,
            send=send,
        )
        agent.nodes[node.endpoint] = node
        await agent.on_event(node, HighSeqnos({vb: 40 for vb in vbuckets}))
        tasks = len(agent.tasks)
        await asyncio.gather(*agent.tasks)
        assert agent.failure is None
        assert sends == [list(vbuckets)]
        return tasks, len(sends), set(node.owned)

    tasks, sent, owned = asyncio.run(main())
    assert (tasks, sent) == (1, 1)
    assert owned == set(range(256))
