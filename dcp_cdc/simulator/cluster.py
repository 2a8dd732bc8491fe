"""The test producer's cluster (:class:`ProducerCluster`): what every node of the test DCP
server shares: the simulated bucket, the vbucket map (its revision grows on every change), the
users, and the faults a test asks for (failovers to a new branch, rebalances, dropped cursors,
dropped collections, cut connections, slow replies, stalled vbuckets).

It reaches the connections only through :class:`ClusterClient` (end a stream, push a new map,
queue a change), so that it does not import the connection
(:class:`~dcp_cdc.simulator.producer.ProducerConnection`), which reads the cluster.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from typing import Protocol

from dcp_cdc.errors import ConfigError
from dcp_cdc.protocol import StreamEndReason
from dcp_cdc.scram import MECHANISMS, StoredCredential
from dcp_cdc.simulator.bulk import BulkDocs, NumberedDocs
from dcp_cdc.simulator.frames import ValueCache
from dcp_cdc.simulator.model import Item, VBucket
from dcp_cdc.simulator.producer_stream import ProducerStream
from dcp_cdc.simulator.realistic import RealisticDocs
from dcp_cdc.simulator.state import Simulation

BULK_SHAPES = ("small", "realistic")
"""The shapes of bulk documents (:meth:`ProducerCluster.add_bulk`)."""


class ClusterClient(Protocol):
    """What the cluster needs of a connection to one of its nodes."""

    node: int
    streams: dict[int, ProducerStream]
    cut_armed: bool

    def end_stream(self, vbid: int, reason: int, *, flush: bool = True) -> None: ...

    def notify_config(self) -> None: ...


class ProducerCluster:
    """The nodes' shared state: the bucket, the vbucket map, users, and the faults."""

    def __init__(
        self,
        sim: Simulation,
        *,
        nodes: int,
        users: Mapping[str, str],
        refuse_optional_controls: bool = False,
        seed: int = 0,
    ) -> None:
        self.sim = sim
        self.bucket = sim.bucket
        self.nodes = nodes
        self.ports = [0] * nodes
        self.tls_ports: list[int | None] = [None] * nodes
        nvb = len(self.bucket.vbuckets)
        self.vbmap = [vb * nodes // nvb for vb in range(nvb)]
        self.rev = 1
        self.refuse_optional_controls = refuse_optional_controls
        self.rng = random.Random(seed ^ 0x5EED)
        self._passwords = dict(users)
        self._credentials: dict[str, dict[str, StoredCredential]] = {
            user: {
                mech: StoredCredential.make(mech, password, self.rng.randbytes(16), 4096)
                for mech in MECHANISMS
            }
            for user, password in users.items()
        }
        self.connections: list[ClusterClient] = []
        self.uuid = f"{self.rng.getrandbits(128):032x}"
        self._config_cache: dict[tuple[int, int], bytes] = {}
        self.values = ValueCache()
        self.bulk: NumberedDocs | None = None
        """Bulk documents served besides the simulated ones (:meth:`add_bulk`)."""
        """Document values (xattrs joined, Snappy applied) shared by every connection."""
        self.sessions: list[dict[str, object]] = []
        self.peak_unacked = 0
        """The most unacknowledged bytes any flow-controlled connection had out (§7.6)."""
        self.cut_requests: dict[int, int] = {}
        """node → the stream requests its connections may still receive before the next one
        that receives one is reset (:meth:`cut_after_requests`)."""
        self.seqnos_delay_s = 0.0
        """GET_ALL_VB_SEQNOS replies wait this long (:meth:`slow_seqnos`)."""
        self.stalled: set[int] = set()
        """vbuckets whose streams send nothing for now (:meth:`stall`)."""
        sim.feed = self

    # --- users -----------------------------------------------------------------------------

    def add_bulk(self, count: int, body_bytes: int, shape: str = "small") -> NumberedDocs:
        """Add ``count`` bulk documents to the bucket (benchmarks): ``small`` ones of
        ``body_bytes`` (:class:`~dcp_cdc.simulator.bulk.BulkDocs`) or ``realistic`` ones
        (:class:`~dcp_cdc.simulator.realistic.RealisticDocs`, ``body_bytes`` unused)."""
        if self.bulk is not None:
            raise ValueError("bulk documents are added once")
        if shape not in BULK_SHAPES:
            raise ConfigError(f"bulk shape: expected one of {BULK_SHAPES}, got {shape!r}")
        if shape == "realistic":
            self.bulk = RealisticDocs(self.bucket, count)
        else:
            self.bulk = BulkDocs(self.bucket, count, body_bytes)
        return self.bulk

    def credential(self, mechanism: str) -> Callable[[str], StoredCredential | None]:
        return lambda user: self._credentials.get(user, {}).get(mechanism)

    def has_user(self, user: str) -> bool:
        """True when ``user`` is one of the cluster's users (a client certificate's user must be)."""
        return user in self._passwords

    def plain_ok(self, user: str, password: str) -> bool:
        return user in self._passwords and self._passwords[user] == password

    # --- the cluster map -------------------------------------------------------------------

    def owner(self, vbid: int) -> int:
        return self.vbmap[vbid]

    def config(self, node: int) -> bytes:
        """The bucket config as GET_CLUSTER_CONFIG returns it (``$HOST`` for the host).

        gocbcore needs a ``mgmt`` port in every ``nodesExt`` entry and a ``nodes`` array as
        long as ``nodesExt`` (gocbcore's cluster-map reader); nothing listens on ``mgmt``.
        """
        cached = self._config_cache.get((self.rev, node))
        if cached is not None:
            return cached
        nodes_ext = []
        for i, port in enumerate(self.ports):
            services = {"mgmt": 18091 + i, "kv": port}
            if self.tls_ports[i] is not None:
                services["kvSSL"] = self.tls_ports[i]  # type: ignore[assignment]
            entry: dict[str, object] = {"services": services, "hostname": "$HOST"}
            if i == node:
                entry["thisNode"] = True
            nodes_ext.append(entry)
        cfg = {
            "rev": self.rev,
            "revEpoch": 1,
            "name": self.bucket.name,
            "uuid": self.uuid,
            "nodeLocator": "vbucket",
            "bucketCapabilitiesVer": "",
            "bucketCapabilities": ["collections", "dcp", "cbhello", "xattr", "snappy", "json"],
            "nodes": [
                {"hostname": f"$HOST:{18091 + i}", "ports": {"direct": port}}
                for i, port in enumerate(self.ports)
            ],
            "nodesExt": nodes_ext,
            "vBucketServerMap": {
                "hashAlgorithm": "CRC",
                "numReplicas": 0,
                "serverList": [f"$HOST:{port}" for port in self.ports],
                "vBucketMap": [[owner] for owner in self.vbmap],
            },
        }
        data = json.dumps(cfg).encode()
        self._config_cache[(self.rev, node)] = data
        return data

    def manifest(self) -> bytes:
        """GET_COLLECTIONS_MANIFEST's reply: live scopes and collections, ids in hex."""
        b = self.bucket
        scopes = []
        for scope in b.scopes.values():
            if scope.dropped_uid is not None:
                continue
            colls = []
            for c in b.live_collections():
                if c.scope_id != scope.scope_id:
                    continue
                entry: dict[str, object] = {"name": c.name, "uid": format(c.collection_id, "x")}
                if c.max_ttl:
                    entry["maxTTL"] = c.max_ttl
                colls.append(entry)
            scopes.append(
                {"name": scope.name, "uid": format(scope.scope_id, "x"), "collections": colls}
            )
        return json.dumps({"uid": format(b.manifest_uid, "x"), "scopes": scopes}).encode()

    # --- live changes ----------------------------------------------------------------------

    def on_change(self, vb: VBucket, item: Item) -> None:
        for conn in self.connections:
            stream = conn.streams.get(vb.vbid)
            if stream is not None and not stream.ended:
                stream.pending.append(item)

    def attach(self, conn: ClusterClient) -> None:
        self.connections.append(conn)

    def detach(self, conn: ClusterClient) -> None:
        if conn in self.connections:
            self.connections.remove(conn)

    # --- faults ----------------------------------------------------------------------------

    def _end_streams(self, vbid: int, reason: int, *, node: int | None = None) -> int:
        ended = 0
        for conn in self.connections:
            if (node is None or conn.node == node) and vbid in conn.streams:
                conn.end_stream(vbid, reason, flush=reason != StreamEndReason.TOO_SLOW)
                ended += 1
        return ended

    def failover(self, vbid: int, *, lost: int = 12, back: int = 0, grow: int = 0) -> int:
        """A replica takes over ``vbid`` after ``lost`` more changes were streamed: the
        replica had the vbucket up to ``back`` seqnos below the high seqno before them, so
        those ``back`` changes (which consumers may hold from earlier sessions) are gone too.
        A new uuid branch starts there, open streams end (state_changed), and a consumer that
        holds lost changes is told to roll back. Then ``grow`` changes are made on the new
        branch: with ``grow < lost + back`` its high seqno stays below what such a consumer
        holds. Returns the seqno the vbucket was rewound to."""
        vb = self.bucket.vbuckets[vbid]
        point = vb.high_seqno - back
        if back and (not vb.undo or vb.undo[0].seqno > point + 1):
            kept = vb.undo[0].seqno if vb.undo else vb.high_seqno + 1
            raise ValueError(
                f"failover: vbucket {vbid} cannot lose {back} seqnos: its undo log starts at "
                f"seqno {kept} (high seqno {vb.high_seqno})"
            )
        vb.keep_undo_from = point
        live = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])]
        for cid, key in live[:lost]:  # changes the consumers see but the new active never had
            self.sim.write_doc(cid, key)
            self.bucket.tick()
        self._end_streams(vbid, StreamEndReason.STATE_CHANGED)
        self.bucket.failover(vb, point)
        live = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])]
        for cid, key in live[:grow]:
            self.sim.write_doc(cid, key)
            self.bucket.tick()
        return point

    def _live(self, cid: int) -> bool:
        return self.bucket.collections[cid].dropped_uid is None

    def rebalance(self, vbid: int, to_node: int) -> None:
        """Move ``vbid`` to ``to_node``: map revision +1, streams on the old node end
        (state_changed), the old node answers NOT_MY_VBUCKET, subscribed clients are told."""
        if not 0 <= to_node < self.nodes:
            raise ValueError(f"rebalance: node {to_node} is not one of 0..{self.nodes - 1}")
        old = self.vbmap[vbid]
        if old == to_node:
            return
        self.vbmap[vbid] = to_node
        self.rev += 1
        self._end_streams(vbid, StreamEndReason.STATE_CHANGED, node=old)
        for conn in self.connections:
            conn.notify_config()

    def too_slow(self, vbid: int) -> int:
        """Streams of ``vbid`` end with reason too_slow (a dropped cursor); returns how many."""
        return self._end_streams(vbid, StreamEndReason.TOO_SLOW)

    def drop_collection(self, collection_id: int) -> None:
        """Drop a collection while streaming: an EndCollection in every vbucket; streams
        filtered on it alone then end with filter_empty."""
        self.sim.manifest(lambda: self.bucket.drop_collection(collection_id))

    def cut_after_requests(self, node: int, requests: int) -> None:
        """The connection to ``node`` that receives the ``requests``-th stream request from
        now on is reset (TCP RST) right then, without a reply: a cut while stream requests
        are in flight (a node crash, a proxy dropping the connection)."""
        if requests < 1:
            raise ValueError(f"cut_after_requests: requests must be positive, got {requests}")
        self.cut_requests[node] = requests

    def slow_seqnos(self, seconds: float) -> None:
        """GET_ALL_VB_SEQNOS replies wait ``seconds`` (a loaded node): a consumer's stream
        openers wait on them while its other streams go on and end."""
        self.seqnos_delay_s = max(0.0, seconds)

    def stall(self, vbid: int, changes: int = 0) -> int:
        """``vbid``'s streams stop sending while the vbucket goes on taking changes: a stuck
        stream on a node that is otherwise well (its other vbuckets flow, it answers NOOPs,
        and GET_ALL_VB_SEQNOS reports the growing high seqno). ``changes`` updates are made
        in the vbucket now. A stream's end (a close, a failover) still goes out. Returns
        the vbucket's high seqno."""
        if not 0 <= vbid < len(self.vbmap):
            raise ValueError(f"stall: vbucket {vbid} is not one of 0..{len(self.vbmap) - 1}")
        self.stalled.add(vbid)
        return self.update_docs(vbid, changes)

    def unstall(self, vbid: int) -> None:
        """``vbid``'s streams send again, what it took meanwhile first."""
        self.stalled.discard(vbid)

    def update_docs(self, vbid: int, changes: int) -> int:
        """``changes`` updates of the live documents of ``vbid`` (in turn); returns its high
        seqno."""
        vb = self.bucket.vbuckets[vbid]
        keys = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])]
        if changes and not keys:
            raise ValueError(f"vbucket {vbid} has no live document to update")
        for i in range(changes):
            cid, key = keys[i % len(keys)]
            self.sim.write_doc(cid, key)
            self.bucket.tick()
        return vb.high_seqno

    def cut_node(self, node: int) -> int:
        """Every connection to ``node`` dies inside its next snapshot (after the marker and
        one item). Changes are made on a vbucket of the node so that a snapshot comes.
        Returns how many connections were armed."""
        armed = 0
        for conn in self.connections:
            if conn.node == node:
                conn.cut_armed = True
                armed += 1
        streamed = {v for c in self.connections if c.node == node for v in c.streams}
        for vbid in sorted(streamed):
            vb = self.bucket.vbuckets[vbid]
            keys = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])][:3]
            if len(keys) == 3:
                for cid, key in keys:
                    self.sim.write_doc(cid, key)
                    self.bucket.tick()
                break
        return armed
