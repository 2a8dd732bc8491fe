"""How a run's capture files become work: the file rows the scan and decode tasks read, their
task groups (one Spark partition each), the decode function the tasks run, the accumulators
they report to, and the same functions run in the driver itself for a small run (no Spark job).
The ingest's steps that use them are :mod:`pipelines.bronze.job`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from dcp_cdc.config import AppConfig
from pipelines import schemas
from pipelines.bronze.decode import decode_files
from pipelines.bronze.landing import CaptureFile
from pipelines.bronze.plan import task_groups
from pipelines.errors import LandingChangedError


class ByFile:
    """Accumulator of ``{file: value}`` from the tasks (counts, scan outcomes). A file's value
    is set, not added: a task that runs again for the same file sets the same value."""

    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(  # pyspark's AccumulatorParam protocol
        self, total: dict[str, Any], more: dict[str, Any]
    ) -> dict[str, Any]:
        total.update(more)
        return total


Decoder = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def decoder(
    config: AppConfig,
    schema: T.StructType,
    digests: Mapping[str, str],
    counts: Any,
    *,
    frames: bool = True,
    errors: bool = True,
    worker: bool = True,
) -> Decoder:
    """The ``mapInArrow`` function that decodes a run's files in their tasks
    (:func:`decode_files`): ``schema``'s rows of every frame (``frames``) and of the malformed
    ones (``errors``), reading exactly the bytes ``digests`` planned; each file's ``(frames,
    errors)`` goes to ``counts`` (a :func:`by_file` accumulator)."""
    arrow_schema = schemas.arrow_schema(schema)
    chunk, raw_limit = config.ingest.chunk_bytes, config.ingest.quarantine_raw_bytes
    storage = config.spark.conf  # what the landing filesystem is built from, in the tasks

    def decoded(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return decode_files(
            batches,
            arrow_schema,
            chunk_bytes=chunk,
            raw_limit=raw_limit,
            frames=frames,
            errors=errors,
            done=lambda path, found, bad: counts.add({path: (found, bad)}),
            storage=storage,
            planned_digests=digests,
            worker=worker,
        )

    return decoded


def in_driver(file_rows: list[dict[str, Any]], task: Decoder) -> list[dict[str, Any]]:
    """``task`` (a ``mapInArrow`` function of the run's files) run here, over all of them as
    one task: its rows."""
    files = pa.RecordBatch.from_pylist(file_rows, schema=schemas.arrow_schema(schemas.FILES))
    return [row for batch in task(iter([files])) for row in batch.to_pylist()]


def by_file(spark: SparkSession) -> Any:
    """An accumulator of ``{file: value}`` from the tasks (:class:`ByFile`)."""
    return spark.sparkContext.accumulator({}, ByFile())  # type: ignore[arg-type]


_T = TypeVar("_T")


def relay_landing_changes(write: Callable[[], _T]) -> _T:
    """Run a Spark action whose decode tasks may fail with :class:`LandingChangedError` (a
    planned file changed under them): the driver raises it again, typed."""
    try:
        return write()
    except Exception as exc:
        relayed = re.search(rf"{LandingChangedError.__name__}: ([^\n]+)", str(exc))
        if relayed is None:
            raise
        raise LandingChangedError(relayed.group(1)) from exc


def file_row(f: CaptureFile, carry: str | None = None) -> dict[str, Any]:
    """A file's row for the scan and decode tasks (``schemas.FILES``)."""
    return {
        "path": f.path,
        "bucket": f.bucket,
        "session_started_at": f.started_at,
        "session_id": f.session_id,
        "file_sequence": f.file_sequence,
        "collections": f.collections,
        "header_length": f.header_length,
        "size": f.size,
        "carry": carry,
    }


def files_frame(
    spark: SparkSession, file_rows: list[dict[str, Any]], target_bytes: int
) -> DataFrame:
    """The run's files, grouped into decode tasks (:func:`task_groups`), one partition each."""
    groups = task_groups(
        [r["size"] for r in file_rows],
        target_bytes=target_bytes,
        parallelism=spark.sparkContext.defaultParallelism,
    )
    fields = schemas.FILES.fieldNames()
    tasks = [[tuple(file_rows[i][f] for f in fields) for i in g] for g in groups]
    # one element per slice: each group is exactly one partition, with no shuffle
    rdd = spark.sparkContext.parallelize(tasks, max(len(tasks), 1)).flatMap(lambda g: g)
    return spark.createDataFrame(rdd, schema=schemas.FILES)
