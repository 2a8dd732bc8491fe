"""The ``[storage]`` section and the Delta log stores: how Delta commits to tables.

Delta commits version N of a table by creating ``_delta_log/<N>.json``, and that create must
fail when N exists already, or two writers that both chose N both succeed and one commit is
lost. Delta's own stores check and then write under a lock held in their JVM: safe for one
driver, not for the follow process, a hand-run apply, the maintenance job, the quality check
and Airflow's tasks writing the same tables. So dcp-cdc brings a store whose create is atomic
for each kind of warehouse (docs/object-storage.md, "Several writers"): on S3 a conditional PUT
(``If-None-Match: *``), chosen by ``[storage] log_store``; on local disk a hard link, in every
session. A configuration that would replace either with a store unsafe for several drivers is
refused when it loads.
"""

from __future__ import annotations

from typing import Literal

from dcp_cdc.config.base import ConfigModel

LogStore = Literal["s3-conditional-put", "single-driver"]

LOG_STORE_CLASSES: dict[str, str] = {
    "s3-conditional-put": "dcpcdc.delta.S3ConditionalPutLogStore",
    "single-driver": "io.delta.storage.S3SingleDriverLogStore",
}
"""The Delta log store class of each ``[storage] log_store`` choice."""

SAFE_LOG_STORES = frozenset({"s3-conditional-put"})
"""The choices that keep every commit with several drivers writing at once."""

S3_LOG_STORE_KEYS = ("spark.delta.logStore.s3a.impl", "spark.delta.logStore.s3.impl")
"""The Spark settings Delta picks an S3 table's log store from."""

LOCAL_LOG_STORE_CLASS = "dcpcdc.delta.LocalHardLinkLogStore"
"""The Delta log store of local tables (``file:``) in every session: each commit is a file
linked to ``<N>.json`` (``link(2)``, which fails when the name exists), so of two drivers
committing the same version one is refused and retries. Built by ``make setup``."""
LOCAL_LOG_STORE_KEY = "spark.delta.logStore.file.impl"
"""The Spark setting of the log store of local tables."""
_GLOBAL_LOG_STORE = "spark.delta.logStore.class"


class StorageConfig(ConfigModel):
    """How Delta commits to tables on S3 (``s3a://``); local tables always commit through
    ``dcpcdc.delta.LocalHardLinkLogStore``. See ``docs/object-storage.md``."""

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
    """Why the configuration would let two drivers lose a commit, naming the setting; None
    when it is safe."""
    # Delta reads its log store settings with or without the "spark." prefix.
    chosen = {
        f"spark.{key.removeprefix('spark.')}": (key, value) for key, value in spark_conf.items()
    }
    if _GLOBAL_LOG_STORE in chosen:
        key, value = chosen[_GLOBAL_LOG_STORE]
        return (
            f"spark.conf.{key}: {value!r} would replace every log store dcp-cdc sets, among "
            f"them the local tables' {LOCAL_LOG_STORE_CLASS}, which keeps every commit when "
            "several drivers (follow mode, apply, maintain) write the same tables: remove the "
            "setting"
        )
    local = _replaced(
        chosen,
        LOCAL_LOG_STORE_KEY,
        LOCAL_LOG_STORE_CLASS,
        f"the local tables' log store ({LOCAL_LOG_STORE_CLASS}); several drivers (follow mode, "
        "apply, maintain) commit to the same tables, and Delta's own local store can lose a "
        "commit then: remove the setting",
    )
    if local is not None or not warehouse_on_s3:
        return local
    if storage.log_store not in SAFE_LOG_STORES:
        return (
            f"storage.log_store: {storage.log_store!r} (Delta's S3SingleDriverLogStore) is safe "
            "for one driver only, and the warehouse is on S3, where the jobs, follow mode and "
            'maintenance commit from several drivers: use log_store = "s3-conditional-put"'
        )
    ours = LOG_STORE_CLASSES[storage.log_store]
    what = (
        f"the log store of storage.log_store ({ours}); several drivers commit to a warehouse "
        "on S3, so remove the setting and choose the log store with [storage] log_store"
    )
    replaced = (_replaced(chosen, setting, ours, what) for setting in S3_LOG_STORE_KEYS)
    return next((why for why in replaced if why is not None), None)


def _replaced(chosen: dict[str, tuple[str, str]], setting: str, ours: str, what: str) -> str | None:
    """Why the configuration's ``setting`` (``chosen``: by its ``spark.`` name, the key as
    written and its value) would replace ``what``, when it names a class other than ``ours``;
    None when it is not set or names ``ours``."""
    key, value = chosen.get(setting, ("", ours))
    if value == ours:
        return None
    return f"spark.conf.{key}: {value!r} would replace {what}"
