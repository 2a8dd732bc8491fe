"""Configuration: invalid settings fail before Spark starts, naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcp_cdc.config import load_config
from dcp_cdc.errors import ConfigError
from dcp_cdc.naming import identifier

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["local.toml", "cluster.example.toml", "rehearsal.example.toml"])
def test_shipped_configurations_load(name: str) -> None:
    config = load_config(REPO / "conf" / name)
    assert config.buckets and config.landing and config.warehouse


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('warehouse = "w"\n[[buckets]]\nname = "b"\n', "landing: Field required"),
        ('landing = "l"\nwarehouse = "w"\nbuckets = []\n', "buckets: List should have at least 1"),
        ('landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b c"\n', r"buckets\[0\].name"),
        (
            'landing = "l"\nwarehouse = "w"\ncolour = 1\n[[buckets]]\nname = "b"\n',
            "colour: Extra inputs",
        ),
        (
            'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[ingest]\nchunk_bytes = 10\n',
            "ingest.chunk_bytes",
        ),
        ('landing = "l"\nwarehouse = "w"\n[[buckets]\n', "not valid TOML"),
        (
            'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[airflow]\npy_files = "x.zip"\n',
            r"airflow: .*py_files moved to \[spark\] py_files",
        ),
    ],
)
def test_invalid_configuration_names_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_missing_file_and_unknown_bucket(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    config = load_config(REPO / "conf" / "local.toml")
    with pytest.raises(ConfigError, match="'other' is not configured"):
        config.bucket("other")


def test_identifier_rule_is_readable_and_injective() -> None:
    assert identifier("airline") == "airline"
    assert identifier("travel-sample") == "travel_sample_a8560dff"
    assert identifier("orders%2026") == "orders_pct_2026_6070f28b"
    names = ["a-b", "a_b", "A_b", "a%b", "a.b", "a_pct_b", "ab", "ab\n"]
    assert len({identifier(n) for n in names}) == len(names)
    # a whole-name check: a final newline is no identifier character
    assert identifier("orders\n") == "orders__7580e611"


def test_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "c.toml").write_text(
        'landing = "../data/landing"\nwarehouse = "/abs/warehouse"\n'
        '[[buckets]]\nname = "a"\nlanding = "s3a://x/a"\n[[buckets]]\nname = "b"\nlanding = "b"\n'
    )
    config = load_config(conf / "c.toml")
    assert config.landing == str(tmp_path / "data" / "landing")
    assert config.warehouse == "/abs/warehouse"
    assert [b.landing for b in config.buckets] == ["s3a://x/a", str(conf / "b")]
    # overrides are the caller's: taken as given
    assert load_config(conf / "c.toml", warehouse="rel/w").warehouse == "rel/w"


def test_warehouse_on_object_storage_needs_a_shared_metastore(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('landing = "s3a://l"\nwarehouse = "s3a://w"\n[[buckets]]\nname = "b"\n')
    with pytest.raises(ConfigError, match=r"set spark\.metastore") as info:
        load_config(path)
    assert str(path) in str(info.value)
    path.write_text(
        'landing = "s3a://l"\nwarehouse = "s3a://w"\n[[buckets]]\nname = "b"\n'
        '[spark]\nmetastore = "thrift://hms:9083"\n'
    )
    assert load_config(path).spark.metastore == "thrift://hms:9083"


def test_airflow_and_maintenance_settings(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
        '[airflow]\nschedule = "*/15 * * * *"\nstart_date = 2026-03-01\nretries = 5\n'
        "[maintenance]\nvacuum_retention_hours = 24\n"
    )
    config = load_config(path)
    assert config.airflow.schedule == "*/15 * * * *"
    assert str(config.airflow.start_date) == "2026-03-01"
    assert (config.airflow.retries, config.airflow.catchup) == (5, False)
    assert config.maintenance.vacuum_retention_hours == 24
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[airflow]\nretries = -1\n'
    )
    with pytest.raises(ConfigError, match=r"airflow\.retries"):
        load_config(path)


def test_code_and_jars_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "c.toml"
    path.parent.mkdir()
    text = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[spark]\n'
    path.write_text(text + 'py_files = "../dist/code.zip"\njars_dir = "jars"\n')
    config = load_config(path)
    assert config.spark.py_files == str(tmp_path / "dist" / "code.zip")
    assert config.spark.jars_dir == str(tmp_path / "conf" / "jars")
    path.write_text(text + 'py_files = "s3a://artifacts/code.zip"\n')
    assert load_config(path).spark.py_files == "s3a://artifacts/code.zip"
    path.write_text(text)
    assert load_config(path).spark.py_files == "auto"


_PROJECTED = """landing = "l"
warehouse = "w"
[[buckets]]
name = "travel"
[[buckets.projections]]
collection = "inventory.airline"
columns = [
  { name = "city", path = "$.address.city" },
  { name = "price", path = "$.price", type = "Decimal(10, 2)" },
  { name = "first_tag", path = "$.tags[0]" },
]
"""


def test_projections_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(_PROJECTED)
    (projection,) = load_config(path).buckets[0].projections
    assert projection.scope_and_name == ("inventory", "airline")
    assert [(c.name, c.path, c.type) for c in projection.columns] == [
        ("city", "$.address.city", "string"),
        ("price", "$.price", "decimal(10,2)"),
        ("first_tag", "$.tags[0]", "string"),
    ]


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ('{ name = "key", path = "$.k" }', r"column 'key' of inventory.airline: the view has it"),
        (
            '{ name = "Price", path = "$.p" }',
            "column 'Price' of inventory.airline is declared twice",
        ),
        (
            '{ name = "x", path = "$.a\'b" }',
            r"projections\[0\]\.columns\[3\]\.path",
        ),  # no quote reaches the SQL
        ('{ name = "x", path = "a.b" }', r"projections\[0\]\.columns\[3\]\.path"),
        ('{ name = "x y", path = "$.a" }', r"projections\[0\]\.columns\[3\]\.name"),
        ('{ name = "x", path = "$.a", type = "map" }', "'map' is not a projection type"),
        ('{ name = "x", path = "$.a", type = "decimal(40, 2)" }', "needs 1 <= p <= 38"),
    ],
)
def test_a_bad_projection_column_is_named(tmp_path: Path, column: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(_PROJECTED.replace("\n]\n", f"\n  {column},\n]\n"))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_one_projection_per_collection(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    again = _PROJECTED.split("[[buckets.projections]]")[1]
    path.write_text(_PROJECTED + "[[buckets.projections]]" + again)
    with pytest.raises(ConfigError, match=r"more than one projection of inventory\.airline"):
        load_config(path)


@pytest.mark.parametrize(
    ("value", "kept", "not_kept"),
    [
        ("true", ("inventory", "airline"), None),
        ('["inventory.airline"]', ("inventory", "airline"), ("inventory", "route")),
        ("false", None, ("inventory", "airline")),
    ],
)
def test_history_for_every_collection_or_those_named(
    tmp_path: Path, value: str, kept: tuple[str, str] | None, not_kept: tuple[str, str] | None
) -> None:
    path = tmp_path / "h.toml"
    path.write_text(f'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\nhistory = {value}\n')
    bucket = load_config(path).buckets[0]
    assert kept is None or bucket.keeps_history(*kept)
    assert not_kept is None or not bucket.keeps_history(*not_kept)


def test_a_history_collection_without_its_scope_is_named(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text('landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\nhistory = ["x"]\n')
    with pytest.raises(ConfigError, match=r"buckets\[0\]\.history"):
        load_config(path)


_BUCKET = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'


def test_document_variant_is_off_unless_set(tmp_path: Path) -> None:
    """``[silver] document_variant``: off by default (no VARIANT column, no ``variantType``
    table feature for readers to know), on when set."""
    path = tmp_path / "v.toml"
    path.write_text(_BUCKET)
    assert load_config(path).silver.document_variant is False
    path.write_text(_BUCKET + "[silver]\ndocument_variant = true\n")
    assert load_config(path).silver.document_variant is True


def test_a_bad_document_variant_is_named(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(_BUCKET + '[silver]\ndocument_variant = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"silver\.document_variant"):
        load_config(path)


HEAD = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[follow]\nmetrics_host = "a b"\n', "follow.metrics_host"),
        (
            "[follow]\nunready_after_failed_batches = 5\nstop_after_failed_batches = 4\n",
            "follow: .*would stop before it is unready",
        ),
        ('[pushgateway]\nurl = "pushgateway:9091"\n', "pushgateway.url: .*expected http://"),
        ('[pushgateway]\njob = "dcp-cdc"\n', "pushgateway.job"),
        (
            '[follow]\nmetrics_port = 9464\n[buckets.capture]\nconnection_string = "couchbase://h"'
            '\nusername = "u"\npassword_env = "P"\nmetrics_port = 9464\n',
            r"buckets\[0\]\.capture\.metrics_port: 9464 on 127.0.0.1 is follow's too",
        ),
    ],
)
def test_metrics_settings_are_checked(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text(HEAD + text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_metrics_are_off_unless_set(tmp_path: Path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text(HEAD)
    config = load_config(path)
    assert config.follow.metrics_port is None and config.pushgateway.url is None
    path.write_text(HEAD + '[follow]\nmetrics_port = 9470\n[pushgateway]\nurl = "http://pg:9091"\n')
    config = load_config(path)
    assert (config.follow.metrics_port, config.follow.metrics_host) == (9470, "127.0.0.1")
    assert config.pushgateway.url == "http://pg:9091" and config.pushgateway.job == "dcp_cdc"
