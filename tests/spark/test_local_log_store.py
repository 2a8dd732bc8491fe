"""Local tables commit through dcp-cdc's log store (``dcpcdc.delta.LocalHardLinkLogStore``),
and the store creates a commit only if its version is free.

The race of two JVMs through it is ``tests/e2e/test_local_writers.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dcp_cdc.config.storage import LOCAL_LOG_STORE_CLASS, LOCAL_LOG_STORE_KEY

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _store(spark: SparkSession) -> Any:
    jvm: Any = spark.sparkContext._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return jvm.dcpcdc.delta.LocalHardLinkLogStore(conf), conf


def _write(spark: SparkSession, path: Path, lines: list[str], overwrite: bool) -> None:
    jvm: Any = spark.sparkContext._jvm
    store, conf = _store(spark)
    actions = jvm.java.util.ArrayList()
    for line in lines:
        actions.add(line)
    store.write(jvm.org.apache.hadoop.fs.Path(path.as_uri()), actions.iterator(), overwrite, conf)


def test_a_local_tables_commits_go_through_the_hard_link_store(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert spark.sparkContext.getConf().get(LOCAL_LOG_STORE_KEY) == LOCAL_LOG_STORE_CLASS
    table = tmp_path / "t"
    spark.range(3).write.format("delta").save(str(table))
    spark.range(3, 5).write.format("delta").mode("append").save(str(table))
    assert spark.read.format("delta").load(str(table)).count() == 5

    jvm: Any = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table))
    delegate = log.store().getDelegate(log.logPath())
    assert delegate.logStoreImpl().getClass().getName() == LOCAL_LOG_STORE_CLASS
    # each commit whole, no temporary file left behind
    names = sorted(p.name for p in (table / "_delta_log").iterdir() if not p.is_dir())
    assert [n for n in names if n.endswith(".json")] == [f"{v:020d}.json" for v in (0, 1)]
    assert not [n for n in names if n.endswith(".tmp")]


def test_a_taken_version_is_refused_and_left_as_it_was(spark: SparkSession, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError

    commit = tmp_path / f"{7:020d}.json"
    _write(spark, commit, ['{"first":1}', '{"first":2}'], overwrite=False)
    with pytest.raises(Py4JJavaError) as refused:
        _write(spark, commit, ['{"second":1}'], overwrite=False)
    # the exception Delta turns into a retry at the next version
    assert refused.value.java_exception.getClass().getName() == (
        "java.nio.file.FileAlreadyExistsException"
    )
    assert commit.read_text() == '{"first":1}\n{"first":2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [commit.name]


def test_overwrite_replaces_a_file_whole(spark: SparkSession, tmp_path: Path) -> None:
    last = tmp_path / "_last_checkpoint"
    _write(spark, last, ['{"version":10}'], overwrite=True)
    (tmp_path / "._last_checkpoint.crc").write_bytes(b"stale Hadoop checksum")
    _write(spark, last, ['{"version":20}'], overwrite=True)
    assert last.read_text() == '{"version":20}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_last_checkpoint"]


def test_a_missing_log_folder_is_not_created(spark: SparkSession, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError

    with pytest.raises(Py4JJavaError) as missing:
        _write(spark, tmp_path / "absent" / f"{0:020d}.json", ["{}"], overwrite=False)
    assert missing.value.java_exception.getClass().getName() == "java.io.FileNotFoundException"
    assert not (tmp_path / "absent").exists()
