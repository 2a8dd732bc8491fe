"""``dcp-cdc status``'s stages on the agent's side, without Spark: the capture agent's
checkpoint (its own, or a default agent's in the landing), and the cluster's high seqnos
asked of the test producer (a child process) over real sockets; what cannot be read is a
note of the stage, never an error."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path

import pytest

from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.writer import CheckpointStore
from dcp_cdc.config import AppConfig, BucketConfig, load_config
from pipelines.status.agent_side import capture_stage, cluster_stage, not_asked
from tests.support.capture_harness import PASSWORD, PASSWORD_ENV, producer, write_config

STAMP = "2026-01-02T03:04:05.123456Z"


def _config(tmp_path: Path, connection_string: str = "couchbase://127.0.0.1:1") -> AppConfig:
    path = write_config(
        tmp_path / "conf.toml",
        landing=tmp_path / "landing",
        warehouse=tmp_path / "warehouse",
        bucket="orders",
        connection_string=connection_string,
    )
    return load_config(path)


def _commit(path: Path, bucket: str, seqnos: dict[int, int]) -> None:
    store = CheckpointStore(path, bucket=bucket, bucket_uuid=None)
    store.commit({vb: VbPosition(vb, s, 0xAB) for vb, s in seqnos.items()}, updated_at=STAMP)


def test_the_capture_is_the_agents_checkpoint(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (bucket,) = config.buckets
    checkpoint = tmp_path / "landing" / ".dcp-cdc-capture" / "orders.agent.checkpoint.json"
    stage = capture_stage(config, bucket)
    assert (stage.positions, stage.note) == (
        None,
        f"no checkpoint yet at {checkpoint} (dcp-cdc capture)",
    )
    _commit(checkpoint, "orders", {0: 12, 1: 7})
    stage = capture_stage(config, bucket)
    assert stage.positions == {0: 12, 1: 7} and stage.note is None
    assert stage.moved_at == dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


def test_a_checkpoint_that_cannot_be_read_is_a_note(tmp_path: Path) -> None:
    config = _config(tmp_path)
    checkpoint = tmp_path / "landing" / ".dcp-cdc-capture" / "orders.agent.checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text(json.dumps({"format": "other"}))
    stage = capture_stage(config, config.buckets[0])
    assert stage.positions is None
    assert stage.note is not None and stage.note.startswith(f"checkpoint {checkpoint} format")


def test_without_a_capture_section_the_default_agents_checkpoint_if_any(tmp_path: Path) -> None:
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(tmp_path / "warehouse"),
        buckets=[BucketConfig(name="demo")],
    )
    (bucket,) = config.buckets
    stage = capture_stage(config, bucket)
    assert (stage.positions, stage.note) == (None, "no [buckets.capture] section, no checkpoint")
    _commit(
        tmp_path / "landing" / ".dcp-cdc-capture" / "demo.agent.checkpoint.json", "demo", {3: 9}
    )
    stage = capture_stage(config, bucket)
    assert stage.positions == {3: 9}
    assert (
        stage.note == "no [buckets.capture] section: the default agent's checkpoint in the landing"
    )
    assert cluster_stage(config, bucket).note == (
        "not asked: no [buckets.capture] section names it"
    )
    assert not_asked("--no-cluster").note == "not asked (--no-cluster)"


def test_the_cluster_is_asked_with_the_capture_sections_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"bucket": "orders", "nodes": 2, "vbuckets": 8, "docs": 100, "ops": 0}
    with producer(tmp_path, scenario="basic", **options) as prod:
        config = _config(tmp_path, prod.info["connection_string"])
        (bucket,) = config.buckets
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
        assert cluster_stage(config, bucket).note == (
            f"not asked: capture password: the environment variable {PASSWORD_ENV} "
            "(password_env) is not set"
        )
        monkeypatch.setenv(PASSWORD_ENV, "not-" + PASSWORD)
        refused = cluster_stage(config, bucket)
        assert refused.positions is None and refused.note is not None
        assert refused.note.startswith("unreachable: ") and "authentication" in refused.note
        assert "not-" + PASSWORD not in refused.note
        monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
        stage = cluster_stage(config, bucket)
        prod.control("truth")
        summary = json.loads((prod.truth_out / "truth" / "summary.json").read_text())
        assert stage.positions == {v["vbucket"]: v["high_seqno"] for v in summary["vbuckets"]}
        assert stage.note is None and stage.moved_at is not None


def test_a_cluster_that_cannot_be_reached_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    config = _config(tmp_path, f"couchbase://127.0.0.1:{port}")
    stage = cluster_stage(config, config.buckets[0])
    assert stage.positions is None
    assert stage.note is not None and stage.note.startswith(
        f"unreachable: 127.0.0.1:{port}: no seed node answered: 127.0.0.1:{port}: cannot connect: "
    )
    assert "\n" not in stage.note
