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
