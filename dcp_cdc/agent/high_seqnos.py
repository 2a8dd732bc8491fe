"""The cluster's high seqnos, asked once: what ``dcp-cdc status`` measures the capture
against.

The same connections as the capture agent's (:class:`~dcp_cdc.agent.node.Link`: TCP, TLS,
the handshake and its authentication, from the bucket's ``[buckets.capture]`` settings): a
seed node gives the cluster map (docs/protocol/dcp.md §4), then every data node that holds
vbuckets of the agent's range active is asked GET_ALL_VB_SEQNOS, and the answers are kept
for those vbuckets only. Nothing streams; each connection closes after its answer.

A node that does not answer leaves its vbuckets unknown (:attr:`ClusterSeqnos.problems`
says why); no seed node answering, or a refused login or certificate, raises the typed error
(:class:`~dcp_cdc.errors.CaptureConnectionError`, :class:`~dcp_cdc.errors.AuthenticationError`,
:class:`~dcp_cdc.errors.TlsError`), which the caller reports.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
from dataclasses import dataclass

from dcp_cdc.agent.cluster import ClusterMap, parse_cluster_map
from dcp_cdc.agent.node import Link
from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.agent.tls import client_context
from dcp_cdc.config.capture import HostPort
from dcp_cdc.errors import AuthenticationError, CaptureConnectionError, ProtocolError, TlsError


@dataclass(frozen=True, slots=True)
class ClusterSeqnos:
    """What the cluster answered: per vbucket of the agent's range, its high seqno on its
    active node; ``vbuckets`` is the range's size in the cluster map (the vbuckets that
    should have answered), ``nodes`` the data nodes that answered, ``problems`` one line per
    node that did not (its vbuckets are missing from ``seqnos``)."""

    seqnos: dict[int, int]
    vbuckets: int
    nodes: tuple[str, ...]
    problems: tuple[str, ...]
    asked_at: dt.datetime


class _Asker:
    """The :class:`~dcp_cdc.agent.node.Dialler` of the links: the capture settings, their TLS
    context, and connection names of their own (``dcp-cdc:<agent>:status-...``): a node
    closes an earlier connection of the same name, and never one of the agent's this way."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        self.tls = settings.cluster.tls
        self.ssl_context: ssl.SSLContext | None = client_context(settings) if self.tls else None
        self._started = time.time()

    def next_session_id(self, index: int, started: float | None = None) -> str:
        stamp = dt.datetime.fromtimestamp(self._started, dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        return f"status-{stamp}-{index}"


async def _cluster_map(asker: _Asker) -> ClusterMap:
    """The cluster map of the first seed node that answers."""
    problems = []
    for seed in asker.settings.cluster.seeds:
        link = Link(asker, seed, 0)
        try:
            ready = await link.connect()
        except (AuthenticationError, TlsError):
            raise  # every node would refuse it the same way
        except CaptureConnectionError as exc:
            problems.append(str(exc))
            continue
        finally:
            await link.close()
        try:
            return parse_cluster_map(ready.cluster_config, seed.host)
        except ProtocolError as exc:
            raise CaptureConnectionError(seed.label, str(exc)) from None
    seeds = ",".join(s.label for s in asker.settings.cluster.seeds)
    raise CaptureConnectionError(seeds, "no seed node answered: " + "; ".join(problems))


async def _node_seqnos(asker: _Asker, endpoint: HostPort, index: int) -> dict[int, int]:
    link = Link(asker, endpoint, index)
    try:
        await link.connect()
        return await link.high_seqnos()
    finally:
        await link.close()


async def ask_high_seqnos(settings: CaptureSettings) -> ClusterSeqnos:
    """The high seqnos of ``settings``' vbuckets (its range, else all), from their active
    nodes, all asked at once."""
    asker = _Asker(settings)
    cmap = await _cluster_map(asker)
    first, last = settings.vbuckets or (0, cmap.num_vbuckets - 1)
    wanted = range(first, min(last, cmap.num_vbuckets - 1) + 1)
    owners = cmap.vbuckets_by_owner(wanted, tls=asker.tls)
    endpoints = sorted(owners, key=lambda e: e.label)
    answers = await asyncio.gather(
        *(_node_seqnos(asker, e, i + 1) for i, e in enumerate(endpoints)),
        return_exceptions=True,
    )
    seqnos: dict[int, int] = {}
    nodes: list[str] = []
    problems: list[str] = []
    for endpoint, answer in zip(endpoints, answers, strict=True):
        if isinstance(answer, CaptureConnectionError) and not isinstance(
            answer, (AuthenticationError, TlsError)
        ):
            problems.append(f"{answer} ({len(owners[endpoint])} vbuckets unknown)")
            continue
        if isinstance(answer, BaseException):
            raise answer  # a refused login or certificate, or a bug: not one node's trouble
        nodes.append(endpoint.label)
        seqnos.update({vb: answer[vb] for vb in owners[endpoint] if vb in answer})
        moved = [vb for vb in owners[endpoint] if vb not in answer]
        if moved:  # a rebalance moved them since the map
            problems.append(f"{endpoint.label}: {len(moved)} vbuckets no longer active there")
    ownerless = len(wanted) - sum(len(v) for v in owners.values())
    if ownerless:
        problems.append(f"{ownerless} vbuckets have no active node in the cluster map")
    return ClusterSeqnos(
        seqnos=dict(sorted(seqnos.items())),
        vbuckets=len(wanted),
        nodes=tuple(nodes),
        problems=tuple(problems),
        asked_at=dt.datetime.now(dt.UTC),
    )


def high_seqnos(settings: CaptureSettings) -> ClusterSeqnos:
    """:func:`ask_high_seqnos` in a fresh event loop."""
    return asyncio.run(ask_high_seqnos(settings))
