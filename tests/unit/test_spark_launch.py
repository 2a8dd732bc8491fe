"""Launch settings for spark-submit, spark-sql and the Thrift server (no JVM needed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dcp_cdc.config import AppConfig, BucketConfig, IngestConfig, SparkConfig
from pipelines.errors import SparkSetupError
from pipelines.lake.spark_session import (
    C1_ONLY,
    JARS_DIR_ENV,
    LOCAL_LOG_STORE_JAR,
    check_submitted_log_store,
    ingest_jvm_conf,
    launch_conf,
    merge_conf,
    properties_text,
)


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark_2.13-4.4.0.jar", "delta-storage-4.4.0.jar", LOCAL_LOG_STORE_JAR):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))
    s3 = tmp_path / "jars-s3"  # what `make setup-s3` leaves, for a warehouse on S3
    s3.mkdir()
    for name in ("hadoop-aws-3.5.0.jar", "s3-2.35.4.jar", "dcp-cdc-s3-logstore.jar"):
        (s3 / name).write_bytes(b"")
    monkeypatch.setenv("DCP_CDC_S3_JARS_DIR", str(s3))
    return folder


def test_local_launch_has_jars_catalog_and_driver_settings(tmp_path: Path, jars: Path) -> None:
    config = AppConfig(
        landing=str(tmp_path / "l"),
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b")],
        spark=SparkConfig(conf={"spark.driver.extraJavaOptions": "-XX:+UseSerialGC", "x.y": "z"}),
    )
    conf = launch_conf(config, "app", master="local[2]")
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.jars"] == ",".join(
        str(jars / name)
        for name in (LOCAL_LOG_STORE_JAR, "delta-spark_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")
    )
    # local tables commit through the log store that keeps every commit of several writers
    assert conf["spark.delta.logStore.file.impl"] == "dcpcdc.delta.LocalHardLinkLogStore"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.warehouse.dir"] == str(tmp_path / "w")
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"] == (
        f"jdbc:derby:;databaseName={tmp_path / 'w' / 'metastore_db'};create=true"
    )
    java = shlex.split(conf["spark.driver.extraJavaOptions"])
    assert java[0] == f"-Dderby.system.home={tmp_path / 'w'}"
    assert java[-1] == "-XX:+UseSerialGC"  # the configuration's options come after the session's
    assert (conf["spark.driver.memory"], conf["x.y"]) == ("6g", "z")
    # launchers put the jars on the driver's class path too (the Thrift server needs it)
    assert conf["spark.driver.extraClassPath"] == conf["spark.jars"].replace(",", ":")


def test_master_left_to_the_launcher_and_shared_metastore(jars: Path) -> None:
    config = AppConfig(
        landing="s3a://l",
        warehouse="s3a://lake/w",
        buckets=[BucketConfig(name="b")],
        spark=SparkConfig(metastore="thrift://hms:9083"),
    )
    conf = launch_conf(config, "app", master=None)
    assert "spark.master" not in conf and "spark.driver.memory" not in conf
    assert conf["spark.sql.warehouse.dir"] == "s3a://lake/w"
    assert conf["spark.hadoop.hive.metastore.uris"] == "thrift://hms:9083"
    assert "spark.hadoop.javax.jdo.option.ConnectionURL" not in conf
    assert "derby" not in conf["spark.driver.extraJavaOptions"]
    # on S3: the S3 jars and the log store that keeps every commit with several writers
    assert "dcp-cdc-s3-logstore.jar" in conf["spark.jars"] and "hadoop-aws" in conf["spark.jars"]
    assert conf["spark.delta.logStore.s3a.impl"] == "dcpcdc.delta.S3ConditionalPutLogStore"


def test_missing_jars_say_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JARS_DIR_ENV, str(tmp_path))
    config = AppConfig(landing="l", warehouse=str(tmp_path / "w"), buckets=[BucketConfig(name="b")])
    with pytest.raises(SparkSetupError, match="make setup"):
        launch_conf(config, "app", master="local[1]")


def test_delta_jars_without_the_local_log_store_say_how_to_get_it(
    tmp_path: Path, jars: Path
) -> None:
    (jars / LOCAL_LOG_STORE_JAR).unlink()
    config = AppConfig(landing="l", warehouse=str(tmp_path / "w"), buckets=[BucketConfig(name="b")])
    with pytest.raises(SparkSetupError, match=f"not {LOCAL_LOG_STORE_JAR}.*make setup.*javac"):
        launch_conf(config, "app", master="local[1]")


def test_a_submitted_driver_needs_the_local_log_store_among_its_jars() -> None:
    check_submitted_log_store(
        f"file:/x/.cache/jars/delta-spark_2.13-4.4.0.jar,file:/x/.cache/jars/{LOCAL_LOG_STORE_JAR}"
    )
    with pytest.raises(SparkSetupError, match=f"without {LOCAL_LOG_STORE_JAR}.*spark-conf"):
        check_submitted_log_store("spark://127.0.0.1:4040/jars/delta-spark_2.13-4.4.0.jar")


def test_properties_file_escapes_backslashes() -> None:
    text = properties_text({"a.b": "x=y", "c": "C:\\dir"})
    assert text.splitlines()[1:] == ["a.b=x=y", "c=C:\\\\dir"]


def test_an_ingest_jvm_keeps_its_jit_at_c1_unless_told_otherwise() -> None:
    config = AppConfig(landing="l", warehouse="w", buckets=[BucketConfig(name="b")])
    assert ingest_jvm_conf(config) == {
        "spark.driver.extraJavaOptions": C1_ONLY,
        "spark.executor.extraJavaOptions": C1_ONLY,
    }
    tiered = config.model_copy(update={"ingest": IngestConfig(jvm_jit="tiered")})
    assert ingest_jvm_conf(tiered) == {}
    # Spark's writer does the work in the JVM: C2 (10M events took 170 s with C1 alone)
    spark_writer = config.model_copy(update={"ingest": IngestConfig(writer="spark")})
    assert ingest_jvm_conf(spark_writer) == {}
    # appended to options already there, for the driver and the executors alike
    merged = merge_conf(
        {"spark.driver.extraJavaOptions": "-Da=1", "spark.executor.extraJavaOptions": "-Db=2"},
        ingest_jvm_conf(config),
    )
    assert merged["spark.driver.extraJavaOptions"] == f"-Da=1 {C1_ONLY}"
    assert merged["spark.executor.extraJavaOptions"] == f"-Db=2 {C1_ONLY}"
    # C1 alone, with the code cache tiered compilation reserves (48 MiB: a MERGE fills it)
    assert C1_ONLY.split() == ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]


def test_a_launchers_delta_jars_are_recognised_as_paths_or_urls() -> None:
    from pipelines.lake.spark_session import delta_jars_given

    given = "/j/delta-storage-4.4.0.jar,file:///j/delta-spark_2.13-4.4.0.jar"
    assert delta_jars_given(given) == given
    assert delta_jars_given("hdfs://nn:8020/lib/delta-spark_2.13-4.4.0.jar,/x/other.jar")
    assert delta_jars_given("/j/delta-storage-4.4.0.jar,/j/my-delta-spark_fork.jar") is None
    assert delta_jars_given("") is None and delta_jars_given(None) is None


def test_a_driver_not_started_by_spark_submit_resolves_its_own_jars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipelines.lake.spark_session import submitted_delta_jars

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert submitted_delta_jars() is None  # and no JVM is started to find out
