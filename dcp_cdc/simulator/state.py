"""The state of one simulation: what to simulate, the bucket, its sessions, and the building
blocks (load, live changes, the expiry pager, failures) the scenarios script.

:mod:`dcp_cdc.simulator.scenarios` scripts it and :mod:`dcp_cdc.simulator.truth` reads it; both
import this module, which imports neither.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dcp_cdc.encoder import encode
from dcp_cdc.errors import ConfigError
from dcp_cdc.protocol import StreamEndReason
from dcp_cdc.simulator.model import NS, Bucket, Collection, Doc, Item, VBucket
from dcp_cdc.simulator.stream import Session, SessionOptions

SCENARIOS = (
    "basic",
    "ttl",
    "collection-lifecycle",
    "rollback",
    "oso-backfill",
    "history",
    "interrupted",
    "mixed",
)
"""The scenario names a :class:`SimConfig` accepts; ``scenarios.SCENARIO_FUNCS`` scripts each."""

COLLECTION_NAMES = ("airline", "route", "hotel-reviews", "orders%2026", "landmark", "airport")
MAX_COLLECTIONS = 64
"""User collections a simulation makes at most: :data:`COLLECTION_NAMES`, then
``events-07``, ``events-08``, ... (:func:`collection_name`)."""


def collection_name(i: int) -> str:
    """The name of the ``i``-th user collection (from 0) a simulation makes."""
    return COLLECTION_NAMES[i] if i < len(COLLECTION_NAMES) else f"events-{i + 1:02d}"


START = dt.datetime(2026, 1, 5, 9, 30, tzinfo=dt.UTC)
START_NS = int(START.timestamp()) * NS
"""A :class:`SimConfig`'s default start: a fixed instant, so that the same configuration
gives the same bytes (the tests' simulations); what serves or writes a bucket for a person
starts it now."""


class ChangeFeed(Protocol):
    """Who hears every change as the bucket makes it, besides the capture session: the test
    producer (:mod:`dcp_cdc.simulator.producer`) feeds its open streams from it."""

    def on_change(self, vb: VBucket, item: Item) -> None: ...


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. ``ops`` is the number of live changes after the initial load."""

    scenario: str = "basic"
    seed: int = 1
    bucket: str = "travel-sample"
    vbuckets: int = 64
    collections: int = 3
    docs: int = 1000
    ops: int = 5000
    max_snapshot: int = 8
    max_file_bytes: int = 16 * 1024 * 1024
    inject_malformed: int = 0
    binary_share: float = 0.03
    xattr_share: float = 0.2
    vbucket_offset: int = 0
    """Added to every vbucket on the wire and in the truth: simulations with disjoint offsets
    and key prefixes can share one bucket (many seeds in one pipeline run)."""
    key_prefix: str = ""
    versions: bool = True
    """Record every version of every document for ``truth/history.jsonl`` (off for
    simulations too large to keep them all in memory)."""
    start_ns: int = START_NS
    """The bucket's time when it is made, nanoseconds since the epoch: every CAS, expiry
    and delete time counts from it, so a seed gives the same data relative to the start."""

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ConfigError(f"scenario: unknown {self.scenario!r}; expected one of {SCENARIOS}")
        if not 1 <= self.vbuckets <= 1024:
            raise ConfigError(f"vbuckets: expected 1..1024, got {self.vbuckets}")
        if not 1 <= self.collections <= MAX_COLLECTIONS:
            raise ConfigError(f"collections: expected 1..{MAX_COLLECTIONS}, got {self.collections}")
        if self.docs < 1 or self.ops < 0 or self.max_snapshot < 1:
            raise ConfigError("docs must be >= 1, ops >= 0 and max_snapshot >= 1")
        if self.start_ns <= 0:
            raise ConfigError(f"start_ns: expected a time after the epoch, got {self.start_ns}")


class Simulation:
    """Drives a :class:`Bucket` and the sessions that stream it. ``clock``: the wall clock
    of a driver that serves the bucket as it is made (:class:`~dcp_cdc.simulator.model.Bucket`);
    None: simulated time from ``config.start_ns``."""

    def __init__(self, config: SimConfig, *, clock: Callable[[], int] | None = None) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.bucket = Bucket(
            name=config.bucket,
            vbuckets=config.vbuckets,
            rng=self.rng,
            start_ns=config.start_ns,
            clock=clock,
            record_versions=config.versions,
        )
        self.counts: Counter[str] = Counter()
        self.sessions: list[Session] = []
        self.session: Session | None = None
        self.feed: ChangeFeed | None = None
        self.keys: dict[int, list[bytes]] = {}
        self.key_seq: Counter[int] = Counter()
        self.thresholds: dict[int, int] = {}
        self.expected_errors: list[dict[str, object]] = []
        self.open_snapshots: list[dict[str, int]] = []
        self.streamed_collections: set[int] | None = None
        self.ttl_share = 0.0
        self.cut = False
        self.templates = body_templates(self.rng)
        self.faults_left = config.inject_malformed

    # --- building blocks -----------------------------------------------------------------

    def setup(self, *, history: bool = False, max_ttl: int | None = None) -> list[Collection]:
        """A scope with user collections, and the initial load (before any session)."""
        scope = self.bucket.create_scope("inventory")
        colls = [
            self.bucket.create_collection(
                scope.scope_id,
                collection_name(i),
                max_ttl=max_ttl if i == 1 else None,
                history=history and i == 0,
            )
            for i in range(self.config.collections)
        ]
        targets = [0, *(c.collection_id for c in colls)]
        for i in range(self.config.docs):
            self.create(targets[i % len(targets)])
            self.bucket.tick()
        return colls

    def open_session(self, directory: Path, **options: object) -> Session:
        n = len(self.sessions) + 1
        opts = SessionOptions(
            session_id=f"{self.config.bucket}-s{n:02d}-{self.config.seed}"
            + (f"-o{self.config.vbucket_offset}" if self.config.vbucket_offset else ""),
            max_file_bytes=self.config.max_file_bytes,
            vbucket_offset=self.config.vbucket_offset,
            **options,  # type: ignore[arg-type]
        )
        session = Session(self.bucket, directory, opts, self.rng, self.counts)
        self.sessions.append(session)
        self.session = session
        self.thresholds = {}
        return session

    def backfill_all(self, session: Session) -> None:
        order = list(self.bucket.vbuckets)
        self.rng.shuffle(order)
        for vb in order:
            if session.streams[vb.vbid].open:
                session.backfill(vb)

    def _notify(self, doc: Doc) -> None:
        if self.feed is not None:
            self.feed.on_change(self.bucket.vbuckets[doc.vbucket], Item(doc.seqno, doc=doc))
        if self.session is not None:
            vb = self.bucket.vbuckets[doc.vbucket]
            self.session.on_change(vb, Item(doc.seqno, doc=doc))
            self._maybe_flush(vb)

    def _notify_sys(self, before: list[int]) -> None:
        """Queue the system events a manifest change just added to every vbucket."""
        if self.feed is not None:
            for vb in self.bucket.vbuckets:
                for ev in vb.sys_events:
                    if ev.seqno > before[vb.vbid]:
                        self.feed.on_change(vb, Item(ev.seqno, sys=ev))
        if self.session is None:
            return
        for vb in self.bucket.vbuckets:
            for ev in vb.sys_events:
                if ev.seqno > before[vb.vbid]:
                    self.session.on_change(vb, Item(ev.seqno, sys=ev))
            self._maybe_flush(vb)

    def manifest(self, change: Callable[[], object]) -> object:
        before = [vb.high_seqno for vb in self.bucket.vbuckets]
        result = change()
        self._notify_sys(before)
        return result

    def _maybe_flush(self, vb: VBucket) -> None:
        assert self.session is not None
        limit = self.thresholds.setdefault(vb.vbid, self.rng.randint(1, self.config.max_snapshot))
        if self.session.pending(vb.vbid) >= limit:
            self.session.flush(vb)
            self.thresholds[vb.vbid] = self.rng.randint(1, self.config.max_snapshot)

    def new_key(self, cid: int) -> bytes:
        self.key_seq[cid] += 1
        n = self.key_seq[cid]
        prefix = self.bucket.collections[cid].name.split("%")[0].split("-")[0]
        mine = self.config.key_prefix
        if n % 97 == 0:
            return f"{mine}{prefix}::ключ-{n:07d}".encode()
        return f"{mine}{prefix}::{n:07d}".encode()

    def create(self, cid: int, key: bytes | None = None) -> Doc:
        key = key or self.new_key(cid)
        self.keys.setdefault(cid, []).append(key)
        return self.write_doc(cid, key)

    def json_body(self, key: bytes) -> bytes:
        rng = self.rng
        return (
            rng.choice(self.templates)
            .replace("@ID@", str(rng.getrandbits(20)))
            .replace("@PRICE@", str(rng.getrandbits(17) / 100))
            .replace("@UPDATED@", str(self.bucket.clock_ns // 1_000_000))
            .replace("@REF@", json.dumps(key.decode("utf-8", "replace"), ensure_ascii=False))
            .encode()
        )

    def write_doc(self, cid: int, key: bytes) -> Doc:
        rng = self.rng
        if rng.random() < self.config.binary_share:
            body, is_json = rng.randbytes(rng.randint(16, 300)), False
        else:
            body, is_json = self.json_body(key), True
        xattrs = None
        if rng.random() < self.config.xattr_share:
            xattrs = {
                "_sync": json.dumps({"rev": f"{rng.randint(1, 99)}-{rng.getrandbits(32):08x}"}),
                "audit": json.dumps({"by": rng.choice(["app", "etl", "admin"]), "v": 1}),
            }
        ttl = rng.randint(1, 900) if rng.random() < self.ttl_share else 0
        doc = self.bucket.upsert(
            cid,
            key,
            body,
            is_json=is_json,
            xattrs=xattrs,
            ttl=ttl,
            flags=rng.choice([0, 0x02000006, 0x01]),
        )
        self._notify(doc)
        return doc

    def random_op(self, cids: list[int], *, hot: int = 0) -> None:
        """One live change: mostly updates, some creates and deletes."""
        rng = self.rng
        cid = rng.choice(cids)
        keys = self.keys.get(cid) or []
        r = rng.random()
        # new keys until the key space is twice the initial load; after that, deleted keys
        # come back instead, so memory stays bounded however many changes are simulated
        if not keys or (r < 0.2 and len(keys) < 2 * self.config.docs // len(cids) + 1):
            self.create(cid)
        elif r < 0.85:
            pool = keys[:hot] if hot else keys
            self.write_doc(cid, rng.choice(pool))
        else:
            doc = self.bucket.remove(cid, rng.choice(keys))
            if doc is not None:
                self._notify(doc)
        self.bucket.tick()

    def live(
        self, n_ops: int, *, cids: list[int] | None = None, pager_every: int = 0, hot: int = 0
    ) -> None:
        cids = cids or [c.collection_id for c in self.bucket.live_collections()]
        faults: set[int] = set()
        if self.faults_left and self.session is not None:  # spread over the first live phase
            faults = {n_ops * (k + 1) // (self.faults_left + 1) for k in range(self.faults_left)}
            self.faults_left = 0
        for i in range(n_ops):
            self.random_op(cids, hot=hot)
            if pager_every and i % pager_every == pager_every - 1:
                self.pager()
            if i in faults and self.session is not None:
                self.inject_malformed(self.session)

    def pager(self, limit: int = 200) -> None:
        """The expiry pager: documents past their TTL become expirations (docs/protocol/dcp.md §6.6)."""
        for doc in self.bucket.due_for_expiry(limit):
            gone = self.bucket.remove(doc.collection_id, doc.key, change="expire")
            if gone is not None:
                self._notify(gone)

    def finish(self, session: Session, *, close_streams: bool = True) -> None:
        for vb in self.bucket.vbuckets:
            session.flush(vb)
        if close_streams:
            for vbid, state in session.streams.items():
                if state.open:
                    session.end_stream(vbid, StreamEndReason.CLOSED)
        session.close()
        self.session = None

    def inject_malformed(self, session: Session) -> None:
        """Write a corrupted copy of a mutation: extras length 30 instead of 31 (quarantined).

        The copy changes nothing in the bucket, so the truth stands; its place is recorded.
        """
        vb = self.bucket.vbuckets[0]
        docs = [d for d in vb.docs.values() if not d.deleted]
        if not docs:
            return
        event = session.doc_event(vb.vbid, self.rng.choice(docs), disk=False)
        frame = bytearray(encode(event))
        frame[4] = 30
        path, offset = session.writer.write(bytes(frame))
        session.counts["malformed"] += 1
        self.expected_errors.append(
            {"file": path.name, "offset": offset, "reason": "extras length does not fit the opcode"}
        )

    def cut_session(self, session: Session) -> None:
        """The connection dies inside a snapshot; the rest of the queued changes never leave."""
        vb = max(self.bucket.vbuckets, key=lambda v: len(v.docs))
        doc_keys = [k for k in list(vb.docs)[:50] if not vb.docs[k].deleted]
        while session.pending(vb.vbid) < 3 and doc_keys:
            cid, key = doc_keys.pop()
            self.bucket.tick()
            doc = self.bucket.upsert(cid, key, self.json_body(key), is_json=True)
            session.on_change(vb, Item(doc.seqno, doc=doc))
        start, end, path, offset = session.cut(
            vb, whole_items=1, tail_bytes=self.rng.randint(1, 40)
        )
        self.counts["truncated"] += 1
        self.expected_errors.append(
            {
                "file": path.name,
                "offset": offset,
                "reason": "truncated tail: the stream ends inside a frame",
            }
        )
        state = session.streams[vb.vbid]
        self.open_snapshots.append(
            {"vbucket": vb.vbid, "start": start, "end": end, "last_seqno": state.sent_upto}
        )
        session.close()
        self.session = None
        self.cut = True


_NAMES = ("Blue Sky", "Été Air ✈", "Øresund Hotel", "東京 Express", "Café Δ", "O'Hare Inn")
_CITIES = ("Paris", "Lyon", "Zürich", "Tokyo", "São Paulo", "Kraków")


def body_templates(rng: random.Random, count: int = 64) -> list[str]:
    """Realistic JSON document shapes (nested objects, arrays, numbers, unicode) with
    ``@ID@``, ``@PRICE@``, ``@UPDATED@`` and ``@REF@`` left for each body to fill in."""
    shapes = []
    for _ in range(count):
        doc: dict[str, object] = {
            "type": rng.choice(["airline", "route", "hotel", "order"]),
            "id": "@ID@",
            "name": rng.choice(_NAMES),
            "price": "@PRICE@",
            "active": rng.random() < 0.8,
            "tags": rng.sample(["wifi", "pool", "spa", "bar", "gym", "pets"], rng.randint(0, 4)),
            "address": {
                "city": rng.choice(_CITIES),
                "geo": {
                    "lat": round(rng.uniform(-90, 90), 5),
                    "lon": round(rng.uniform(-180, 180), 5),
                },
            },
            "updated": "@UPDATED@",
            "ref": "@REF@",
        }
        if rng.random() < 0.3:
            doc["reviews"] = [
                {"stars": rng.randint(1, 5), "text": "ok " * rng.randint(1, 12)}
                for _ in range(rng.randint(1, 3))
            ]
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        for name in ("ID", "PRICE", "UPDATED", "REF"):
            text = text.replace(f'"@{name}@"', f"@{name}@")
        shapes.append(text)
    return shapes
