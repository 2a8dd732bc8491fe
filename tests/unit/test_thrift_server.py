"""The Thrift (JDBC) server's settings: a server reachable from the network checks who
connects, or says loudly that it does not; nothing is launched before that is settled
(no JVM needed)."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import pipelines.catalog.settings
from dcp_cdc.config import (
    AppConfig,
    BucketConfig,
    SparkConfig,
    ThriftConfig,
    is_loopback,
    load_config,
    thrift_settings,
)
from dcp_cdc.errors import ConfigError
from pipelines.app import cli
from pipelines.lake.spark_session import (
    JARS_DIR_ENV,
    LOCAL_LOG_STORE_JAR,
    thrift_hiveconf,
    thrift_server_launch,
)

BASE = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
SECRET = "s3-secret-never-logged"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("db.example.com", False),  # a name is not resolved: it may reach anywhere
        ("localhost.example.com", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            'host = "0.0.0.0"',
            r"thrift: .*authentication: host '0.0.0.0' is not loopback.*allow_unauthenticated",
        ),
        ('authentication = "ldap"', r"thrift: .*ldap_url: required"),
        ('authentication = "ldap"\nldap_url = "http://x"', r"ldap_url: expected ldap://"),
        (
            'authentication = "kerberos"\nkerberos_principal = "hive/_HOST@R"',
            r"kerberos_principal, kerberos_keytab: both required",
        ),
        ('ldap_url = "ldap://x"', r"ldap_url: set, but authentication is 'none'"),
        (
            'authentication = "ldap"\nldap_url = "ldap://x"\nallow_unauthenticated = true',
            r"allow_unauthenticated: set, but authentication is 'ldap'",
        ),
        ('authentication = "basic"', r"thrift.authentication: Input should be"),
        ("port = 0", r"thrift.port"),
    ],
)
def test_invalid_thrift_section_names_file_and_field(
    tmp_path: Path, section: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"{BASE}[thrift]\n{section}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "section",
    [
        'host = "0.0.0.0"\nallow_unauthenticated = true',
        'host = "0.0.0.0"\nauthentication = "ldap"\nldap_url = "ldaps://d:636"\n'
        'ldap_base_dn = "ou=people,dc=x"',
        'host = "10.0.0.5"\nauthentication = "kerberos"\nkerberos_principal = "hive/_HOST@R"\n'
        'kerberos_keytab = "hive.keytab"',
        'host = "::1"',
    ],
)
def test_valid_thrift_sections(tmp_path: Path, section: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"{BASE}[thrift]\n{section}\n")
    thrift = load_config(path).thrift
    if thrift.kerberos_keytab:  # relative to the file, like every path in it
        assert thrift.kerberos_keytab == str(tmp_path / "hive.keytab")


def _config(tmp_path: Path, **thrift: object) -> AppConfig:
    return AppConfig(
        landing=str(tmp_path / "l"),
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b")],
        spark=SparkConfig(conf={"spark.hadoop.fs.s3a.secret.key": SECRET}),
        thrift=ThriftConfig(**thrift),  # type: ignore[arg-type]
    )


def test_command_line_overrides_are_validated_again(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert thrift_settings(config, host=None, port=None).host == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"thrift: .*authentication: host '0.0.0.0'"):
        thrift_settings(config, host="0.0.0.0", port=None)
    opened = thrift_settings(config, host="0.0.0.0", port=12000, allow_unauthenticated=True)
    assert (opened.host, opened.port, opened.allow_unauthenticated) == ("0.0.0.0", 12000, True)
    ldap = _config(tmp_path, authentication="ldap", ldap_url="ldap://d")
    assert thrift_settings(ldap, host="0.0.0.0").authentication == "ldap"
    with pytest.raises(ConfigError, match="allow_unauthenticated: set, but authentication"):
        thrift_settings(ldap, host="0.0.0.0", allow_unauthenticated=True)


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark_2.13-4.4.0.jar", LOCAL_LOG_STORE_JAR):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))
    return folder


def _hiveconf(arguments: list[str]) -> dict[str, str]:
    pairs = [arguments[i + 1] for i, a in enumerate(arguments) if a == "--hiveconf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_launch_carries_the_ldap_settings(tmp_path: Path, jars: Path) -> None:
    config = _config(
        tmp_path,
        host="0.0.0.0",
        port=10001,
        authentication="ldap",
        ldap_url="ldaps://dir.example.com:636",
        ldap_base_dn="ou=people,dc=example,dc=com",
        ldap_domain="example.com",
    )
    conf, arguments = thrift_server_launch(config, config.thrift, tmp_path / "p.conf")
    assert arguments[:5] == [
        "--properties-file",
        str(tmp_path / "p.conf"),
        "--class",
        "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2",
        "spark-internal",
    ]
    assert _hiveconf(arguments) == {
        "hive.server2.thrift.port": "10001",
        "hive.server2.thrift.bind.host": "0.0.0.0",
        "hive.server2.authentication": "LDAP",
        "hive.server2.authentication.ldap.url": "ldaps://dir.example.com:636",
        "hive.server2.authentication.ldap.baseDN": "ou=people,dc=example,dc=com",
        "hive.server2.authentication.ldap.Domain": "example.com",
    }
    # the command line (visible to every user of the machine) carries no [spark] conf value
    assert SECRET not in " ".join(arguments)
    assert conf["spark.hadoop.fs.s3a.secret.key"] == SECRET  # the 0600 properties file does
    assert conf["spark.sql.warehouse.dir"] == str(tmp_path / "w")
    assert "spark.hadoop.hadoop.security.authentication" not in conf


def test_the_launch_carries_the_kerberos_settings(tmp_path: Path, jars: Path) -> None:
    config = _config(
        tmp_path,
        host="10.0.0.5",
        authentication="kerberos",
        kerberos_principal="hive/_HOST@EXAMPLE.COM",
        kerberos_keytab="/etc/security/hive.keytab",
    )
    conf, arguments = thrift_server_launch(config, config.thrift, "p.conf")
    hive = _hiveconf(arguments)
    assert hive["hive.server2.authentication"] == "KERBEROS"
    assert hive["hive.server2.authentication.kerberos.principal"] == "hive/_HOST@EXAMPLE.COM"
    assert hive["hive.server2.authentication.kerberos.keytab"] == "/etc/security/hive.keytab"
    assert conf["spark.hadoop.hadoop.security.authentication"] == "kerberos"
    assert thrift_hiveconf(ThriftConfig())["hive.server2.authentication"] == "NONE"


class Launch:
    """``subprocess.call`` of the Thrift server, recorded instead of run."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.properties: list[tuple[str, int]] = []  # (text, mode) while the server runs

        self.sharing: list[str] = []  # warehouses whose catalog was shared while serving

    @contextlib.contextmanager
    def shared_catalog(self, config: AppConfig, jars: Path) -> Iterator[None]:
        self.sharing.append(config.warehouse)
        yield

    def __call__(self, command: list[str], *, pass_fds: tuple[int, ...] = ()) -> int:
        assert self.sharing, "the Thrift server launched with its catalog not shared"
        self.commands.append(command)
        path = command[command.index("--properties-file") + 1]
        self.properties.append((Path(path).read_text(), stat.S_IMODE(os.stat(path).st_mode)))
        return 0


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> Launch:
    recorded = Launch()
    monkeypatch.setattr(subprocess, "call", recorded)
    # the metastore server it would start for the local warehouse: tests/e2e run a real one
    monkeypatch.setattr(pipelines.catalog.settings, "shared_catalog", recorded.shared_catalog)
    return recorded


def _serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, *args: str
) -> tuple[int, str, str]:
    path = tmp_path / "c.toml"
    path.write_text(f"{BASE}[spark.conf]\n'spark.hadoop.fs.s3a.secret.key' = '{SECRET}'\n{section}")
    status = cli.main(["thrift-server", "--config", str(path), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_network_bind_without_authentication_fails_before_spark(
    tmp_path: Path, jars: Path, launch: Launch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _serve(tmp_path, capsys, "", "--host", "0.0.0.0")
    assert status == 2 and launch.commands == []
    assert "thrift-server: error: ConfigError: invalid Thrift server settings: thrift: " in err
    assert "authentication: host '0.0.0.0' is not loopback" in err and "--insecure-open" in err
    status, _, err = _serve(tmp_path, capsys, '[thrift]\nhost = "0.0.0.0"\n')
    assert status == 2 and launch.commands == [] and "thrift: Value error, authentication" in err


def test_insecure_open_serves_with_a_loud_warning(
    tmp_path: Path, jars: Path, launch: Launch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _serve(tmp_path, capsys, "", "--host", "0.0.0.0", "--insecure-open")
    assert status == 0 and len(launch.commands) == 1
    assert "WARNING: jdbc:hive2://0.0.0.0:10000/ has NO AUTHENTICATION" in err
    assert _hiveconf(launch.commands[0])["hive.server2.authentication"] == "NONE"
    # loopback, the default: served without the warning
    status, out, err = _serve(tmp_path, capsys, "")
    assert status == 0 and "WARNING" not in err
    assert "on jdbc:hive2://127.0.0.1:10000/ (no authentication: any user name" in out


def test_an_ldap_server_is_launched_with_its_settings_and_no_secret_shown(
    tmp_path: Path, jars: Path, launch: Launch, capsys: pytest.CaptureFixture[str]
) -> None:
    section = (
        '[thrift]\nhost = "0.0.0.0"\nport = 10123\nauthentication = "ldap"\n'
        'ldap_url = "ldap://127.0.0.1:3890"\nldap_base_dn = "ou=people,dc=dcp,dc=test"\n'
    )
    status, out, err = _serve(tmp_path, capsys, section, "--port", "10124")
    assert status == 0 and "WARNING" not in err
    assert "users checked against ldap://127.0.0.1:3890" in out
    (command,) = launch.commands
    hive = _hiveconf(command)
    assert (hive["hive.server2.thrift.port"], hive["hive.server2.authentication"]) == (
        "10124",
        "LDAP",
    )
    assert hive["hive.server2.authentication.ldap.baseDN"] == "ou=people,dc=dcp,dc=test"
    ((text, mode),) = launch.properties
    assert SECRET in text and mode == 0o600  # credentials of [spark] conf: the owner's file only
    assert SECRET not in out + err + " ".join(command)
    assert not Path(command[command.index("--properties-file") + 1]).exists()  # removed after


def test_sigterm_ends_the_command_through_its_cleanup() -> None:
    import signal

    from pipelines.app.commands.thrift_server import terminate_through_cleanup

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit) as info, terminate_through_cleanup():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # the handler raises before this returns
        finally:
            cleaned.append(True)
    assert info.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def test_beeline_connects_to_the_configured_server_by_default(tmp_path: Path) -> None:
    from pipelines.app.cli import build_parser
    from pipelines.app.commands.beeline import beeline_arguments

    def arguments(config: AppConfig, *argv: str) -> list[str]:
        args = build_parser("beeline").parse_args(["beeline", *argv])
        return beeline_arguments(args, config.thrift)

    config = _config(tmp_path, port=10123)
    assert arguments(config, "-n", "me", "-e", "SELECT 1", "--", "--silent=true") == [
        "-u", "jdbc:hive2://127.0.0.1:10123/", "-n", "me", "-e", "SELECT 1", "--silent=true",
    ]  # fmt: skip
    everywhere = _config(tmp_path, host="0.0.0.0", allow_unauthenticated=True)
    assert arguments(everywhere, "-w", "pw", "-f", "q.sql") == [
        "-u", "jdbc:hive2://127.0.0.1:10000/", "-w", "pw", "-f", "q.sql",
    ]  # fmt: skip
    assert arguments(config, "-u", "jdbc:hive2://h:1/")[:2] == ["-u", "jdbc:hive2://h:1/"]


def test_beeline_runs_without_the_venv_on_path(tmp_path: Path) -> None:
    """Pyspark's ``bin/beeline`` in the venv's ``bin`` needs the venv's Python on ``PATH``
    (else "PySpark was not found", exit 127); ``dcp-cdc beeline`` runs without it. Nothing
    listens at the port: beeline starts, says so and exits 1."""
    import sys

    from tests.support.ports import free_port

    port = free_port()
    path = tmp_path / "c.toml"
    path.write_text(f"{BASE}[thrift]\nport = {port}\n")
    repo = Path(__file__).resolve().parents[2]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.app.cli",
            "beeline",
            "--config",
            str(path),
            "-e",
            "SELECT 1",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"jdbc:hive2://127.0.0.1:{port}/" in done.stderr
    assert "Connection refused" in done.stderr
