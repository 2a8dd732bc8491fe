"""Counting the Spark jobs a block of code runs: every job the session's scheduler started,
from any thread (Delta's own thread pools too), not only those of a job group."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession


@dataclass
class Jobs:
    """The jobs started in a :func:`counted` block: how many, and what each was (its call
    site and description, as far as the status store has them when the block ends)."""

    count: int = 0
    what: list[str] = field(default_factory=list)


def _started(spark: SparkSession) -> int:
    # the scheduler's next job id: each job of the session takes one, whatever its thread
    context: Any = spark.sparkContext._jsc.sc()
    return int(context.dagScheduler().numTotalJobs())


@contextlib.contextmanager
def counted(spark: SparkSession) -> Iterator[Jobs]:
    """The jobs the block runs (filled when it ends)."""
    jobs = Jobs()
    first = _started(spark)
    yield jobs
    last = _started(spark)
    jobs.count = last - first
    store: Any = spark.sparkContext._jsc.sc().statusStore()
    for job_id in range(first, last):
        try:
            job = store.job(job_id)
            description = job.description()
            said = description.get() if description.isDefined() else ""
            jobs.what.append(f"job {job_id}: {job.name()} {said}".strip())
        except Exception:  # not in the status store yet (its listener runs behind)
            jobs.what.append(f"job {job_id}")
