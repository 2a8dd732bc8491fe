"""A warehouse on S3: the configuration refused when two drivers could lose a commit, the S3
jars and log store a session gets, and the preflight's typed errors against a real (moto) S3
server on 127.0.0.1. No Spark here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dcp_cdc.config import load_config
from dcp_cdc.config.storage import LOCAL_LOG_STORE_CLASS, LOG_STORE_CLASSES
from dcp_cdc.errors import ConfigError
from pipelines.errors import (
    S3BucketNotFoundError,
    S3CredentialsError,
    S3EndpointError,
    S3SetupError,
)
from pipelines.lake import object_storage
from pipelines.lake.object_storage import preflight, s3_jars
from tests.support.s3_server import SECRET_KEY, MotoS3Server

S3_WAREHOUSE = """
landing = "s3a://cdc-landing/couchbase"
warehouse = "s3a://cdc-lake/warehouse"
[[buckets]]
name = "b"
[spark]
metastore = "thrift://127.0.0.1:9083"
"""


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        yield server


def _config(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "c.toml"
    file.write_text(text, encoding="utf-8")
    return file


def test_s3_warehouse_gets_the_conditional_put_log_store_by_default(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, S3_WAREHOUSE))
    assert config.storage.log_store == "s3-conditional-put"
    conf = object_storage.s3_session_conf(config.storage.log_store)
    assert conf["spark.delta.logStore.s3a.impl"] == "dcpcdc.delta.S3ConditionalPutLogStore"
    assert conf["spark.delta.logStore.s3.impl"] == "dcpcdc.delta.S3ConditionalPutLogStore"
    assert conf["spark.hadoop.fs.s3a.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ('[storage]\nlog_store = "single-driver"\n', "storage.log_store"),
        (
            '[spark.conf]\n"spark.delta.logStore.s3a.impl" = '
            '"io.delta.storage.S3SingleDriverLogStore"\n',
            "spark.conf.spark.delta.logStore.s3a.impl",
        ),
        (
            '[spark.conf]\n"spark.delta.logStore.class" = "io.delta.storage.HDFSLogStore"\n',
            "spark.conf.spark.delta.logStore.class",
        ),
    ],
)
def test_a_log_store_unsafe_for_several_writers_is_refused(
    tmp_path: Path, extra: str, named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, S3_WAREHOUSE + extra))
    assert named in str(caught.value)
    assert str(tmp_path / "c.toml") in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("spark.delta.logStore.file.impl", "io.delta.storage.HDFSLogStore"),
        ("delta.logStore.file.impl", "io.delta.storage.LocalLogStore"),  # Delta reads both
        ("spark.delta.logStore.class", "dcpcdc.delta.LocalHardLinkLogStore"),
        ("delta.logStore.class", "io.delta.storage.HDFSLogStore"),
    ],
)
def test_replacing_the_local_tables_log_store_is_refused(
    tmp_path: Path, setting: str, value: str
) -> None:
    """Local tables always commit through LocalHardLinkLogStore: follow mode, a hand-run
    apply and maintenance are several drivers on the same local tables too."""
    text = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
    text += f'[spark.conf]\n"{setting}" = "{value}"\n'
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, text))
    assert f"spark.conf.{setting}" in str(caught.value)
    same = text.replace(value, LOCAL_LOG_STORE_CLASS)
    if "file.impl" in setting:  # naming the store every session sets is harmless
        assert load_config(_config(tmp_path, same)).spark.conf[setting] == LOCAL_LOG_STORE_CLASS


def test_a_local_warehouse_may_keep_the_single_driver_store(tmp_path: Path) -> None:
    text = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
    config = load_config(_config(tmp_path, text + '[storage]\nlog_store = "single-driver"\n'))
    assert LOG_STORE_CLASSES[config.storage.log_store] == "io.delta.storage.S3SingleDriverLogStore"


def test_missing_s3_jars_name_make_setup_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(object_storage.S3_JARS_DIR_ENV, str(tmp_path))
    with pytest.raises(S3SetupError, match=r"make setup-s3") as caught:
        s3_jars()
    assert "hadoop-aws" in str(caught.value) and str(tmp_path) in str(caught.value)
    from pipelines.lake.spark_session import object_storage_jars

    assert object_storage_jars(tmp_path / "warehouse") == []  # a local warehouse needs none
    with pytest.raises(S3SetupError):
        object_storage_jars("s3a://lake/warehouse")


def test_launch_conf_of_an_s3_warehouse_has_the_jars_and_log_store(tmp_path: Path) -> None:
    if not (object_storage.CHECKOUT_S3_JARS_DIR / object_storage.LOG_STORE_JAR).is_file():
        pytest.skip("no .cache/jars-s3 (make setup-s3)")
    from pipelines.lake.spark_session import launch_conf

    conf = launch_conf(load_config(_config(tmp_path, S3_WAREHOUSE)), "t", master=None)
    jars = conf["spark.jars"].split(",")
    assert any(Path(j).name.startswith("hadoop-aws-3.5.0") for j in jars)
    assert any(Path(j).name == object_storage.LOG_STORE_JAR for j in jars)
    assert any(Path(j).name.startswith("delta-spark_") for j in jars)
    assert conf["spark.delta.logStore.s3a.impl"] == "dcpcdc.delta.S3ConditionalPutLogStore"


def test_preflight_passes_for_buckets_that_exist(s3: MotoS3Server) -> None:
    s3.create_bucket("lake")
    s3.create_bucket("landing")
    preflight({"warehouse": "s3a://lake/w", "landing": "s3a://landing/x"}, s3.spark_conf())
    preflight({"warehouse": "/local/w"}, {})  # nothing on S3: nothing to ask


def test_preflight_names_a_bucket_that_does_not_exist(s3: MotoS3Server) -> None:
    s3.create_bucket("lake")
    with pytest.raises(S3BucketNotFoundError) as caught:
        preflight(
            {"warehouse": "s3a://lake/w", "buckets[1].landing": "s3a://no-such/x"},
            s3.spark_conf(),
        )
    message = str(caught.value)
    assert "buckets[1].landing s3a://no-such/x" in message
    assert "'no-such' does not exist" in message and s3.endpoint in message
    assert SECRET_KEY not in message


def test_preflight_names_an_endpoint_that_does_not_answer(s3: MotoS3Server) -> None:
    settings = s3.spark_conf() | {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9"}
    with pytest.raises(S3EndpointError) as caught:
        preflight({"warehouse": "s3a://lake/w"}, settings)
    message = str(caught.value)
    assert "http://127.0.0.1:9 (spark.hadoop.fs.s3a.endpoint) does not answer" in message
    assert SECRET_KEY not in message


def test_preflight_without_credentials_says_where_they_go(
    s3: MotoS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = {
        k: v for k, v in s3.spark_conf().items() if not k.endswith(("access.key", "secret.key"))
    }
    with pytest.raises(S3CredentialsError) as caught:
        preflight({"warehouse": "s3a://lake/w"}, settings)
    message = str(caught.value)
    assert "warehouse s3a://lake/w: no S3 credentials" in message
    assert "spark.hadoop.fs.s3a.access.key" in message and "AWS_ACCESS_KEY_ID" in message


def test_a_job_session_stops_before_spark_when_the_bucket_is_missing(
    s3: MotoS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.lake import spark_session

    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(spark_session, "build_spark_session", no_spark)
    settings = "".join(f'"{k}" = "{v}"\n' for k, v in s3.spark_conf().items())
    text = S3_WAREHOUSE.replace("cdc-lake", "missing-lake") + "[spark.conf]\n" + settings
    s3.create_bucket("cdc-landing")
    config = load_config(_config(tmp_path, text))
    with pytest.raises(S3BucketNotFoundError, match=r"^warehouse s3a://missing-lake/warehouse"):
        spark_session.session_for(config, "t")


def test_a_submitted_driver_on_s3_needs_the_s3_jars_among_those_it_was_given() -> None:
    given = (
        "file:/x/.cache/jars/delta-spark_2.13-4.4.0.jar,file:/x/.cache/jars-s3/hadoop-aws-3.5.0.jar,"
        "spark://127.0.0.1:4040/jars/s3-2.35.4.jar,file:/x/.cache/jars-s3/dcp-cdc-s3-logstore.jar"
    )
    object_storage.check_submitted_s3_jars(given)  # all there: no error
    delta_only = given.split(",")[0]
    with pytest.raises(S3SetupError, match=r"without the S3 jars in spark\.jars") as caught:
        object_storage.check_submitted_s3_jars(delta_only)
    said = str(caught.value)
    assert "hadoop-aws-*.jar" in said and "dcp-cdc-s3-logstore.jar" in said
    assert "dcp-cdc spark-conf" in said
