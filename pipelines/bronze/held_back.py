"""The files of a bucket's landing that a missing earlier file of their session holds back
now, against the ingest log's state (:class:`pipelines.bronze.plan.LogState`): the landing is
listed and the header of each file not ingested read, as ingest would plan them. No Spark:
``dcp-cdc status`` asks this without a JVM, ``dcp-cdc landing skip`` and the quality suite
``landing_continuity`` with the state they read through Spark.
"""

from __future__ import annotations

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines.bronze.landing import header_or_problem, list_captures
from pipelines.bronze.plan import HeldBack, IngestSummary, LogState, plan_files


def held_back_now(config: AppConfig, bucket: BucketConfig, state: LogState) -> list[HeldBack]:
    """The files of ``bucket``'s landing that a missing earlier file of their session holds
    back, as ingest would plan them now (:func:`pipelines.bronze.plan.plan_files`) against
    the ingest log's ``state``."""
    storage = config.spark.conf
    files, _ = list_captures(config.landing_for(bucket), storage)
    summary = IngestSummary(bucket.name)
    plan_files(
        files,
        state,
        bucket.name,
        0,
        config.ingest.max_file_bytes,
        summary,
        lambda f: header_or_problem(f, storage),
    )
    return summary.held_back
