"""The ``[storage]`` section: how Delta commits to tables on object storage (``s3a://``).

Delta commits version N of a table by creating ``_delta_log/<N>.json``, and that create must
fail when N exists already, or two writers that both chose N both succeed and one commit is
lost. A local filesystem gives that for free; S3 gives it only with a conditional PUT
(``If-None-Match: *``). Delta's own S3 log store (``S3SingleDriverLogStore``) checks and writes
under a lock held in its JVM: safe for one driver, not for the follow process, the maintenance
job, the quality check and Airflow's tasks writing the same tables. So a warehouse on S3 is
refused unless its log store is one several drivers may share (docs/object-storage.md).
"""

from __future__ import annotations

from typing import Literal

from dcp_cdc.config_base import ConfigModel

LogStore = Literal["s3-conditional-put", "single-driver"]

LOG_STORE_CLASSES: dict[str, str] = {
    "s3-conditional-put": "dcpcdc.delta.S3ConditionalPutLogStore",
    "single-driver": "io.delta.storage.S3SingleDriverLogStore",
}
"""The Delta log store class of each ``[storage] log_store`` choice."""

SAFE_LOG_STORES = frozenset({"s3-conditional-put"})
"""The choices that keep every commit with several drivers writing at once."""

LOG_STORE_KEYS = (
    "spark.delta.logStore.s3a.impl",
    "spark.delta.logStore.s3.impl",
    "spark.delta.logStore.class",
)
"""The Spark settings Delta picks an S3 table's log store from (per scheme, then global)."""


class StorageConfig(ConfigModel):
    """How Delta commits to tables on S3 (``s3a://``); see ``docs/object-storage.md``."""

    log_store: LogStore = "s3-conditional-put"
    """``s3-conditional-put``: each commit is written with S3's conditional PUT
    (``If-None-Match: *``), so of two drivers committing the same version one is refused and
    retries (``dcpcdc.delta.S3ConditionalPutLogStore``, built by ``make setup-s3``; needs an
    S3 that supports conditional writes, as AWS S3 has since 2024). ``single-driver``: Delta's
    default ``S3SingleDriverLogStore``, safe for one driver only: with a warehouse on S3 the
    configuration is refused, since the jobs, follow mode and maintenance are several drivers."""


def unsafe_log_store(
    warehouse_on_s3: bool, storage: StorageConfig, spark_conf: dict[str, str]
) -> str | None:
    """Why the configuration would let two drivers lose a commit on S3, naming the setting;
    None when it is safe (or the warehouse is not on S3)."""
    if not warehouse_on_s3:
        return None
    if storage.log_store not in SAFE_LOG_STORES:
        return (
            f"storage.log_store: {storage.log_store!r} (Delta's S3SingleDriverLogStore) is safe "
            "for one driver only, and the warehouse is on S3, where the jobs, follow mode and "
            'maintenance commit from several drivers: use log_store = "s3-conditional-put"'
        )
    ours = LOG_STORE_CLASSES[storage.log_store]
    for key in LOG_STORE_KEYS:
        chosen = spark_conf.get(key)
        if chosen is not None and chosen != ours:
            return (
                f"spark.conf.{key}: {chosen!r} would replace the log store of "
                f"storage.log_store ({ours}); several drivers commit to a warehouse on S3, "
                "so remove the setting and choose the log store with [storage] log_store"
            )
    return None
