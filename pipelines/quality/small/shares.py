"""The columnar check's shares of the vbuckets: a bucket of more frames than
:data:`SHARE_FRAMES` is checked a share of its vbuckets at a time (``vbucket % shares``), so
that the driver holds one share's columns, not the bucket's. Bronze's markers and items and
silver's rows are streamed once from delta-rs into local Arrow files, one per share (a
vbucket's checks need only its own frames and rows, and a key lives in one vbucket);
bronze's control frames, a few per vbucket, stay whole in memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from pipelines.errors import NotOnDriver
from pipelines.lake.delta_rs import plain_types
from pipelines.quality.small.items import _numbers, columnar, regular

SHARE_FRAMES = 1_500_000
"""The most frames of bronze a share of the vbuckets holds (about 2 GB in the driver at
1,000,000 frames of a share)."""


def share_count(ingest_log: Sequence[dict[str, Any]], most: int = SHARE_FRAMES) -> int:
    """How many shares a bucket's check takes: its ingested frames (the ingest log's counts)
    over ``most``."""
    frames = sum(r["frames"] or 0 for r in ingest_log if r["status"] == "ingested")
    return max(1, -(-frames // max(1, most)))


@dataclass
class _Writers:
    """One Arrow file per share in ``folder``, opened on its first rows."""

    folder: Path
    name: str
    count: int
    paths: list[Path | None] = field(default_factory=list)
    _open: dict[int, ipc.RecordBatchFileWriter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.paths = [None] * self.count

    def write(self, rows: pa.Table, share: np.ndarray) -> None:
        for i in np.unique(share).tolist():
            part = rows.filter(pa.array(share == i))
            if i not in self._open:
                path = self.folder / f"{self.name}-{i}.arrow"
                self.paths[i] = path
                self._open[i] = ipc.new_file(path, part.schema)
            self._open[i].write_table(part)

    def close(self) -> None:
        for writer in self._open.values():
            writer.close()

    def read(self, i: int, schema: pa.Schema) -> pa.Table:
        path = self.paths[i]
        if path is None:
            return schema.empty_table()
        with ipc.open_file(path) as reader:
            return reader.read_all()


@contextmanager
def spilled_bronze(
    batches: pa.RecordBatchReader, count: int
) -> Iterator[tuple[pa.Table, list[pa.Table] | _Writers]]:
    """Bronze's control frames (a table) and its markers and items per share (in memory for
    one share, else in local Arrow files, removed on exit)."""
    if count == 1:
        events = plain_types(batches.read_all())
        regular(events)
        mask = pa.array(columnar(events))
        yield events.filter(pc.invert(mask)), [events.filter(mask)]
        return
    with tempfile.TemporaryDirectory(prefix="dcp-cdc-check-") as folder:
        writers = _Writers(Path(folder), "bronze", count)
        control = []
        try:
            for batch in batches:
                events = plain_types(pa.Table.from_batches([batch]))
                regular(events)
                mask = columnar(events)
                control.append(events.filter(pa.array(~mask)))
                rows = events.filter(pa.array(mask))
                writers.write(rows, _numbers(rows["vbucket"]) % count)
        finally:
            writers.close()
        yield pa.concat_tables(control), writers


def share_of_control(control: pa.Table, count: int) -> np.ndarray:
    """The share of each control frame: of its stream's vbucket (a response's opaque), -1
    for a frame of none."""
    vbucket = pc.if_else(
        pc.is_valid(control["status"]),
        control["opaque"].cast(pa.int64()),
        control["vbucket"].cast(pa.int64()),
    )
    known = pc.is_valid(vbucket).to_numpy(zero_copy_only=False)
    return np.where(known, _numbers(vbucket) % count, -1)


def silver_share(rows: pa.Table, count: int) -> np.ndarray:
    """The share of each silver row (by its ``_vbucket``)."""
    if rows["_vbucket"].null_count:
        raise NotOnDriver("a silver row's _vbucket is null")
    return _numbers(rows["_vbucket"]) % count
