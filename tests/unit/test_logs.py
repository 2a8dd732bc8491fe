"""Log lines (:mod:`dcp_cdc.logs`): the JSON format is one object per line with the record's
bucket, vbucket and run; levels filter; exceptions are serialized; no secret reaches a line in
either format; and a real command run with ``DCP_CDC_LOG_FORMAT=json`` writes only JSON log
lines on stderr."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc import logs
from dcp_cdc.config import AppConfig
from dcp_cdc.errors import ConfigError
from dcp_cdc.logs import (
    configure_logging,
    configure_logging_from,
    from_environment,
    log_context,
    register_secret,
)

REPO = Path(__file__).resolve().parents[2]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
log = logging.getLogger("dcp_cdc.test_logs")


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    """Each test logs through its own setup and knows only its own secrets (an earlier test
    in the process may have read a capture password); the root logger is put back."""
    handlers, level = logging.root.handlers[:], logging.root.level
    secrets = set(logs._secrets)
    logs._secrets.clear()
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
    logs._secrets.clear()
    logs._secrets.update(secrets)


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _json(level: str = "INFO") -> io.StringIO:
    out = io.StringIO()
    configure_logging(level, "json", out)
    return out


def test_a_json_line_has_time_level_logger_message() -> None:
    out = _json()
    log.info("ingested %d files", 3)
    (line,) = _lines(out)
    assert list(line) == ["time", "level", "logger", "message"]
    assert TIME.match(line["time"]), line["time"]
    assert line["level"] == "INFO"
    assert line["logger"] == "dcp_cdc.test_logs"
    assert line["message"] == "ingested 3 files"


def test_the_context_gives_bucket_vbucket_and_run_id() -> None:
    out = _json()
    with log_context(bucket="travel-sample"):
        log.info("one")
        with log_context(run_id="20240501T120000Z-0a1b2c3d", vbucket=7):
            log.info("two")
        log.info("three")
    log.info("four")
    lines = _lines(out)
    assert [line.get("bucket") for line in lines] == ["travel-sample"] * 3 + [None]
    assert lines[1]["run_id"] == "20240501T120000Z-0a1b2c3d" and lines[1]["vbucket"] == 7
    assert "run_id" not in lines[2] and "vbucket" not in lines[2]


def test_extra_gives_the_fields_and_wins_over_the_context() -> None:
    out = _json()
    with log_context(bucket="travel-sample", run_id="outer"):
        log.info("placed", extra={"vbucket": 1023, "run_id": "inner"})
    (line,) = _lines(out)
    assert (line["bucket"], line["vbucket"], line["run_id"]) == ("travel-sample", 1023, "inner")


def test_asyncio_tasks_inherit_the_context() -> None:
    out = _json()

    async def task() -> None:
        log.warning("from a task")

    async def main() -> None:
        with log_context(bucket="beer-sample"):
            await asyncio.create_task(task())

    asyncio.run(main())
    (line,) = _lines(out)
    assert line["bucket"] == "beer-sample"


def test_levels_below_the_configured_one_are_not_written() -> None:
    out = _json("WARNING")
    log.debug("no")
    log.info("no")
    log.warning("yes")
    log.error("yes")
    assert [line["level"] for line in _lines(out)] == ["WARNING", "ERROR"]


def test_configuring_again_replaces_the_handler() -> None:
    first = _json()
    second = _json()
    log.info("once")
    assert first.getvalue() == "" and len(_lines(second)) == 1


def test_an_exception_is_serialized_with_its_type_and_traceback() -> None:
    out = _json()
    try:
        raise ConfigError("warehouse: must not be empty")
    except ConfigError:
        log.exception("the run failed")
    try:
        raise ValueError("bad")
    except ValueError:
        log.error("plain", exc_info=True)
    first, second = _lines(out)
    assert first["message"] == "the run failed"
    assert first["exc_type"] == "dcp_cdc.errors.ConfigError"
    assert first["exc"].startswith("Traceback (most recent call last):")
    assert first["exc"].endswith("ConfigError: warehouse: must not be empty")
    assert second["exc_type"] == "ValueError"


def test_non_ascii_is_kept_and_odd_objects_do_not_raise() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    out = _json()
    # ours alone: pytest's own capture handler raises where such a record fails it
    logging.root.handlers[:] = [h for h in logging.root.handlers if isinstance(h, logs._Stderr)]
    log.info("bucket %s: %s", "bücher-€", Unprintable())
    log.info("a format that does not fit %d", "x")
    log.info("an object: %s", object(), extra={"bucket": Unprintable()})
    assert "bücher-€" in out.getvalue()  # not \\u escaped
    first, second, third = _lines(out)
    assert first["message"].startswith("bucket %s: %s ('bücher-€', <")  # format and arguments
    assert second["message"] == "a format that does not fit %d ('x',)"
    assert third["bucket"] == "<Unprintable that cannot be printed>"


def test_the_text_format_is_unchanged() -> None:
    out = io.StringIO()
    configure_logging("INFO", "text", out)
    with log_context(bucket="travel-sample"):
        log.info("ingested %d files", 3)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO dcp_cdc.test_logs: ingested 3 files\n",
        out.getvalue(),
    )


# --- no secret -------------------------------------------------------------------------

SECRET = "Sëcret-7f3a9c1e"


def _conf_with_keys() -> AppConfig:
    return AppConfig.model_validate(
        {
            "landing": "l",
            "warehouse": "w",
            "buckets": [{"name": "b"}],
            "spark": {
                "conf": {
                    "spark.hadoop.fs.s3a.access.key": "AKIAEXAMPLEKEY0001",
                    "spark.hadoop.fs.s3a.secret.key": SECRET,
                    "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
                }
            },
        }
    )


def _known_by(source: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``SECRET`` known to the process the way ``source`` does; the values to look for."""
    if source == "registered":  # as the capture settings do with the password they read
        register_secret(SECRET)
    elif source == "spark_conf":
        configure_logging_from(_conf_with_keys())
        return [SECRET, "AKIAEXAMPLEKEY0001"]
    elif source == "aws_env":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return [SECRET]


def _log_everywhere(secret: str) -> None:
    log.warning("the password is %s", secret)
    log.warning(f"inline {secret} too")
    try:
        raise RuntimeError(f"login refused for {secret}")
    except RuntimeError:
        log.exception("capture failed")
    log.warning("in extra", extra={"bucket": secret, "run_id": secret})
    log.warning("as a pair password=%s, or spark.hadoop.fs.s3a.secret.key=%s", secret, secret)


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("source", ["registered", "spark_conf", "aws_env"])
def test_a_known_secret_never_reaches_a_line(
    fmt: logs.LogFormat, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    out = io.StringIO()
    configure_logging("INFO", fmt, out)
    secrets = _known_by(source, monkeypatch)
    configure_logging("INFO", fmt, out)  # configure_logging_from set up its own stream
    for secret in secrets:
        _log_everywhere(secret)
    text = out.getvalue()
    assert text.count("capture failed") == len(secrets)
    assert "RuntimeError: login refused for ***" in text.replace("\\n", "\n")
    for secret in secrets:
        assert secret not in text
        assert json.dumps(secret)[1:-1] not in text  # nor JSON-escaped


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("connect password=hunter2 now", "connect password=*** now"),
        (
            "--conf spark.hadoop.fs.s3a.secret.key=wJalr/K7MDENG+bPxRfiCY --conf x=1",
            "--conf spark.hadoop.fs.s3a.secret.key=*** --conf x=1",
        ),
        ("secret='x y z'; next", "secret=***; next"),
        ("AWS_SESSION_TOKEN=FwoGZXIvYXdz&more", "AWS_SESSION_TOKEN=***&more"),
        ("""{'password': 'hunter2', "token": "t0k"}""", """{'password': '***', "token": "***"}"""),
        ("couchbases://admin:hunter2@db.example:11207", "couchbases://admin:***@db.example:11207"),
        ("capture password: the environment variable X is not set", None),  # no value: as is
        ("spark.hadoop.fs.s3a.access.key and .secret.key in [spark.conf]", None),
        ("password_env=TEST_CB_PASSWORD", None),  # names that only mention a secret
        ("fs.s3a.aws.credentials.provider=org.example.Provider", None),
    ],
)
def test_secret_shaped_pairs_are_masked_unregistered(
    fmt: logs.LogFormat, message: str, shown: str | None
) -> None:
    out = io.StringIO()
    configure_logging("INFO", fmt, out)
    log.warning(message)
    written = out.getvalue()
    expected = shown or message
    if fmt == "json":
        assert _lines(out)[0]["message"] == expected
    else:
        assert written.endswith(f": {expected}\n")


def test_only_settings_named_as_secrets_are_registered() -> None:
    logs.register_conf_secrets(
        {
            "spark.hadoop.javax.jdo.option.ConnectionPassword": "derby-pw-1",
            "spark.hadoop.fs.s3a.session.token": "tok-2",
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.example.Provider",
            "spark.security.credentials.hive.enabled": "true",
            "spark.hadoop.fs.s3a.delegation.token.binding": "org.example.Binding",
        }
    )
    assert logs.redact("derby-pw-1 tok-2 org.example.Provider true org.example.Binding") == (
        "*** *** org.example.Provider true org.example.Binding"
    )


def test_the_capture_password_is_registered_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dcp_cdc.agent.settings import settings_from_config

    monkeypatch.setenv("TEST_LOGS_PASSWORD", SECRET)
    config = AppConfig.model_validate(
        {
            "landing": str(tmp_path),
            "warehouse": "w",
            "buckets": [
                {
                    "name": "b",
                    "capture": {
                        "connection_string": "couchbase://127.0.0.1",
                        "username": "u",
                        "password_env": "TEST_LOGS_PASSWORD",
                    },
                }
            ],
        }
    )
    assert SECRET not in logs._known_secrets()
    settings_from_config(config, config.buckets[0])
    assert logs.redact(f"pw {SECRET}.") == "pw ***."


# --- settings ----------------------------------------------------------------------------


def test_the_environment_wins_over_the_given_settings() -> None:
    assert from_environment("INFO", "text", {}) == ("INFO", "text")
    env = {logs.LEVEL_ENV: "debug", logs.FORMAT_ENV: "JSON"}
    assert from_environment("INFO", "text", env) == ("DEBUG", "json")
    with pytest.raises(ConfigError, match=r"DCP_CDC_LOG_FORMAT: expected text or json, got 'xml'"):
        from_environment("INFO", "text", {logs.FORMAT_ENV: "xml"})
    with pytest.raises(ConfigError, match=r"DCP_CDC_LOG_LEVEL: expected one of DEBUG, INFO"):
        from_environment("INFO", "text", {logs.LEVEL_ENV: "loud"})


def test_a_configuration_sets_the_format_and_the_level_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    base = {"landing": "l", "warehouse": "w", "buckets": [{"name": "b"}]}
    configure_logging("WARNING", "text")
    configure_logging_from(AppConfig.model_validate({**base, "log_format": "json"}))
    assert logs.current_format() == "json"
    assert logging.root.level == logging.WARNING  # no log_level: the entry point's stays
    configure_logging_from(AppConfig.model_validate(base), "INFO")
    assert (logs.current_format(), logging.root.level) == ("text", logging.INFO)
    configure_logging_from(AppConfig.model_validate({**base, "log_level": "ERROR"}), "INFO")
    assert logging.root.level == logging.ERROR
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    monkeypatch.setenv(logs.LEVEL_ENV, "DEBUG")
    configure_logging_from(AppConfig.model_validate({**base, "log_level": "ERROR"}))
    assert (logs.current_format(), logging.root.level) == ("json", logging.DEBUG)


# --- a real command ----------------------------------------------------------------------

PASSWORD = "Pässwörd-4c9e"


def test_a_command_writes_json_log_lines_with_its_bucket(tmp_path: Path) -> None:
    """``dcp-cdc capture --follow`` of a cluster that goes away: its warnings (the lost
    connections, the attempts to reconnect) and its final error are JSON lines naming the
    bucket, with no password in them."""
    ports = tmp_path / "ports.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    producer = subprocess.Popen(
        [sys.executable, "-m", "dcp_cdc.simulator.server", "--nodes", "2", "--vbuckets", "4",
         "--docs", "50", "--ops", "100", "--pause", "0.05", "--port-file", str(ports),
         "--users", f"Administrator:{PASSWORD}"],
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ports.exists():
            assert producer.poll() is None and time.monotonic() < deadline, "no producer"
            time.sleep(0.05)
        config = tmp_path / "conf.toml"
        config.write_text(
            'landing = "landing"\nwarehouse = "warehouse"\n[[buckets]]\nname = "travel-sample"\n'
            "[buckets.capture]\n"
            f'connection_string = "{json.loads(ports.read_text())["connection_string"]}"\n'
            'username = "Administrator"\npassword_env = "TEST_CB_PASSWORD"\n'
            "rotate_seconds = 0.5\nconnect_timeout_s = 1\nreconnect_timeout_s = 1\n"
        )
        capture = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.app.cli",
                "capture",
                "--config",
                str(config),
                "--follow",
            ],
            env={**env, "TEST_CB_PASSWORD": PASSWORD, logs.FORMAT_ENV: "json"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not list((tmp_path / "landing").glob("*.dcpcap")):  # it is capturing
                assert capture.poll() is None and time.monotonic() < deadline, capture.stderr
                time.sleep(0.05)
        finally:
            producer.send_signal(signal.SIGTERM)  # the cluster goes away
            producer.wait(10)
        _, stderr = capture.communicate(timeout=60)
    finally:
        producer.kill()
        producer.wait(10)
    assert capture.returncode == 2, stderr[-3000:]
    lines = [json.loads(line) for line in stderr.splitlines()]  # every line is one object
    assert lines, "no log line"
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
        assert TIME.match(line["time"])
    warnings = [line for line in lines if line["level"] == "WARNING"]
    assert warnings and all(line["bucket"] == "travel-sample" for line in warnings)
    assert lines[-1]["level"] == "ERROR"
    assert lines[-1]["message"].startswith("dcp-cdc capture: error: ")
    assert PASSWORD not in stderr
