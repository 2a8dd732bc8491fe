"""The bucket model: vbuckets, documents, the collections manifest and a clock (docs/protocol/dcp.md §6–§7).

Every change the simulated bucket makes goes through :class:`Bucket`, which gives it a seqno in
its vbucket, keeps the current state of every document (tombstones included) and records an
undo entry, so that the state at any consistent point can be rebuilt: at the end of the last
complete snapshot of an interrupted session, or at the seqno a failover rolls a vbucket back to.
The ground truth is read from this model, never from decoded frames.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from dcp_cdc.protocol import HLC_COUNTER_MASK

Change = Literal["upsert", "delete", "expire"]
SysKind = Literal[
    "create_collection",
    "drop_collection",
    "create_scope",
    "drop_scope",
    "modify_collection",
    "flush_collection",
]

NS = 1_000_000_000


def vbucket_of(key: bytes, vbuckets: int) -> int:
    """Couchbase's key → vbucket mapping: bits 16–30 of the CRC32 of the key (docs/protocol/dcp.md §7.1)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets


def hlc_cas(now_ns: int, last_cas: int) -> int:
    """A CAS from the hybrid logical clock: 48-bit masked ns, low bits a counter (docs/protocol/dcp.md §1.5)."""
    masked = now_ns & ~HLC_COUNTER_MASK
    return masked if masked > last_cas else last_cas + 1


@dataclass(slots=True)
class Doc:
    """The current state of one document (or its tombstone) in the model."""

    collection_id: int
    key: bytes
    vbucket: int
    seqno: int
    rev_seqno: int
    cas: int
    flags: int
    expiry: int
    body: bytes
    is_json: bool
    xattrs: dict[str, str] | None
    deleted: bool = False
    change: Change = "upsert"
    delete_time: int = 0


@dataclass(slots=True)
class Collection:
    collection_id: int
    scope_id: int
    name: str
    max_ttl: int | None = None
    history: bool = False
    created_uid: int = 0
    dropped_uid: int | None = None
    flush_uid: int = 0


@dataclass(slots=True)
class Scope:
    scope_id: int
    name: str
    created_uid: int = 0
    dropped_uid: int | None = None


@dataclass(slots=True)
class SysEvent:
    """A system event as it sits in one vbucket's history."""

    kind: SysKind
    seqno: int
    manifest_uid: int
    scope_id: int
    collection_id: int | None
    name: str | None
    max_ttl: int | None
    history: bool
    flush_uid: int


@dataclass(slots=True)
class Item:
    """One change in a vbucket's history, as a DCP stream would carry it."""

    seqno: int
    doc: Doc | None = None  # a document change (a copy of the doc as of this change)
    sys: SysEvent | None = None


@dataclass(slots=True)
class Undo:
    seqno: int
    ident: tuple[int, bytes] | None  # the document key changed, or None for a system event
    before: Doc | None


@dataclass
class VBucket:
    vbid: int
    uuid: int
    high_seqno: int = 0
    purge_seqno: int = 0
    manifest_uid: int = 0
    failover_log: list[tuple[int, int]] = field(default_factory=list)  # newest first
    docs: dict[tuple[int, bytes], Doc] = field(default_factory=dict)
    sys_events: list[SysEvent] = field(default_factory=list)
    undo: list[Undo] = field(default_factory=list)
    keep_undo_from: int | None = None  # a rollback mark: undo entries above it are kept
    versions: list[Doc] | None = None
    """Every version of every document, in seqno order (the truth of history tables); None
    when the bucket does not record them."""
    delivered: set[int] = field(default_factory=set)
    """Seqnos of document versions a consumer received in a complete snapshot and kept (a
    rollback it was told of forgets those above the point)."""


class Bucket:
    """A Couchbase bucket in memory. Not thread-safe; deterministic for a given call order.

    Its time starts at ``start_ns`` (nanoseconds since the epoch). Without ``clock`` it is
    simulated time, which :meth:`tick` and :meth:`advance` move: the same calls give the same
    bucket relative to the start. With ``clock`` (the wall clock of the driver that serves
    the bucket, e.g. ``time.time_ns``) the bucket keeps that clock's time, as a node does:
    each change is made at the time it is read, a TTL counts from it, and the pager expires
    what is due by it; :meth:`tick` then draws its random step (the same data follow from a
    seed) but leaves the time alone.
    """

    def __init__(
        self,
        *,
        name: str,
        vbuckets: int,
        rng: random.Random,
        start_ns: int,
        clock: Callable[[], int] | None = None,
        record_versions: bool = True,
    ) -> None:
        self.name = name
        self.rng = rng
        self.clock = clock
        self._clock_ns = start_ns
        self.last_cas = 0
        self.vbuckets = [
            VBucket(
                vbid,
                uuid := self._new_uuid(),
                failover_log=[(uuid, 0)],
                versions=[] if record_versions else None,
            )
            for vbid in range(vbuckets)
        ]
        self.manifest_uid = 0
        self.scopes: dict[int, Scope] = {0: Scope(0, "_default")}
        self.collections: dict[int, Collection] = {0: Collection(0, 0, "_default")}
        self.next_scope_id = 8  # ids 1–7 are reserved (docs/protocol/dcp.md §3)
        self.next_collection_id = 8
        # Documents with a TTL, soonest first: (expiry, vbucket, seqno, collection id, key).
        # An entry is stale once its document changed (another seqno) or went.
        self._expiring: list[tuple[int, int, int, int, bytes]] = []

    # --- time ---------------------------------------------------------------------------

    @property
    def clock_ns(self) -> int:
        """The bucket's time in nanoseconds since the epoch; with a wall clock, never behind
        it (nor ever back: a change made after another is never dated before it)."""
        if self.clock is not None:
            self._clock_ns = max(self._clock_ns, self.clock())
        return self._clock_ns

    @property
    def now(self) -> int:
        """The bucket's Unix time in seconds."""
        return self.clock_ns // NS

    def tick(self, max_ms: int = 5) -> None:
        """Up to ``max_ms`` of simulated time pass between two changes (drawn with a wall
        clock too, which keeps its own time)."""
        step = self.rng.randint(1, max_ms * 1_000_000)
        if self.clock is None:
            self._clock_ns += step

    def advance(self, seconds: int) -> None:
        """``seconds`` of simulated time pass at once (TTLs fall due); a bucket on a wall
        clock runs that far ahead of it."""
        self._clock_ns += seconds * NS

    def _new_uuid(self) -> int:
        return self.rng.getrandbits(64) or 1

    def _cas(self) -> int:
        self.last_cas = hlc_cas(self.clock_ns, self.last_cas)
        return self.last_cas

    # --- documents ----------------------------------------------------------------------

    def vb_for(self, key: bytes) -> VBucket:
        return self.vbuckets[vbucket_of(key, len(self.vbuckets))]

    def get(self, collection_id: int, key: bytes) -> Doc | None:
        return self.vb_for(key).docs.get((collection_id, key))

    def _record(
        self, vb: VBucket, seqno: int, ident: tuple[int, bytes] | None, before: Doc | None
    ) -> None:
        vb.undo.append(Undo(seqno, ident, before))  # docs are replaced, never mutated: no copy

    def _version(self, vb: VBucket, doc: Doc) -> None:
        if vb.versions is not None:
            vb.versions.append(doc)

    def upsert(
        self,
        collection_id: int,
        key: bytes,
        body: bytes,
        *,
        is_json: bool,
        xattrs: dict[str, str] | None = None,
        ttl: int = 0,
        flags: int = 0,
    ) -> Doc:
        """Create or replace a document (rev seqno +1 per change, docs/protocol/dcp.md §6.4)."""
        coll = self.collections[collection_id]
        vb = self.vb_for(key)
        before = vb.docs.get((collection_id, key))
        vb.high_seqno += 1
        if ttl == 0 and coll.max_ttl:
            ttl = coll.max_ttl
        expiry = self.now + ttl if ttl else 0
        doc = Doc(
            collection_id,
            key,
            vb.vbid,
            vb.high_seqno,
            (before.rev_seqno + 1) if before else 1,
            self._cas(),
            flags,
            expiry,
            body,
            is_json,
            xattrs,
        )
        self._record(vb, doc.seqno, (collection_id, key), before)
        self._version(vb, doc)
        vb.docs[(collection_id, key)] = doc
        self._track_expiry(doc)
        return doc

    def _track_expiry(self, doc: Doc) -> None:
        if doc.expiry and not doc.deleted:
            heapq.heappush(
                self._expiring, (doc.expiry, doc.vbucket, doc.seqno, doc.collection_id, doc.key)
            )

    def remove(self, collection_id: int, key: bytes, *, change: Change = "delete") -> Doc | None:
        """Delete (or, with ``change="expire"``, expire) a live document; a tombstone stays."""
        vb = self.vb_for(key)
        before = vb.docs.get((collection_id, key))
        if before is None or before.deleted:
            return None
        vb.high_seqno += 1
        system_xattrs = {k: v for k, v in (before.xattrs or {}).items() if k.startswith("_")}
        doc = Doc(
            collection_id,
            key,
            vb.vbid,
            vb.high_seqno,
            before.rev_seqno + 1,
            self._cas(),
            0,
            0,
            b"",
            False,
            system_xattrs or None,
            deleted=True,
            change=change,
            delete_time=self.now,
        )
        self._record(vb, doc.seqno, (collection_id, key), before)
        self._version(vb, doc)
        vb.docs[(collection_id, key)] = doc
        return doc

    def due_for_expiry(self, limit: int) -> list[Doc]:
        """Live documents whose expiry has passed, oldest seqno first (what the pager finds).

        Found from the expiry heap, not by a scan of every document: the pager runs every
        few operations, and a scan made a 1M-operation simulation quadratic.
        """
        due: dict[tuple[int, bytes], Doc] = {}
        while self._expiring and self._expiring[0][0] <= self.now:
            expiry, vbid, seqno, cid, key = heapq.heappop(self._expiring)
            d = self.vbuckets[vbid].docs.get((cid, key))
            if d is not None and d.seqno == seqno and not d.deleted and d.expiry == expiry:
                due[(cid, key)] = d
        for d in due.values():  # still due until the caller removes them
            self._track_expiry(d)
        return sorted(due.values(), key=lambda d: (d.vbucket, d.seqno))[:limit]

    def purge_tombstones(self, older_than_seqno_share: float = 0.5) -> int:
        """Purge the older tombstones of each vbucket; raises its purge seqno (docs/protocol/dcp.md §7.3)."""
        purged = 0
        for vb in self.vbuckets:
            limit = int(vb.high_seqno * older_than_seqno_share)
            dead = [k for k, d in vb.docs.items() if d.deleted and d.seqno <= limit]
            for k in dead:
                vb.purge_seqno = max(vb.purge_seqno, vb.docs[k].seqno)
                del vb.docs[k]
            purged += len(dead)
        return purged

    # --- collections manifest (docs/protocol/dcp.md §6.7) -------------------------------------------------

    def _sys_all(self, kinds: list[tuple[SysKind, Collection | Scope]]) -> None:
        """One manifest change: its events in every vbucket; only the last carries the new uid."""
        previous = self.manifest_uid
        self.manifest_uid += 1
        for vb in self.vbuckets:
            for i, (kind, obj) in enumerate(kinds):
                vb.high_seqno += 1
                uid = self.manifest_uid if i == len(kinds) - 1 else previous
                if isinstance(obj, Collection):
                    ev = SysEvent(
                        kind,
                        vb.high_seqno,
                        uid,
                        obj.scope_id,
                        obj.collection_id,
                        obj.name,
                        obj.max_ttl,
                        obj.history,
                        obj.flush_uid,
                    )
                else:
                    ev = SysEvent(
                        kind, vb.high_seqno, uid, obj.scope_id, None, obj.name, None, False, 0
                    )
                vb.sys_events.append(ev)
                self._record(vb, ev.seqno, None, None)
            vb.manifest_uid = self.manifest_uid

    def create_scope(self, name: str) -> Scope:
        scope = Scope(self.next_scope_id, name, created_uid=self.manifest_uid + 1)
        self.next_scope_id += 1
        self.scopes[scope.scope_id] = scope
        self._sys_all([("create_scope", scope)])
        return scope

    def create_collection(
        self, scope_id: int, name: str, *, max_ttl: int | None = None, history: bool = False
    ) -> Collection:
        coll = Collection(
            self.next_collection_id, scope_id, name, max_ttl, history, self.manifest_uid + 1
        )
        self.next_collection_id += 1
        self.collections[coll.collection_id] = coll
        self._sys_all([("create_collection", coll)])
        return coll

    def _forget_documents(self, collection_ids: set[int]) -> None:
        for vb in self.vbuckets:
            for k in [k for k in vb.docs if k[0] in collection_ids]:
                self._record(vb, vb.high_seqno, k, vb.docs[k])
                del vb.docs[k]

    def drop_collection(self, collection_id: int) -> Collection:
        """Drop: one EndCollection per vbucket, no per-document messages (docs/protocol/dcp.md §6.7)."""
        coll = self.collections[collection_id]
        coll.dropped_uid = self.manifest_uid + 1
        self._sys_all([("drop_collection", coll)])
        self._forget_documents({collection_id})
        return coll

    def drop_scope(self, scope_id: int) -> Scope:
        """Each of its collections gets an EndCollection, then the DropScope (docs/protocol/dcp.md §6.7)."""
        scope = self.scopes[scope_id]
        colls = [
            c for c in self.collections.values() if c.scope_id == scope_id and c.dropped_uid is None
        ]
        scope.dropped_uid = self.manifest_uid + 1
        for c in colls:
            c.dropped_uid = scope.dropped_uid
        self._sys_all([*(("drop_collection", c) for c in colls), ("drop_scope", scope)])
        self._forget_documents({c.collection_id for c in colls})
        return scope

    def flush_collection(self, collection_id: int) -> Collection:
        """8.0 flush: the BeginCollection again at a new seqno, all older items gone (§6.7)."""
        coll = self.collections[collection_id]
        coll.flush_uid = self.manifest_uid + 1
        self._sys_all([("flush_collection", coll)])
        self._forget_documents({collection_id})
        return coll

    def modify_collection(
        self, collection_id: int, *, max_ttl: int | None = None, history: bool | None = None
    ) -> Collection:
        coll = self.collections[collection_id]
        if max_ttl is not None:
            coll.max_ttl = max_ttl
        if history is not None:
            coll.history = history
        self._sys_all([("modify_collection", coll)])
        return coll

    def live_collections(self) -> list[Collection]:
        return [c for c in self.collections.values() if c.dropped_uid is None]

    # --- history: undo, rollback ----------------------------------------------------------

    def trim_undo(self, vb: VBucket, upto_seqno: int) -> None:
        """Forget undo entries at or below ``upto_seqno`` (no consistent point needs them)."""
        keep_from = upto_seqno if vb.keep_undo_from is None else min(upto_seqno, vb.keep_undo_from)
        if vb.undo and vb.undo[0].seqno <= keep_from:
            vb.undo = [u for u in vb.undo if u.seqno > keep_from]

    def rewind(self, vb: VBucket, to_seqno: int) -> int:
        """Undo every change above ``to_seqno``: the documents as they were at that seqno.

        Returns how many changes were undone. System events above the point are forgotten too.
        """
        undone = 0
        while vb.undo and vb.undo[-1].seqno > to_seqno:
            u = vb.undo.pop()
            undone += 1
            if u.ident is None:
                continue
            if u.before is None:
                vb.docs.pop(u.ident, None)
            else:
                vb.docs[u.ident] = u.before
                self._track_expiry(u.before)
        vb.sys_events = [e for e in vb.sys_events if e.seqno <= to_seqno]
        if vb.versions is not None:
            while vb.versions and vb.versions[-1].seqno > to_seqno:
                vb.versions.pop()
        self.forget_delivered(vb, to_seqno)
        return undone

    @staticmethod
    def forget_delivered(vb: VBucket, above: int) -> None:
        """A consumer rolled back to ``above`` (or the changes above it are gone)."""
        vb.delivered = {s for s in vb.delivered if s <= above}

    def failover(self, vb: VBucket, to_seqno: int) -> int:
        """A replica promoted at ``to_seqno``: later changes lost, a new uuid branch (§7.4)."""
        self.rewind(vb, to_seqno)
        vb.high_seqno = to_seqno
        vb.uuid = self._new_uuid()
        vb.failover_log.insert(0, (vb.uuid, to_seqno))
        vb.keep_undo_from = None
        return vb.uuid
