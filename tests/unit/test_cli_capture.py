"""``dcp-cdc capture``: the configuration's capture section, a clean stop on SIGTERM, no Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest

from pipelines.app.cli import main
from tests.unit.test_cli import _probe

REPO = Path(__file__).resolve().parents[2]
HEAD = 'landing = "landing"\nwarehouse = "warehouse"\n[[buckets]]\nname = "travel-sample"\n'


def write_config(tmp_path: Path, connection_string: str | None) -> Path:
    text = HEAD
    if connection_string is not None:
        text += (
            "[buckets.capture]\n"
            f'connection_string = "{connection_string}"\n'
            'username = "Administrator"\npassword_env = "TEST_CB_PASSWORD"\n'
            "rotate_seconds = 0.5\nnoop_interval_s = 2\nconnect_timeout_s = 5\n"
        )
    path = tmp_path / "conf.toml"
    path.write_text(text)
    return path


def test_no_capture_section_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "--config", str(write_config(tmp_path, None))]) == 2
    assert "[buckets.capture]" in capsys.readouterr().err


def test_capture_imports_no_spark(tmp_path: Path) -> None:
    result, _ = _probe(["capture", "--help"], tmp_path)
    assert result == {"status": 0, "heavy": []}


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[dict[str, object]]:
    ports = tmp_path / "ports.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcp_cdc.simulator.server", "--nodes", "2", "--vbuckets", "8",
         "--docs", "200", "--ops", "400", "--pause", "0.05", "--port-file", str(ports)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ports.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "producer did not start"
            time.sleep(0.05)
        yield json.loads(ports.read_text())
    finally:
        proc.terminate()
        proc.wait(10)


def test_capture_until_now_then_follow_stopped_by_sigterm(
    tmp_path: Path, producer: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, str(producer["connection_string"]))
    monkeypatch.setenv("TEST_CB_PASSWORD", "password")
    out = StringIO()
    assert main(["capture", "--config", str(config), "--vbuckets", "0-3"], out) == 0
    assert "capture (until-now): 4 vbuckets" in out.getvalue()
    assert "vbuckets done: 4" in out.getvalue()
    checkpoint = json.loads(
        (
            tmp_path / "landing" / ".dcp-cdc-capture" / "travel-sample.agent.checkpoint.json"
        ).read_text()
    )
    assert sorted(checkpoint["vbuckets"]) == ["0", "1", "2", "3"]

    follow = subprocess.Popen(
        [sys.executable, "-m", "pipelines.app.cli", "capture", "--config", str(config), "--follow"],
        env={**os.environ, "PYTHONPATH": str(REPO), "TEST_CB_PASSWORD": "password"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    before = len(list((tmp_path / "landing").glob("*.dcpcap")))
    deadline = time.monotonic() + 30
    while len(list((tmp_path / "landing").glob("*.dcpcap"))) <= before:  # it is capturing
        assert follow.poll() is None and time.monotonic() < deadline, follow.stderr
        time.sleep(0.05)
    follow.send_signal(signal.SIGTERM)
    stdout, stderr = follow.communicate(timeout=30)
    assert follow.returncode == 0, stderr[-2000:]
    assert "capture (follow): 8 vbuckets" in stdout
    assert "password" not in stderr.replace("TEST_CB_PASSWORD", "")
    files = sorted((tmp_path / "landing").glob("*.dcpcap"))
    assert files and not list((tmp_path / "landing" / ".dcp-cdc-capture").glob("*.partial"))
