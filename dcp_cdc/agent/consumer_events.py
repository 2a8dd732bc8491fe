"""What the capture agent's DCP consumer (:class:`~dcp_cdc.agent.consumer.ConsumerConnection`)
tells its driver: one small frozen dataclass per event (:data:`AgentEvent`), and
:data:`NEED_DATA` when none is queued.

Apart from the consumer so that the driver, which reacts to these, reads them without the
protocol code that makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dcp_cdc.agent.positions import FailoverEntries


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is done: streams may be opened."""

    features: tuple[str, ...]
    cluster_config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A cluster map: a GET_CLUSTER_CONFIG reply, a change notification (0x82/0x01; an empty
    ``config`` when the server sent only the revision) or a NOT_MY_VBUCKET body."""

    config: dict[str, Any]
    rev: int


@dataclass(frozen=True, slots=True)
class HighSeqnos:
    """GET_ALL_VB_SEQNOS: the high seqno of every vbucket active on this node."""

    seqnos: dict[int, int]


@dataclass(frozen=True, slots=True)
class ClusterStateRecorded:
    """:meth:`~dcp_cdc.agent.consumer.ConsumerConnection.record_cluster_state` is done: the node's high seqnos and the
    failover logs of the vbuckets asked for are in the capture (as their reply frames)."""

    high_seqnos: dict[int, int]
    failover_logs: dict[int, FailoverEntries]


@dataclass(frozen=True, slots=True)
class CollectionsManifest:
    """GET_COLLECTIONS_MANIFEST: the bucket's scopes and collections (uids as hex strings)."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StreamOpened:
    vbucket: int
    failover_log: FailoverEntries


@dataclass(frozen=True, slots=True)
class StreamRolledBack:
    """The server asked for a rollback to ``seqno``; the core has re-requested from there."""

    vbucket: int
    seqno: int


@dataclass(frozen=True, slots=True)
class NotMyVbucket:
    """This node does not hold the vbucket active: refresh the map, open it on its owner."""

    vbucket: int


@dataclass(frozen=True, slots=True)
class StreamRefused:
    """A STREAM_REQ refused with another status (ETMPFAIL, ENOMEM, EACCESS, ...)."""

    vbucket: int
    status: int
    status_name: str


@dataclass(frozen=True, slots=True)
class StreamEnded:
    vbucket: int
    reason: int
    reason_name: str


@dataclass(frozen=True, slots=True)
class ControlRefused:
    """An optional DCP_CONTROL the server refused (EINVAL / NOT_SUPPORTED): recorded only."""

    key: str
    status: int


AgentEvent = (
    Ready
    | ClusterConfig
    | HighSeqnos
    | ClusterStateRecorded
    | CollectionsManifest
    | StreamOpened
    | StreamRolledBack
    | NotMyVbucket
    | StreamRefused
    | StreamEnded
    | ControlRefused
)


class NeedData:
    """:meth:`~dcp_cdc.agent.consumer.ConsumerConnection.next_event`'s answer when no event is queued."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()
