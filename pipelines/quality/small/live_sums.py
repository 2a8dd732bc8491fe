"""The live documents of each side of ``silver_reconciliation`` as sums a later check
updates (:mod:`.carried`'s ``sums``, ``bronze_ttl``, ``silver_ttl``, ``rolled``,
``dropped``): per collection the count and checksum of live documents, per silver table the
rows that name it, and the rows whose expiry is still ahead (they leave the sums when it
passes). A document counts on silver's side when its view row is not deleted and its expiry
is 0 or ahead (:func:`.measures.reconciliation_metrics`); on bronze's when its newest
committed change is a mutation whose expiration is 0 or ahead (:mod:`.item_history`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small.carried import Sums
from pipelines.quality.small.hash_columns import xxhash64_columns
from pipelines.quality.small.items import _flags, _numbers, _present

Row = dict[str, Any]
BRONZE_TTL = pa.schema(
    [
        pa.field("collection_id", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("seqno", pa.int64()),
        pa.field("expiration", pa.int64()),
    ]
)
SILVER_TTL = pa.schema(
    [
        pa.field("_collection_id", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("_seqno", pa.int64()),
        pa.field("_expiry", pa.int64()),
        pa.field("table", pa.string()),
    ]
)


def hashes(keys: pa.Array | pa.ChunkedArray, seqnos: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each (key, seqno) row's signed checksum term (:func:`.hash_columns.checksum_columns`)."""
    return np.asarray(xxhash64_columns(keys, seqnos), np.int64)


def add(sums: dict[int, Sums], side: str, cids: np.ndarray, terms: np.ndarray, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) rows of collections ``cids`` with checksum
    ``terms`` from ``side`` ("bronze" or "silver") of ``sums``."""
    for cid in np.unique(cids):
        at = cids == cid
        got = sums.setdefault(int(cid), Sums())
        count = f"{side}_live"
        checksum = f"{side}_checksum"
        setattr(got, count, getattr(got, count) + sign * int(at.sum()))
        total = sum(int(t) for t in terms[at])
        setattr(got, checksum, (getattr(got, checksum) + sign * total) % CHECKSUM_MODULUS)


def count_tables(sums: dict[int, Sums], pairs: Iterable[tuple[int, str]], sign: int) -> None:
    """Add or take away one row naming its (collection, table) per pair."""
    for cid, table in pairs:
        tables = sums.setdefault(int(cid), Sums()).tables
        tables[table] = tables.get(table, 0) + sign
        if tables[table] == 0:
            del tables[table]


def shown(rows: pa.Table, now: int) -> np.ndarray:
    """Which view rows count on silver's side at ``now``."""
    expiry, has_expiry = _numbers(rows["_expiry"]), _present(rows["_expiry"])
    alive = _flags(pc.equal(rows["_deleted"], False))
    return np.asarray(alive & has_expiry & ((expiry == 0) | (expiry > now)), bool)


def silver_ttl(rows: pa.Table, now: int) -> pa.Table:
    """The view rows that count at ``now`` and leave when their expiry passes."""
    ahead = shown(rows, now) & (_numbers(rows["_expiry"]) > 0)
    return rows.filter(pa.array(ahead)).select(SILVER_TTL.names).cast(SILVER_TTL)


def bronze_ttl(live: pa.Table) -> pa.Table:
    """The live documents (:class:`.item_history.History`'s ``live``) whose expiration is
    ahead: they leave bronze's side when it passes."""
    expiring = _numbers(live["expiration"]) > 0
    table = live.filter(pa.array(expiring)).select(BRONZE_TTL.names)
    table = table.set_column(0, "collection_id", pc.cast(table["collection_id"], pa.int64()))
    return table.cast(BRONZE_TTL)


def expire(
    sums: dict[int, Sums],
    ttl: pa.Table,
    side: str,
    now: int,
    *,
    cid: str,
    seqno: str,
    expiry: str,
) -> pa.Table:
    """Take the rows of ``ttl`` whose expiry has passed at ``now`` away from ``side`` (and
    from the tables they name, on silver's side); the rows still ahead."""
    passed = _numbers(ttl[expiry]) <= now
    gone = ttl.filter(pa.array(passed))
    if gone.num_rows:
        add(sums, side, _numbers(gone[cid]), hashes(gone["key"], gone[seqno]), -1)
        if "table" in gone.column_names:
            count_tables(
                sums,
                zip(_numbers(gone[cid]).tolist(), gone["table"].to_pylist(), strict=True),
                -1,
            )
    return ttl.filter(pa.array(~passed))


def without_keys(table: pa.Table, cid: str, keys: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``table``'s rows whose (collection, key) is not among ``keys`` (``collection_id``,
    ``key``), and those that are (keys compared as bytes: bronze's are, silver's are text)."""
    if not table.num_rows or not keys.num_rows:
        return table, table.schema.empty_table()
    marked = pa.table(
        {
            "collection_id": pc.cast(keys["collection_id"], pa.int64()),
            "key": pc.cast(keys["key"], pa.binary()),
            "_hit": pa.array(np.ones(keys.num_rows, bool)),
        }
    )
    marked = marked.group_by(["collection_id", "key"]).aggregate([("_hit", "max")])
    probe = pa.table(
        {
            cid: pc.cast(table[cid], pa.int64()),
            "key": pc.cast(table["key"], pa.binary()),
            "_row": pa.array(np.arange(table.num_rows)),
        }
    )
    joined = probe.join(
        marked,
        keys=[cid, "key"],
        right_keys=["collection_id", "key"],
        join_type="left outer",
    )
    hit = np.zeros(table.num_rows, bool)
    hit[_numbers(joined["_row"])] = _flags(joined["_hit_max"])
    return table.filter(pa.array(~hit)), table.filter(pa.array(hit))
