"""``[buckets.capture]``: validated before any socket opens; the password never shows."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

from dcp_cdc.config import load_config
from dcp_cdc.errors import ConfigError

SECRET = "s3cr3t-Σ-pa55"
HEAD = 'landing = "landing"\nwarehouse = "warehouse"\n[[buckets]]\nname = "travel"\n'
GOOD = 'connection_string = "couchbase://n1,n2:12000"\nusername = "dcp"\npassword_env = "CB_PW"\n'


def write(tmp_path: Path, capture: str, head: str = HEAD) -> Path:
    path = tmp_path / "conf.toml"
    path.write_text(f"{head}[buckets.capture]\n{capture}")
    return path


def test_a_capture_section_loads_with_its_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    [bucket] = config.buckets
    capture = bucket.capture
    assert capture is not None
    assert capture.seed_nodes == (("n1", 11210), ("n2", 12000))
    assert capture.tls is False and capture.vbucket_range() is None
    assert (capture.buffer_bytes, capture.noop_interval_s) == (16 << 20, 120)
    assert (capture.rotate_bytes, capture.rotate_seconds) == (64 << 20, 300.0)
    assert (capture.agent_id, capture.connect_timeout_s, capture.collections) == (
        "agent",
        10.0,
        None,
    )
    assert (capture.metrics_port, capture.metrics_host) == (None, "127.0.0.1")
    assert (capture.lag_poll_s, capture.stall_after_s) == (10.0, 300.0)
    dirs = config.capture_dirs(bucket)
    assert dirs.landing == tmp_path / "landing"
    assert dirs.staging == dirs.state == tmp_path / "landing" / ".dcp-cdc-capture"


def test_tls_ranges_collections_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    text = (
        'connection_string = "couchbases://[::1],10.0.0.2:11999,db.example.com"\n'
        'username = "dcp"\npassword_file = "secrets/pw"\ntls_ca_file = "ca.pem"\n'
        'vbuckets = "512-1023"\ncollections = ["inventory.hotel", "_default._default"]\n'
        'state_dir = "state"\nagent_id = "east_2"\n'
    )
    config = load_config(write(tmp_path, text))
    capture = config.buckets[0].capture
    assert capture is not None
    assert capture.tls is True
    assert capture.seed_nodes == (("::1", 11207), ("10.0.0.2", 11999), ("db.example.com", 11207))
    assert capture.vbucket_range() == (512, 1023)
    assert capture.password_file == str(tmp_path / "secrets" / "pw")
    assert capture.tls_ca_file == str(tmp_path / "ca.pem")
    assert config.capture_dirs(config.buckets[0]).state == tmp_path / "state"


@pytest.mark.parametrize(
    ("capture", "field", "message"),
    [
        (GOOD.replace("couchbase://", "http://"), "connection_string", "expected couchbase://"),
        (GOOD.replace("n2:12000", "n2:70000"), "connection_string", "port 70000"),
        (GOOD.replace("n2:12000", "n2:8091"), "connection_string", "cluster manager's HTTP"),
        (GOOD.replace("n1,n2", "n1,,n2"), "connection_string", "not a host"),
        (GOOD + 'password_file = "pw"\n', "password_env, password_file", "exactly one"),
        (GOOD.replace('password_env = "CB_PW"\n', ""), "password_env, password_file", "exactly"),
        (GOOD + 'tls_ca_file = "ca.pem"\n', "tls_ca_file", "not couchbases://"),
        (
            GOOD.replace("couchbase://", "couchbases://") + 'tls_ca_file = "none.pem"\n',
            "tls_ca_file",
            "none.pem is not a file",
        ),
        (GOOD + 'vbuckets = "5-2"\n', "vbuckets", "A <= B"),
        (GOOD + 'vbuckets = "0-1024"\n', "vbuckets", "<= 1023"),
        (GOOD + 'vbuckets = "all"\n', "vbuckets", "like '0-511'"),
        (GOOD + 'collections = ["hotel"]\n', "collections", "'scope.collection'"),
        (GOOD + "collections = []\n", "collections", "at least one"),
        (GOOD + 'agent_id = "a b"\n', "agent_id", "should match pattern"),
        (GOOD + "rotate_bytes = 10\n", "rotate_bytes", "greater than or equal to 4096"),
        (GOOD + "buffer_bytes = 1\n", "buffer_bytes", "greater than or equal"),
        (GOOD + "noop_interval_s = 0\n", "noop_interval_s", "greater than or equal"),
        (GOOD + "colour = 1\n", "colour", "Extra inputs"),
        (GOOD + "metrics_port = 0\n", "metrics_port", "greater than or equal to 1"),
        (GOOD + 'metrics_host = "a b"\n', "metrics_host", "an IP address or a host name"),
        (GOOD + "lag_poll_s = 0\n", "lag_poll_s", "greater than or equal"),
        (GOOD + "stall_after_s = 0\n", "stall_after_s", "greater than or equal"),
    ],
)
def test_a_bad_value_names_the_field_and_the_file(
    tmp_path: Path, capture: str, field: str, message: str
) -> None:
    path = write(tmp_path, capture)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert str(path) in text
    where = "buckets[0].capture" + ("" if "," in field else f".{field}")
    assert where in text and field in text and message in text, text


MTLS = (
    'connection_string = "couchbases://n1"\ntls_ca_file = "ca.pem"\n'
    'tls_cert_file = "tls/client.pem"\ntls_key_file = "tls/client.key"\n'
)


def _tls_files(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir(exist_ok=True)
    for name in ("ca.pem", "tls/client.pem", "tls/client.key"):
        (tmp_path / name).write_text("-----BEGIN-----\n")


def test_a_client_certificate_takes_no_password_and_no_user(tmp_path: Path) -> None:
    """Mutual TLS: the nodes authenticate the user the certificate maps to; the settings
    carry the files (relative to the configuration's folder) and no password is read."""
    from dcp_cdc.agent.settings import settings_from_config

    _tls_files(tmp_path)
    config = load_config(write(tmp_path, MTLS))
    capture = config.buckets[0].capture
    assert capture is not None and capture.client_certificate and capture.username is None
    assert capture.tls_cert_file == str(tmp_path / "tls" / "client.pem")
    assert capture.tls_key_file == str(tmp_path / "tls" / "client.key")
    settings = settings_from_config(config, config.buckets[0])
    assert (settings.username, settings.password) == ("", "")
    assert settings.tls_cert_file == tmp_path / "tls" / "client.pem"
    assert settings.tls_key_file == tmp_path / "tls" / "client.key"
    assert settings.client_certificate
    with pytest.raises(ConfigError, match="a client certificate, tls_cert_file, authenticates"):
        capture.password()
    named = load_config(write(tmp_path, MTLS + 'username = "dcp"\n')).buckets[0].capture
    assert named is not None and named.username == "dcp"


@pytest.mark.parametrize(
    ("capture", "where", "message"),
    [
        (MTLS.replace('tls_key_file = "tls/client.key"\n', ""), "", "set both"),
        (MTLS.replace('tls_cert_file = "tls/client.pem"\n', ""), "", "set both"),
        (
            MTLS.replace("couchbases://", "couchbase://").replace('tls_ca_file = "ca.pem"\n', ""),
            ".tls_cert_file",
            "not couchbases://",
        ),
        (MTLS.replace("client.key", "none.key"), ".tls_key_file", "none.key is not a file"),
        (MTLS.replace("client.pem", "none.pem"), ".tls_cert_file", "none.pem is not a file"),
        (MTLS + 'password_env = "CB_PW"\n', "", "not used with a client certificate"),
        (MTLS + 'password_file = "pw"\n', "", "password_env, password_file: not used"),
        (GOOD.replace('username = "dcp"\n', ""), "", "username: required"),
    ],
)
def test_client_certificate_settings_are_checked(
    tmp_path: Path, capture: str, where: str, message: str
) -> None:
    _tls_files(tmp_path)
    path = write(tmp_path, capture)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert str(path) in text and f"buckets[0].capture{where}" in text and message in text, text


def test_agents_of_several_buckets_listen_on_their_own_metrics_ports(tmp_path: Path) -> None:
    def two(first: str, second: str) -> Path:
        path = tmp_path / "two.toml"
        path.write_text(
            f"{HEAD}[buckets.capture]\n{GOOD}{first}"
            f'[[buckets]]\nname = "beer"\n[buckets.capture]\n{GOOD}{second}'
        )
        return path

    config = load_config(two("metrics_port = 9464\n", "metrics_port = 9465\n"))
    assert [b.capture.metrics_port for b in config.buckets if b.capture] == [9464, 9465]
    load_config(two('metrics_port = 9464\nmetrics_host = "10.0.0.1"\n', "metrics_port = 9464\n"))
    for other in ("", 'metrics_host = "::"\n'):
        with pytest.raises(ConfigError, match=r"buckets\[1\]\.capture\.metrics_port: 9464 on"):
            load_config(
                two(
                    'metrics_port = 9464\nmetrics_host = "0.0.0.0"\n',
                    f"metrics_port = 9464\n{other}",
                )
            )


def test_capture_needs_a_local_or_s3_landing(tmp_path: Path) -> None:
    head = HEAD.replace('"landing"', '"gs://lake/landing"')
    with pytest.raises(
        ConfigError, match=r"buckets\[0\]\.capture: landing 'gs://lake/landing' is neither"
    ):
        load_config(write(tmp_path, GOOD, head=head))
    with pytest.raises(ConfigError, match=r"buckets\[0\]\.capture\.staging_dir: only for an s3"):
        load_config(write(tmp_path, GOOD + 'staging_dir = "stage"\n'))
    with pytest.raises(ConfigError, match=r"buckets\[0\]\.capture\.state_dir: 'hdfs://x/y'"):
        load_config(write(tmp_path, GOOD + 'state_dir = "hdfs://x/y"\n'))


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_an_s3_landing_keeps_the_checkpoint_in_the_store(tmp_path: Path, scheme: str) -> None:
    from dcp_cdc.agent.settings import settings_from_config

    head = HEAD.replace('"landing"', f'"{scheme}://lake/cdc/landing/"')
    head = head.replace(
        "[[buckets]]",
        '[spark.conf]\n"spark.hadoop.fs.s3a.endpoint" = '
        '"127.0.0.1:9000"\n"spark.hadoop.fs.s3a.connection.ssl.enabled" = "false"'
        '\n"spark.hadoop.fs.s3a.secret.key" = "' + SECRET + '"\n[[buckets]]',
    )
    config = load_config(write(tmp_path, GOOD, head=head))
    dirs = config.capture_dirs(config.buckets[0])
    assert dirs.landing == f"{scheme}://lake/cdc/landing/"
    assert dirs.state == f"{scheme}://lake/cdc/landing/.dcp-cdc-capture"
    assert dirs.staging.is_absolute() and "dcp-cdc-staging" in str(dirs.staging)
    staged = load_config(write(tmp_path, GOOD + 'staging_dir = "stage"\n', head=head))
    assert staged.capture_dirs(staged.buckets[0]).staging == tmp_path / "stage"
    monkey = pytest.MonkeyPatch()
    monkey.setenv("CB_PW", "pw")
    try:
        settings = settings_from_config(config, config.buckets[0])
    finally:
        monkey.undo()
    assert settings.checkpoint_path == (
        f"{scheme}://lake/cdc/landing/.dcp-cdc-capture/travel.agent.checkpoint.json"
    )
    assert settings.s3 is not None and settings.s3.endpoint_url == "http://127.0.0.1:9000"
    assert SECRET not in repr(settings) and SECRET not in repr(settings.s3)


def _everything_shown(config_or_error: object) -> str:
    if isinstance(config_or_error, BaseException):
        return "".join(traceback.format_exception(config_or_error)) + repr(config_or_error)
    return repr(config_or_error) + str(config_or_error)


@pytest.mark.parametrize(
    "capture",
    [
        GOOD + f'password = "{SECRET}"\n',
        GOOD.replace('password_env = "CB_PW"', f'password_env = "{SECRET}"'),
        GOOD.replace("couchbase://n1", f"couchbase://dcp:{SECRET}@n1"),
        GOOD + f'pasword = "{SECRET}"\n',
    ],
)
def test_a_secret_written_in_the_file_is_refused_without_being_shown(
    tmp_path: Path, capture: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, capture))
    assert SECRET not in _everything_shown(info.value)
    if "password =" in capture:
        assert "password_env" in str(info.value) and "password_file" in str(info.value)
        assert "never written in the configuration" in str(info.value)


def test_the_password_is_read_at_use_time_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CB_PW", raising=False)
    config = load_config(write(tmp_path, GOOD))  # loads without the secret around
    capture = config.buckets[0].capture
    assert capture is not None
    with pytest.raises(
        ConfigError, match=r"environment variable CB_PW \(password_env\) is not set"
    ):
        capture.password()
    monkeypatch.setenv("CB_PW", SECRET)
    assert capture.password() == SECRET
    for shown in (_everything_shown(config), config.model_dump_json(), _everything_shown(capture)):
        assert SECRET not in shown
    monkeypatch.setenv("CB_PW", "")
    with pytest.raises(ConfigError, match="CB_PW is empty"):
        capture.password()


def test_a_password_file_loses_one_trailing_newline(tmp_path: Path) -> None:
    text = GOOD.replace('password_env = "CB_PW"', 'password_file = "pw"')
    capture = load_config(write(tmp_path, text)).buckets[0].capture
    assert capture is not None
    with pytest.raises(
        ConfigError, match=re.escape(f"password_file {tmp_path / 'pw'} not found")
    ) as info:
        capture.password()
    pw = tmp_path / "pw"
    for content, expected in (
        (SECRET + "\n", SECRET),
        (SECRET + "\r\n", SECRET),
        (SECRET + "\n\n", SECRET + "\n"),
        (" " + SECRET, " " + SECRET),
    ):
        pw.write_text(content, encoding="utf-8", newline="")
        assert capture.password() == expected
    pw.write_bytes(b"\xff" + SECRET.encode())
    with pytest.raises(ConfigError, match="is not UTF-8 text") as info:
        capture.password()
    pw.write_text("\n")
    with pytest.raises(ConfigError, match="is empty") as info:
        capture.password()
    assert SECRET not in _everything_shown(info.value)


def test_the_agent_takes_the_configurations_parse_of_the_connection_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dcp_cdc.agent import settings as agent_settings
    from dcp_cdc.agent.settings import CaptureSettings, settings_from_config

    monkeypatch.setenv("CB_PW", SECRET)
    config = load_config(write(tmp_path, GOOD))
    bucket = config.buckets[0]
    assert bucket.capture is not None

    def no_second_parse(text: str) -> None:
        raise AssertionError(f"{text!r} parsed again")

    monkeypatch.setattr(agent_settings, "parse_connection_string", no_second_parse)
    settings = settings_from_config(config, bucket)
    assert settings.cluster is bucket.capture.connection
    assert (settings.metrics_port, settings.metrics_host) == (None, "127.0.0.1")
    assert (settings.lag_poll_s, settings.stall_after_s) == (10.0, 300.0)
    assert settings.cluster.seeds == (("n1", 11210), ("n2", 12000))
    monkeypatch.undo()
    # settings built by hand (tests, the demo) are parsed when they are made
    by_hand = CaptureSettings.into(
        tmp_path, connection_string="couchbases://h1", bucket="b", username="u", password="p"
    )
    assert by_hand.cluster.tls and by_hand.cluster.seeds == (("h1", 11207),)
    with pytest.raises(ConfigError, match="not a host"):
        CaptureSettings.into(
            tmp_path, connection_string="couchbase://h1:x:y", bucket="b", username="u", password="p"
        )
