"""The ground truth a correct pipeline must end with, read from the bucket model.

``truth/summary.json``: collections (live and dropped), per vbucket the last consistent
snapshot end, uuid and failover log, the drops and flushes of collections, expected frame
counts per op, expected errors and open snapshots. ``truth/documents.jsonl``: every live
document, one JSON object a line. ``truth/history.jsonl`` (unless the simulation did not record
versions): every version of every document on the surviving branch of each vbucket, in seqno
order per key, with ``change`` (upsert, delete, expire) and ``streamed``: whether a consumer
received it in a complete snapshot and kept it (memory snapshots deduplicate a key's versions
unless the collection keeps history, a disk backfill sends only the newest, a rollback retracts
what was above its point).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dcp_cdc.render import bytes_field
from dcp_cdc.simulator.model import Doc
from dcp_cdc.simulator.state import Simulation


def document_record(sim: Simulation, doc: Doc) -> dict[str, Any]:
    coll = sim.bucket.collections[doc.collection_id]
    scope = sim.bucket.scopes[coll.scope_id]
    rec: dict[str, Any] = {
        "scope": scope.name,
        "scope_id": scope.scope_id,
        "collection": coll.name,
        "collection_id": coll.collection_id,
    }
    bytes_field(rec, "key", doc.key)
    rec.update(
        vbucket=doc.vbucket + sim.config.vbucket_offset,
        seqno=doc.seqno,
        rev_seqno=doc.rev_seqno,
        cas=doc.cas,
        flags=doc.flags,
        expiry=doc.expiry,
        expired=0 < doc.expiry <= sim.bucket.now,
        is_json=doc.is_json,
    )
    bytes_field(rec, "value", doc.body, text_ok=doc.is_json)
    rec["xattrs"] = doc.xattrs
    return rec


def write_history(sim: Simulation, path: Path) -> None:
    """``history.jsonl``: every recorded version (:attr:`VBucket.versions`), by collection,
    key and seqno."""
    streamed = sim.streamed_collections
    versions = sorted(
        (
            (d, d.seqno in vb.delivered)
            for vb in sim.bucket.vbuckets
            for d in vb.versions or ()
            if streamed is None or d.collection_id in streamed
        ),
        key=lambda v: (v[0].collection_id, v[0].key, v[0].seqno),
    )
    with open(path, "w", encoding="utf-8") as fh:
        for doc, delivered in versions:
            rec = document_record(sim, doc)
            rec.update(change=doc.change, deleted=doc.deleted, streamed=delivered)
            fh.write(json.dumps(rec, ensure_ascii=False, sort_keys=True))
            fh.write("\n")


def write_truth(
    sim: Simulation,
    out: Path,
    *,
    consistent: Mapping[int, int] | None = None,
    sessions: list[dict[str, object]] | None = None,
    bulk: Mapping[str, object] | None = None,
) -> Path:
    """Write ``out/truth/documents.jsonl`` and ``summary.json`` from the bucket model.

    ``consistent`` (vbucket -> last consistent seqno) and ``sessions`` default to what the
    simulation's own capture sessions saw; the test producer passes its own, and ``bulk``,
    what its bulk documents are (the summary's ``bulk``; neither the documents nor the
    collections' ``live_documents`` count them).
    """
    bucket = sim.bucket
    folder = out / "truth"
    folder.mkdir(parents=True, exist_ok=True)
    streamed = sim.streamed_collections
    docs = sorted(
        (
            d
            for vb in bucket.vbuckets
            for d in vb.docs.values()
            if not d.deleted and (streamed is None or d.collection_id in streamed)
        ),
        key=lambda d: (d.collection_id, d.key),
    )
    live_counts: dict[int, int] = {}
    with open(folder / "documents.jsonl", "w", encoding="utf-8") as fh:
        for doc in docs:
            live_counts[doc.collection_id] = live_counts.get(doc.collection_id, 0) + 1
            fh.write(json.dumps(document_record(sim, doc), ensure_ascii=False, sort_keys=True))
            fh.write("\n")
    if bucket.vbuckets[0].versions is not None:
        write_history(sim, folder / "history.jsonl")
    if consistent is None:
        last = sim.sessions[-1]
        consistent = {vbid: state.consistent for vbid, state in last.streams.items()}
    if sessions is None:
        sessions = [
            {
                "session_id": s.options.session_id,
                "files": [p.name for p in s.writer.paths],
                "features": list(s.options.features()),
            }
            for s in sim.sessions
        ]
    collections = _collection_records(sim, live_counts)
    as_of = dt.datetime.fromtimestamp(bucket.now, tz=dt.UTC)
    summary = {
        "bucket": bucket.name,
        "config": asdict(sim.config),
        "as_of": as_of.isoformat(),
        "as_of_unix": bucket.now,
        "collections": collections,
        "dropped_collections": [c["collection_id"] for c in collections if c["dropped"]],
        "streamed_collections": sorted(streamed) if streamed is not None else None,
        "live_documents": len(docs),
        "vbuckets": _vbucket_records(sim, consistent),
        "event_counts": dict(sorted(sim.counts.items())),
        "expected_errors": sim.expected_errors,
        "open_snapshots": sim.open_snapshots,
        "sessions": sessions,
        "bulk": dict(bulk) if bulk is not None else None,
    }
    path = folder / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _collection_records(sim: Simulation, live_counts: Mapping[int, int]) -> list[dict[str, Any]]:
    """The summary's ``collections``: each streamed collection, its scope and its live count."""
    bucket, streamed = sim.bucket, sim.streamed_collections
    records = []
    for coll in bucket.collections.values():
        if streamed is not None and coll.collection_id not in streamed:
            continue
        scope = bucket.scopes[coll.scope_id]
        records.append(
            {
                "scope": scope.name,
                "scope_id": scope.scope_id,
                "name": coll.name,
                "collection_id": coll.collection_id,
                "max_ttl": coll.max_ttl,
                "history": coll.history,
                "created_uid": coll.created_uid,
                "dropped_uid": coll.dropped_uid,
                "flush_uid": coll.flush_uid,
                "dropped": coll.dropped_uid is not None,
                "live_documents": live_counts.get(coll.collection_id, 0),
            }
        )
    return records


def _vbucket_records(sim: Simulation, consistent: Mapping[int, int]) -> list[dict[str, Any]]:
    """The summary's ``vbuckets``: each one's identity, history and seqnos, and where its
    collections were dropped or flushed."""
    return [
        {
            "vbucket": vb.vbid + sim.config.vbucket_offset,
            "vb_uuid": vb.uuid,
            "failover_log": [list(e) for e in vb.failover_log],
            "last_consistent_seqno": consistent[vb.vbid],
            "high_seqno": vb.high_seqno,
            "purge_seqno": vb.purge_seqno,
            "manifest_uid": vb.manifest_uid,
            "collection_ends": [
                {"collection_id": e.collection_id, "seqno": e.seqno, "kind": e.kind}
                for e in vb.sys_events
                if e.kind in ("drop_collection", "flush_collection")
            ],
        }
        for vb in sim.bucket.vbuckets
    ]
