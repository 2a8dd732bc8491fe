"""The catalog service setting (``[spark] metastore``) and what a session is given for it: a
malformed address fails with the setting's name, a Derby server's address becomes the Hive
client's JDO settings, and an address where nothing listens fails before Spark starts, naming
the setting and the address (no JVM: the check comes first)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from dcp_cdc.config import load_config, metastore_address
from dcp_cdc.errors import ConfigError
from pipelines.app import cli
from pipelines.catalog.settings import catalog_service, check_reachable, hive_client_conf
from pipelines.errors import MetastoreError, MetastoreUnreachableError
from pipelines.lake.spark_session import JARS_DIR_ENV, LOCAL_LOG_STORE_JAR, launch_conf
from tests.support.ports import free_port

BASE = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(BASE + text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("value", "endpoints", "database"),
    [
        ("thrift://hms:9083", (("hms", 9083),), None),
        ("thrift://a:1,thrift://b:2", (("a", 1), ("b", 2)), None),
        ("derby://127.0.0.1:1527", (("127.0.0.1", 1527),), None),
        (
            "derby://127.0.0.1:1527/data/w/metastore_db",
            (("127.0.0.1", 1527),),
            "/data/w/metastore_db",
        ),
        ("derby://[::1]:1527", (("::1", 1527),), None),
    ],
)
def test_valid_addresses(
    value: str, endpoints: tuple[tuple[str, int], ...], database: str | None
) -> None:
    address = metastore_address(value)
    assert (address.endpoints, address.database) == (endpoints, database)
    assert str(address) == value


@pytest.mark.parametrize(
    "value",
    [
        "hms:9083",  # no scheme
        "thrift://hms",  # no port
        "mysql://db:3306",  # not a catalog service dcp-cdc speaks
        "derby://127.0.0.1:99999",  # no such port
        "derby://a:1,derby://b:2",  # one Derby server
        "thrift://a:1,derby://b:2",
        "thrift://hms:9083/db",  # a Hive metastore address has no path
        "derby://127.0.0.1:1527/",
    ],
)
def test_a_malformed_address_names_the_setting(tmp_path: Path, value: str) -> None:
    path = _config(tmp_path, f'[spark]\nmetastore = "{value}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{path}: invalid configuration: spark.metastore: " in message
    assert "expected thrift://HOST:PORT" in message and repr(value) in message


def test_a_derby_server_for_object_storage_must_name_its_database(tmp_path: Path) -> None:
    text = '[spark]\nmetastore = "derby://127.0.0.1:1527"\n'
    path = tmp_path / "c.toml"
    path.write_text(BASE.replace('"w"', '"s3a://b/w"') + text, encoding="utf-8")
    with pytest.raises(ConfigError, match="names no database and warehouse 's3a://b/w'"):
        load_config(path)
    path.write_text(
        path.read_text().replace("1527", "1527/srv/catalog/metastore_db"), encoding="utf-8"
    )
    assert load_config(path).spark.metastore == "derby://127.0.0.1:1527/srv/catalog/metastore_db"


def test_a_derby_server_is_reached_through_the_hive_clients_jdo_settings(tmp_path: Path) -> None:
    jars = [tmp_path / "delta-spark_2.13-4.4.0.jar", tmp_path / "derbyclient-10.16.1.1.jar"]
    conf = hive_client_conf("derby://127.0.0.1:1530", tmp_path / "w", jars)
    assert conf == {
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby://127.0.0.1:1530/{tmp_path / 'w' / 'metastore_db'};create=true"
        ),
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.ClientDriver",
        "spark.driver.extraClassPath": str(tmp_path / "derbyclient-10.16.1.1.jar"),
    }
    named = hive_client_conf("derby://127.0.0.1:1530/srv/m", tmp_path / "w", jars)
    assert named["spark.hadoop.javax.jdo.option.ConnectionURL"].endswith(":1530//srv/m;create=true")
    assert hive_client_conf("thrift://h:9083", tmp_path, []) == {
        "spark.hadoop.hive.metastore.uris": "thrift://h:9083"
    }
    with pytest.raises(MetastoreError, match=r"derbyclient-<version>\.jar is not among"):
        hive_client_conf("derby://127.0.0.1:1530", tmp_path / "w", jars[:1])


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark_2.13-4.4.0.jar", "derbyclient-10.16.1.1.jar", LOCAL_LOG_STORE_JAR):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))
    return folder


def test_a_launcher_is_given_the_configured_derby_server(tmp_path: Path, jars: Path) -> None:
    config = load_config(_config(tmp_path, '[spark]\nmetastore = "derby://127.0.0.1:1531"\n'))
    conf = launch_conf(config, "app", master=None)  # no check: a launcher may start first
    url = conf["spark.hadoop.javax.jdo.option.ConnectionURL"]
    assert url == f"jdbc:derby://127.0.0.1:1531/{tmp_path / 'w' / 'metastore_db'};create=true"
    assert str(jars / "derbyclient-10.16.1.1.jar") in conf["spark.driver.extraClassPath"]
    assert "-Dderby.system.home" not in conf["spark.driver.extraJavaOptions"]


@pytest.mark.parametrize("scheme", ["derby", "thrift"])
def test_nothing_listening_fails_before_spark_naming_setting_and_address(
    tmp_path: Path, jars: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    address = f"{scheme}://127.0.0.1:{free_port()}"
    path = _config(tmp_path, f'[spark]\nmetastore = "{address}"\n')
    started = time.monotonic()
    status = cli.main(["sql", "--config", str(path), "SHOW TABLES"])
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(
        f"dcp-cdc sql: error: MetastoreUnreachableError: [spark] metastore = '{address}': "
        f"nothing accepts connections at {address} (connection refused): "
    )
    assert ("dcp-cdc metastore start" in err) == (scheme == "derby")
    assert elapsed < 20  # a refused connection, not a JVM's retries
    assert not (tmp_path / "w" / "metastore_db").exists()  # no embedded catalog instead


def test_the_check_takes_any_endpoint_that_answers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        check_reachable(f"thrift://127.0.0.1:{free_port()},thrift://127.0.0.1:{port}")
        assert catalog_service(Path("/nowhere"), f"thrift://127.0.0.1:{port}") == (
            f"thrift://127.0.0.1:{port}"
        )
    with pytest.raises(MetastoreUnreachableError):
        check_reachable(f"thrift://127.0.0.1:{free_port()}", timeout=1)


def test_the_message_says_why_each_endpoint_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused endpoint fails at once and says so; only a silent one waits the timeout, and
    the message says how long it waited."""
    silent = free_port()
    real = socket.create_connection

    def connect(address: tuple[str, int], timeout: float) -> socket.socket:
        if address[1] == silent:
            raise TimeoutError("timed out")
        return real(address, timeout=timeout)

    monkeypatch.setattr("pipelines.catalog.server.socket.create_connection", connect)
    refused = free_port()
    metastore = f"thrift://127.0.0.1:{refused},thrift://127.0.0.1:{silent}"
    with pytest.raises(MetastoreUnreachableError) as info:
        check_reachable(metastore, timeout=3)
    assert f"(127.0.0.1:{refused} connection refused; 127.0.0.1:{silent} no answer within 3 s)" in (
        str(info.value)
    )
    assert "waited" not in str(info.value)


def test_no_server_recorded_means_embedded(tmp_path: Path) -> None:
    assert catalog_service(tmp_path, None) is None
    (tmp_path / "metastore_db.server.json").write_text(
        '{"pid": 1, "host": "127.0.0.1", "port": 1, "database": "x", "started": "t"}'
    )
    assert catalog_service(tmp_path, None) is None  # pid 1 is no Derby server
    assert catalog_service("s3a://b/w", None) is None


@pytest.mark.parametrize(
    ("section", "args", "expected"),
    [
        ('[spark]\nmetastore = "thrift://hms:9083"\n', [], "is a Hive metastore, which dcp-cdc"),
        ('[spark]\nmetastore = "derby://127.0.0.1:1527"\n', ["--port", "1600"], "--port 1600"),
    ],
)
def test_the_metastore_command_refuses_what_it_cannot_serve(
    tmp_path: Path,
    jars: Path,
    capsys: pytest.CaptureFixture[str],
    section: str,
    args: list[str],
    expected: str,
) -> None:
    path = _config(tmp_path, section)
    assert cli.main(["metastore", "start", "--config", str(path), *args]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "w" / "metastore_db.server.json").exists()


def test_a_server_on_an_outside_address_is_refused(
    tmp_path: Path, jars: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, '[spark]\nmetastore = "derby://10.1.2.3:1527"\n')
    assert cli.main(["metastore", "start", "--config", str(path)]) == 2
    assert "listens on loopback only (it checks no password)" in capsys.readouterr().err
