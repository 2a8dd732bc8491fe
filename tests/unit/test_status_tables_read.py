"""How ``dcp-cdc status`` reads its small tables without a JVM (pipelines/status/tables_read.py):
where a table is, when the warehouse alone says so, the S3 options delta-rs gets, the rows
read with delta-rs (tables written here with ``deltalake``, locally and on a moto S3 server),
the typed error for a table that cannot be read, and the catalog asked only for a table the
warehouse does not have (no Spark: the catalog is a fake)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines.errors import TableReadError
from pipelines.lake.delta_rs import S3_TIMEOUTS, plain_types
from pipelines.status.read import tables_for
from pipelines.status.tables_read import (
    DeltaFiles,
    WarehouseThenCatalog,
    own_catalog,
    storage_options,
    warehouse_location,
)
from tests.support.ports import free_port
from tests.support.s3_server import MotoS3Server

TABLE = "silver.travel_sample_a8560dff__stream_state"
ROWS = pa.table(
    {
        "vbucket": pa.array([0, 1], pa.int32()),
        "consistent_seqno": pa.array([10, None], pa.int64()),
        "state": pa.array(['{"last_cas": 5}', None], pa.string()),
    }
)


def _config(warehouse: str, **spark: object) -> AppConfig:
    return AppConfig(
        landing="/landing", warehouse=warehouse, buckets=[BucketConfig(name="b")], spark=spark
    )


# --- where ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("warehouse", "location"),
    [
        ("/w/h", "/w/h/silver.db/travel_sample_a8560dff__stream_state"),
        ("/w/h/", "/w/h/silver.db/travel_sample_a8560dff__stream_state"),
        ("file:/w/h", "/w/h/silver.db/travel_sample_a8560dff__stream_state"),
        ("file:///w/h", "/w/h/silver.db/travel_sample_a8560dff__stream_state"),
        ("s3a://lake/wh/", "s3a://lake/wh/silver.db/travel_sample_a8560dff__stream_state"),
    ],
)
def test_a_table_is_in_its_layers_database_folder_of_the_warehouse(
    warehouse: str, location: str
) -> None:
    config = _config(warehouse, metastore="thrift://hms:9083")
    assert warehouse_location(config, TABLE) == location


@pytest.mark.parametrize(
    ("warehouse", "spark", "own"),
    [
        ("/w", {}, True),  # embedded Derby, or the Derby server serving it
        ("file:/w", {}, True),
        ("/w", {"metastore": "derby://127.0.0.1:1527"}, True),
        ("/w", {"metastore": "derby://127.0.0.1:1527/w/metastore_db"}, True),
        ("/w", {"metastore": "derby://127.0.0.1:1527/elsewhere/metastore_db"}, False),
        ("/w", {"metastore": "thrift://hms:9083"}, False),
        ("/w", {"conf": {"spark.hadoop.hive.metastore.uris": "thrift://hms:9083"}}, False),
        ("s3a://lake/wh", {"metastore": "thrift://hms:9083"}, False),
        ("s3a://lake/wh", {"metastore": "derby://10.0.0.1:1527/srv/metastore_db"}, False),
    ],
)
def test_the_warehouse_alone_says_where_its_tables_are_when_the_catalog_is_its_own(
    warehouse: str, spark: dict[str, object], own: bool
) -> None:
    config = _config(warehouse, **spark)
    assert own_catalog(config) is own
    kind = DeltaFiles if own else WarehouseThenCatalog
    assert isinstance(tables_for(config), kind)


def test_s3_options_come_from_the_s3a_settings() -> None:
    assert storage_options(_config("/w")) == {}
    conf = {
        "spark.hadoop.fs.s3a.endpoint": "minio:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK",
    }
    found = storage_options(_config("s3a://lake/wh", metastore="thrift://hms:9083", conf=conf))
    assert found == {
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        **S3_TIMEOUTS,
    }
    # nothing set: the AWS environment decides
    assert storage_options(_config("s3a://lake/wh", metastore="thrift://hms:9083")) == S3_TIMEOUTS


# --- read ------------------------------------------------------------------------------------


def test_the_columns_asked_for_are_read(tmp_path: Path) -> None:
    config = _config(str(tmp_path))
    write_deltalake(warehouse_location(config, TABLE), ROWS)
    found = DeltaFiles(config).read(TABLE, ["vbucket", "state"])
    assert found is not None
    assert found.schema == pa.schema([("vbucket", pa.int32()), ("state", pa.string())])
    assert sorted(found.to_pylist(), key=lambda r: r["vbucket"]) == [
        {"vbucket": 0, "state": '{"last_cas": 5}'},
        {"vbucket": 1, "state": None},
    ]


def test_a_table_not_there_or_whose_first_commit_is_not_written_yet_is_none(
    tmp_path: Path,
) -> None:
    config = _config(str(tmp_path))
    files = DeltaFiles(config)
    assert files.read(TABLE, ["vbucket"]) is None
    log = Path(warehouse_location(config, TABLE)) / "_delta_log"
    log.mkdir(parents=True)
    assert files.read(TABLE, ["vbucket"]) is None


def test_a_table_that_cannot_be_read_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    config = _config(str(tmp_path))
    location = warehouse_location(config, TABLE)
    write_deltalake(location, ROWS)
    with pytest.raises(TableReadError, match=rf"table {TABLE} at {location} cannot be read: "):
        DeltaFiles(config).read(TABLE, ["vbucket", "no_such_column"])
    (Path(location) / "_delta_log" / "00000000000000000000.json").write_text("{not json\n")
    with pytest.raises(TableReadError) as caught:
        DeltaFiles(config).read(TABLE, ["vbucket"])
    assert (caught.value.table, caught.value.location) == (TABLE, location)


def test_view_types_become_plain_ones() -> None:
    viewed = pa.table({"s": pa.array(["a"], pa.string_view()), "n": pa.array([1])})
    assert plain_types(viewed).schema == pa.schema([("s", pa.string()), ("n", pa.int64())])
    assert plain_types(ROWS) is ROWS


def test_a_table_on_s3_is_read_with_the_s3a_settings(tmp_path: Path) -> None:
    local = tmp_path / "t"
    write_deltalake(local, ROWS)
    with MotoS3Server(process=True) as s3:  # delta-rs holds the GIL while it waits
        s3.create_bucket("lake")
        config = _config("s3a://lake/wh", metastore="thrift://hms:9083", conf=s3.spark_conf())
        key = warehouse_location(config, TABLE).removeprefix("s3a://lake/")
        client = s3.client()
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            client.upload_file(str(f), "lake", f"{key}/{f.relative_to(local)}")
        files = DeltaFiles(config)
        found = files.read(TABLE, ["vbucket", "consistent_seqno"])
        assert found is not None and found.num_rows == 2
        assert files.read("bronze.b_ingest_log", ["status"]) is None


def test_an_s3_store_that_does_not_answer_is_a_typed_error_on_one_line() -> None:
    conf = {
        "spark.hadoop.fs.s3a.endpoint": f"http://127.0.0.1:{free_port()}",
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK",
    }
    config = _config("s3a://lake/wh", metastore="thrift://hms:9083", conf=conf)
    with pytest.raises(TableReadError) as caught:
        DeltaFiles(config).read(TABLE, ["vbucket"])
    message = str(caught.value)
    assert message.startswith(f"table {TABLE} at s3a://lake/wh/silver.db/")
    assert "Connection refused" in message and "\n" not in message and "\x1b" not in message


# --- the catalog, for a table the warehouse does not have --------------------------------------


class _Fake:
    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables
        self.asked: list[str] = []

    def read(self, table: str, columns: Sequence[str]) -> pa.Table | None:
        self.asked.append(table)
        found = self.tables.get(table)
        return None if found is None else found.select(list(columns))


def test_the_catalog_is_made_and_asked_only_for_a_table_the_warehouse_lacks() -> None:
    files = _Fake({TABLE: ROWS})
    catalog = _Fake({"quality.b_results": ROWS})
    made: list[int] = []

    def make() -> _Fake:
        made.append(1)
        return catalog

    tables = WarehouseThenCatalog(files, make)
    found = tables.read(TABLE, ["vbucket"])
    assert found is not None and found.column_names == ["vbucket"]
    assert (made, catalog.asked) == ([], [])
    assert tables.read("quality.b_results", ["state"]) is not None
    assert tables.read("bronze.b_ingest_log", ["status"]) is None
    assert made == [1]  # one catalog, made on first need
    assert catalog.asked == ["quality.b_results", "bronze.b_ingest_log"]
