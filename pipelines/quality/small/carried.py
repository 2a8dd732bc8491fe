"""What the columnar check carries to the next one: ``quality.<bucket>_check_columns``.

A check over columns that starts from it reads only the bronze frames of the ingest runs
committed since, the frames of each (session, vbucket) from its *cut* (kept here: the
``tail``), and the collection tables' change feed since, not all of bronze and silver
(:mod:`.incremental`). The table holds one row per record kind, its ``body`` an Arrow IPC
stream (the frames and the TTL lists) or JSON (the rest); a check replaces all of them in
one commit written from the driver (no Spark job).

- ``meta``: the format, the table versions read (``at``), the events and quarantine tables'
  last ingest run read (``txns``), when it ran (``now``), and the first collection whose
  bronze and silver sides differed (``apart``);
- ``pairs``: per (session, vbucket), its cut (the first snapshot group that may still
  change), the :class:`~.placement.Seed` the frames from there continue from, its last group
  and the position of its last frame;
- ``tail``: the frames from each cut (bronze's columns, :data:`.read.BASE_READ`), each with
  whether its change was counted among the live documents (``counted``);
- ``control``: every control frame (the rows :mod:`.measures` and :mod:`.history` read);
- ``streams``: per stream, :func:`.streams.stream_partial` of its frames before the cut;
  ``duplicates``: the repeated seqnos among them; ``data_max``: per (vbucket, vb uuid), the
  highest data seqno before the cuts;
- ``files``: per capture file, its items; ``history``: the branches, collection cuts and
  dead changes; ``sums``: per collection, bronze's and silver's live documents (count,
  checksum) and silver's tables; ``rolled`` and ``dropped``: silver's rows a rollback or a
  drop should have removed;
- ``bronze_ttl`` and ``silver_ttl``: the live documents with an expiry still ahead, each
  side's, which leave the counts when it passes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines import schemas
from pipelines.bronze.writer import remove_written, write_table
from pipelines.lake import delta_io, delta_rs, file_commits, table_entries
from pipelines.quality.small.placement import Seed
from pipelines.tables import BucketTables

Row = dict[str, Any]
FORMAT = 1
"""The layout of the records; a state of another format is not read (the check runs full)."""
_FRAMES = ("tail", "control", "bronze_ttl", "silver_ttl")


@dataclass
class Cut:
    """One (session, vbucket) pair's cut: the (stream, snapshot) numbers of its first group
    that may still change (None: none may), where its frames from there continue from, its
    last group and the position of its last frame."""

    group: tuple[int, int] | None
    seed: Seed
    last: tuple[int, int]
    position: tuple[int, int]


@dataclass
class Sums:
    """One collection's live documents on each side (checksums modulo
    :data:`pipelines.quality.measures.CHECKSUM_MODULUS`), and per silver table its rows the
    reconciliation names it by."""

    bronze_live: int = 0
    bronze_checksum: int = 0
    silver_live: int = 0
    silver_checksum: int = 0
    tables: dict[str, int] = field(default_factory=dict)


@dataclass
class State:
    """A columnar check's carried state (the module's docstring names each part)."""

    at: dict[str, int]
    txns: dict[str, int | None]
    now: int
    apart: str | None
    pairs: dict[tuple[str, int], Cut]
    tail: pa.Table
    control: pa.Table
    streams: dict[tuple[Any, ...], Row]
    duplicates: list[Row]
    data_max: dict[tuple[int, int | None], int]
    files: dict[str, int]
    branches: dict[int, list[tuple[int | None, int | None]]]
    cuts: dict[tuple[int, int | None], tuple[bool, int | None]]
    dead_changes: set[tuple[Any, Any, Any]]
    sums: dict[int, Sums]
    rolled: list[Row]
    dropped: list[Row]
    bronze_ttl: pa.Table
    silver_ttl: pa.Table


def apart(reconciliation: list[Row]) -> str | None:
    """The first collection whose bronze and silver sides differ in ``reconciliation``'s
    rows (None: none does): a state that records one is not started from."""
    return next(
        (
            r["where"]
            for r in reconciliation
            if (r["bronze_live"], r["bronze_checksum"]) != (r["silver_live"], r["silver_checksum"])
        ),
        None,
    )


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples they were (rows hold no list values here)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _records(state: State) -> dict[str, Any]:
    return {
        "meta": {
            "format": FORMAT,
            "at": state.at,
            "txns": state.txns,
            "now": state.now,
            "apart": state.apart,
        },
        "pairs": [
            [s, v, c.group, asdict(c.seed), c.last, c.position] for (s, v), c in state.pairs.items()
        ],
        "streams": [[list(k), p] for k, p in state.streams.items()],
        "duplicates": state.duplicates,
        "data_max": [[v, u, m] for (v, u), m in state.data_max.items()],
        "files": state.files,
        "history": {
            "branches": [[v, b] for v, b in state.branches.items()],
            "cuts": [[c, v, d, f] for (c, v), (d, f) in state.cuts.items()],
            "dead_changes": sorted(state.dead_changes, key=repr),
        },
        "sums": [[c, asdict(s)] for c, s in state.sums.items()],
        "rolled": state.rolled,
        "dropped": state.dropped,
    }


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def encode(state: State) -> pa.Table:
    """The state's rows (kind, body)."""
    kinds, bodies = [], []
    for kind, record in _records(state).items():
        kinds.append(kind)
        bodies.append(json.dumps(record, default=_plain).encode())
    for kind in _FRAMES:
        kinds.append(kind)
        bodies.append(_ipc(getattr(state, kind)))
    return pa.table({"kind": pa.array(kinds, pa.string()), "body": pa.array(bodies, pa.binary())})


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"a check state record holds a {type(value).__name__}")


def decode(rows: pa.Table) -> State | None:
    """The state of ``rows`` (:func:`encode`'s), or None when it is of another format."""
    bodies = dict(zip(rows["kind"].to_pylist(), rows["body"].to_pylist(), strict=True))
    if "meta" not in bodies:
        return None
    meta = json.loads(bodies["meta"])
    if meta.get("format") != FORMAT or any(k not in bodies for k in _FRAMES):
        return None
    r = {k: json.loads(b) for k, b in bodies.items() if k not in _FRAMES}
    frames = {k: pa.ipc.open_stream(bodies[k]).read_all() for k in _FRAMES}
    history = r["history"]
    return State(
        at={k: int(v) for k, v in meta["at"].items()},
        txns=meta["txns"],
        now=int(meta["now"]),
        apart=meta["apart"],
        pairs={
            (s, v): Cut(
                None if g is None else (g[0], g[1]), Seed(**seed), (last[0], last[1]), (p[0], p[1])
            )
            for s, v, g, seed, last, p in r["pairs"]
        },
        streams={tuple(k): _tuples(p) for k, p in r["streams"]},
        duplicates=r["duplicates"],
        data_max={(v, u): m for v, u, m in r["data_max"]},
        files=r["files"],
        branches={v: [(u, e) for u, e in b] for v, b in history["branches"]},
        cuts={(c, v): (d, f) for c, v, d, f in history["cuts"]},
        dead_changes={tuple(d) for d in history["dead_changes"]},
        sums={c: Sums(**s) for c, s in r["sums"]},
        rolled=r["rolled"],
        dropped=r["dropped"],
        **frames,
    )


def read(spark: SparkSession, bucket: str) -> State | None:
    """The state the last columnar check of ``bucket`` left (through delta-rs: no Spark
    job), or None (none yet, or of another format)."""
    table = BucketTables(bucket).check_columns
    if not table_entries.exists(spark, table):
        return None
    return decode(delta_rs.read_table(spark, table, ("kind", "body")))


def write(spark: SparkSession, bucket: str, state: State, properties: Mapping[str, str]) -> None:
    """Replace ``bucket``'s state by ``state``: one commit of a file this process writes."""
    table = BucketTables(bucket).check_columns
    delta_io.ensure_database(spark, table)
    delta_io.create_table(spark, table, schemas.CHECK_COLUMNS, properties)
    location = delta_io.table_location(spark, table)
    storage = dict(spark.sparkContext.getConf().getAll())
    written = write_table(encode(state), location, storage)
    if not file_commits.replace_files(spark, table, written, schemas.CHECK_COLUMNS):
        remove_written(written, location, storage)
        rows = encode(state).to_pylist()
        delta_io.replace_rows(spark.createDataFrame(rows, schema=schemas.CHECK_COLUMNS), table)
