"""The capture agent on an object store: an S3 API server (moto's, on 127.0.0.1) holds the
landing and the checkpoint; the test DCP producer runs in the same event loop.

What must hold, as with a local folder (docs/capture.md): a file is visible whole or not at
all; a checkpoint never covers frames that are not in a published file, so a failure between
the upload and the checkpoint replays frames (which the readers dedupe) and loses none; two
writers of one checkpoint are refused, not silently merged; a store that goes away is a
typed error, never a checkpoint ahead of the files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.landing_store import open_landing
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.s3_store import S3Landing, S3Options
from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.agent.writer import CheckpointStore
from dcp_cdc.capture import iter_capture
from dcp_cdc.config import BucketConfig, load_config
from dcp_cdc.errors import CheckpointConflictError, ObjectStoreError
from dcp_cdc.events import Deletion, Mutation, StreamRequest
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.capture_harness import (
    PASSWORD,
    PASSWORD_ENV,
    USER,
    agent_command,
    agent_env,
    assert_captures_equal_truth,
    assert_landing_whole,
    in_process_settings,
    producer,
)
from tests.support.capture_harness import captured_seqnos as captured
from tests.support.capture_harness import truth_seqnos as truth
from tests.support.s3_agent_server import SECRET_KEY, S3Server, s3_server

PREFIX = "couchbase/travel"
CHECKPOINT_KEY = f"{PREFIX}/.dcp-cdc-capture/travel-sample.agent.checkpoint.json"


def s3_settings(tmp: Path, s3: S3Server, connection_string: str, **changes: Any) -> CaptureSettings:
    landing = f"s3a://{s3.bucket}/{PREFIX}"
    return in_process_settings(
        tmp,
        connection_string,
        landing=landing,
        staging=tmp / "staging",
        state_dir=f"{landing}/.dcp-cdc-capture",
        s3=dataclasses.replace(s3.options, max_attempts=2, connect_timeout_s=1.0),
        **changes,
    )


def stream_starts(folder: Path) -> dict[int, int]:
    """vbucket -> the lowest start seqno its stream was asked from, in ``folder``'s files."""
    starts: dict[int, int] = {}
    for path in sorted(folder.glob("*.dcpcap")):
        for event in iter_capture(path):
            if isinstance(event, StreamRequest):
                vb = event.header.vbucket
                starts[vb] = min(starts.get(vb, event.start_seqno), event.start_seqno)
    return starts


def frame_counts(folder: Path) -> Counter[tuple[int, int]]:
    """(vbucket, by_seqno) of every change in ``folder``'s files, counted."""
    return Counter(
        (event.header.vbucket, event.by_seqno)
        for path in sorted(folder.glob("*.dcpcap"))
        for event in iter_capture(path)
        if isinstance(event, (Mutation, Deletion))
    )


def test_capture_into_s3_then_resume_from_its_checkpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=16)
        with s3_server() as s3:
            async with ProducerServer(config, nodes=2) as server:
                s = s3_settings(tmp_path, s3, server.connection_string)
                first = await asyncio.wait_for(capture(s), 30)
                highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
                assert {vb: p.seqno for vb, p in first.positions.items()} == highs
                landed = [k for k in s3.keys(PREFIX) if k.endswith(".dcpcap")]
                assert sorted(str(f) for f in first.files) == [
                    f"s3a://{s3.bucket}/{k}" for k in landed
                ]
                assert CHECKPOINT_KEY in s3.keys(PREFIX)
                assert not list(s.staging.iterdir())  # uploaded, then deleted
                one = s3.download(PREFIX, tmp_path / "one")
                assert assert_landing_whole(one) == len(landed)
                assert captured(one) == truth(server, tmp_path / "t1")

                await server.run_workload(600, batch=100)
                second = await asyncio.wait_for(capture(s), 30)
                highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
                assert {vb: p.seqno for vb, p in second.positions.items()} == highs
                new = s3.download(PREFIX, tmp_path / "new")
                for path in one.glob("*.dcpcap"):
                    (new / path.name).unlink()
                # resumed from the S3 checkpoint: every stream asked from where run 1 ended
                assert stream_starts(new) == {vb: p.seqno for vb, p in first.positions.items()}
                everything = s3.download(PREFIX, tmp_path / "all")
                assert captured(everything) == truth(server, tmp_path / "t2")

    asyncio.run(scenario())


def test_a_second_writer_of_the_checkpoint_is_refused(tmp_path: Path) -> None:
    with s3_server() as s3:
        uri = f"s3://{s3.bucket}/{CHECKPOINT_KEY}"

        def store() -> CheckpointStore:
            return CheckpointStore(uri, bucket="b", bucket_uuid="u1", s3=s3.options)

        a, b = store(), store()
        assert a.load() == b.load() == {}
        a.commit({0: VbPosition(0, 10, 7)})
        with pytest.raises(CheckpointConflictError, match="If-None-Match") as first:
            b.commit({0: VbPosition(0, 99, 7)})  # both started from nothing: B is second
        assert first.value.location == uri and uri in str(first.value)

        c = store()
        assert c.load() == {0: VbPosition(0, 10, 7)}
        c.commit({1: VbPosition(1, 5, 8)})
        with pytest.raises(CheckpointConflictError, match="If-Match on ETag"):
            a.commit({0: VbPosition(0, 11, 7)})  # A's ETag is not the object's any more
        assert store().load() == {0: VbPosition(0, 10, 7), 1: VbPosition(1, 5, 8)}
        c.commit({0: VbPosition(0, 12, 7)})  # the owner goes on
        assert store().load()[0].seqno == 12


class Killed(Exception):
    """The agent dying after a file's upload, before the checkpoint that covers it."""


def test_a_failure_between_upload_and_checkpoint_replays_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=8)
        with s3_server() as s3:
            async with ProducerServer(config, nodes=2) as server:
                s = s3_settings(tmp_path, s3, server.connection_string, rotate_bytes=4096)
                await asyncio.wait_for(capture(s), 30)
                await server.run_workload(800, batch=100)

                changes_uploaded = asyncio.Event()
                real_publish, real_commit = S3Landing.publish, CheckpointStore.commit

                def publish(self: S3Landing, staged: Path, name: str) -> str:
                    has_changes = any(isinstance(e, Mutation) for e in iter_capture(staged))
                    uri = real_publish(self, staged, name)
                    if has_changes:
                        changes_uploaded.set()
                    return uri

                def dying(self: CheckpointStore, *args: Any, **kwargs: Any) -> None:
                    if changes_uploaded.is_set():
                        raise Killed("after the upload, before the checkpoint")
                    real_commit(self, *args, **kwargs)

                monkeypatch.setattr(S3Landing, "publish", publish)
                monkeypatch.setattr(CheckpointStore, "commit", dying)
                with pytest.raises(Killed):
                    await asyncio.wait_for(capture(s), 30)
                monkeypatch.setattr(CheckpointStore, "commit", real_commit)
                monkeypatch.setattr(S3Landing, "publish", real_publish)
                kept = CheckpointStore(
                    s.checkpoint_path, bucket=s.bucket, bucket_uuid=None, s3=s.s3
                ).load()
                at_kill = s3.download(PREFIX, tmp_path / "at-kill")
                seen = {p.name for p in at_kill.glob("*.dcpcap")}

                done = await asyncio.wait_for(capture(s), 30)
                highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
                assert {vb: p.seqno for vb, p in done.positions.items()} == highs
                landing = s3.download(PREFIX, tmp_path / "all")
                assert assert_landing_whole(landing) == len(list(landing.glob("*.dcpcap")))
                resumed = tmp_path / "resumed"
                resumed.mkdir()
                for path in landing.glob("*.dcpcap"):
                    if path.name not in seen:
                        path.rename(resumed / path.name)
                # the last run asked from the kept checkpoint, below what the dead run had
                # uploaded: those frames are in the landing twice, and read once
                assert stream_starts(resumed) == {vb: p.seqno for vb, p in kept.items()}
                for path in resumed.glob("*.dcpcap"):
                    path.rename(landing / path.name)
                assert max(frame_counts(landing).values()) == 2  # replayed, never lost
                assert captured(landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_the_store_going_away_is_a_typed_error_never_a_checkpoint_ahead(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=300, ops=0, vbuckets=8)
        with s3_server() as s3:
            port = int(s3.endpoint.rsplit(":", 1)[1])
            async with ProducerServer(config, nodes=2) as server:
                s = s3_settings(tmp_path, s3, server.connection_string)
                await asyncio.wait_for(capture(s), 30)
                stop = asyncio.Event()
                follow = asyncio.create_task(capture(s, mode="follow", stop=stop))
                work = asyncio.create_task(server.run_workload(3000, batch=50, pause_s=0.02))
                await asyncio.sleep(0.8)
                s3.stop()  # files rotate every 0.3 s: the next upload finds no server
                with pytest.raises(ObjectStoreError, match="does not answer") as info:
                    await asyncio.wait_for(follow, 60)
                assert s3.endpoint in str(info.value) and "spark.hadoop.fs.s3a.endpoint" in str(
                    info.value
                )
                assert SECRET_KEY not in str(info.value)
                await work
                with s3_server(port=port) as again:  # moto keeps the objects in this process
                    again.bucket = s3.bucket
                    done = await asyncio.wait_for(capture(s), 30)
                    highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
                    assert {vb: p.seqno for vb, p in done.positions.items()} == highs
                    # a checkpoint ahead of the files would have skipped frames: none missing
                    landing = again.download(PREFIX, tmp_path / "all")
                    assert captured(landing) == truth(server, tmp_path / "t")

    asyncio.run(scenario())


def test_store_problems_are_typed_and_name_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with s3_server() as s3:
        fast = dataclasses.replace(s3.options, max_attempts=1, connect_timeout_s=1.0)
        anonymous = dataclasses.replace(fast, access_key=None, secret_key=None)
        with pytest.raises(ObjectStoreError, match="no usable credentials") as info:
            open_landing(f"s3://{s3.bucket}/x", anonymous).check()
        assert info.value.setting is not None and "AWS_ACCESS_KEY_ID" in info.value.setting

        with pytest.raises(ObjectStoreError, match="'no-such-bucket' does not exist") as info:
            open_landing("s3://no-such-bucket/x", fast).check()
        assert info.value.location == "s3://no-such-bucket/x"

        port = int(s3.endpoint.rsplit(":", 1)[1])
    gone = dataclasses.replace(fast, endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(ObjectStoreError, match="does not answer") as info:
        open_landing("s3a://lake/landing", gone).check()
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text and "spark.hadoop.fs.s3a.endpoint" in text
    assert SECRET_KEY not in text and SECRET_KEY not in repr(gone)


def test_a_large_file_goes_up_in_parts(tmp_path: Path) -> None:
    with s3_server() as s3:
        options = dataclasses.replace(s3.options, multipart_bytes=5 << 20, part_bytes=5 << 20)
        landing = open_landing(f"s3://{s3.bucket}/big", options)
        staged = tmp_path / "f.dcpcap.partial"
        body = bytes(range(256)) * ((6 << 20) // 256)
        staged.write_bytes(body)
        assert landing.publish(staged, "f.dcpcap") == f"s3://{s3.bucket}/big/f.dcpcap"
        got = s3.client().get_object(Bucket=s3.bucket, Key="big/f.dcpcap")["Body"].read()
        assert got == body and not staged.exists()


def test_s3_options_from_spark_settings() -> None:
    options = S3Options.from_spark_conf(
        {
            "spark.hadoop.fs.s3a.endpoint": "minio.local:9000",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": "AK",
            "spark.hadoop.fs.s3a.secret.key": "SK-secret",
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        }
    )
    assert options.endpoint_url == "http://minio.local:9000"
    assert (options.access_key, options.region, options.path_style) == ("AK", "eu-west-1", True)
    assert "SK-secret" not in repr(options)
    assert S3Options.from_spark_conf({}).endpoint_url is None


def write_s3_config(tmp: Path, s3: S3Server, connection_string: str, **capture: Any) -> Path:
    """A configuration whose landing is ``s3a://<bucket>/PREFIX`` on ``s3``, the endpoint and
    keys in ``[spark.conf]``, staging in ``<tmp>/staging``."""
    conf = "\n".join(f'"{k}" = "{v}"' for k, v in s3.spark_conf.items())
    more = "".join(f"{k} = {json.dumps(v)}\n" for k, v in capture.items())
    path = tmp / "conf.toml"
    path.write_text(
        f'landing = "s3a://{s3.bucket}/{PREFIX}"\nwarehouse = "{tmp / "warehouse"}"\n'
        f"[spark.conf]\n{conf}\n"
        f'[[buckets]]\nname = "travel-sample"\n[buckets.capture]\n'
        f'connection_string = "{connection_string}"\nusername = "{USER}"\n'
        f'password_env = "{PASSWORD_ENV}"\nstaging_dir = "staging"\nrotate_seconds = 0.3\n{more}'
    )
    return path


def test_the_capture_command_lands_in_s3_and_bronze_lists_it(tmp_path: Path) -> None:
    """``dcp-cdc capture`` with ``landing = "s3a://..."`` and the endpoint in ``[spark.conf]``;
    then the landing's reader (bronze's) lists and reads the same files, and only them."""
    from pipelines.app.cli import main
    from pipelines.bronze.landing import check_landing, list_captures, read_header

    with s3_server() as s3, producer(tmp_path, nodes=2, vbuckets=8, docs=200, ops=0) as prod:
        landing = f"s3a://{s3.bucket}/{PREFIX}"
        config = write_s3_config(tmp_path, s3, prod.info["connection_string"])
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as env:
            env.setenv(PASSWORD_ENV, PASSWORD)
            assert main(["capture", "--config", str(config)], out) == 0
        assert "capture (until-now): 8 vbuckets" in out.getvalue()
        keys = s3.keys(PREFIX)
        assert CHECKPOINT_KEY in keys and not list((tmp_path / "staging").iterdir())

        app = load_config(config)
        check_landing(app, app.buckets)
        files, skipped = list_captures(landing, app.spark.conf)
        assert skipped == []
        assert [f.path for f in files] == [
            f"{landing.split('/' + PREFIX)[0]}/{k}" for k in keys if k.endswith(".dcpcap")
        ]
        assert {read_header(f, app.spark.conf).bucket for f in files} == {"travel-sample"}


def test_follow_modes_agent_process_captures_into_s3(tmp_path: Path) -> None:
    """``run --follow``'s agent (a child process) with an S3 landing: it follows until
    stopped, and follow mode reads the lag from the checkpoint object."""
    import threading
    import time

    from pipelines.app.demo import LoopThread
    from pipelines.follow.agent import AgentProcess, captured_seqnos
    from pipelines.follow.progress import BucketProgress

    sim = SimConfig(docs=60, ops=0, vbuckets=4)
    served: list[ProducerServer] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        async with ProducerServer(sim, nodes=2) as server:
            served.append(server)
            started.set()
            await halt.wait()

    producer = LoopThread("the test producer", serve)
    producer.start()
    try:
        assert started.wait(30)
        server = served[0]
        with s3_server() as s3:
            settings = s3_settings(tmp_path, s3, server.connection_string, rotate_seconds=0.2)
            progress = BucketProgress(
                BucketConfig(name=settings.bucket), settings.checkpoint_path, s3=settings.s3
            )
            assert progress.lag() is None  # no checkpoint object yet
            agent = AgentProcess(settings)
            agent.start()
            highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
            deadline = time.monotonic() + 60
            seqnos: dict[int, int] = {}
            while seqnos != highs and time.monotonic() < deadline:
                agent.check()
                time.sleep(0.2)
                seqnos = captured_seqnos(settings.checkpoint_path, settings.bucket, settings.s3)
            agent.stop(timeout=30)
            assert seqnos == highs
            assert progress.lag() == (sum(highs.values()), len(highs))
            assert any(k.endswith(".dcpcap") for k in s3.keys(PREFIX))
    finally:
        producer.stop()


KILLS = int(os.environ.get("DCP_CDC_S3_KILLS", "2"))
"""SIGKILLs of the agent while it uploads: 2 in ``make test``, 20 in ``make test-long``."""


def test_kill_9_of_the_agent_while_it_uploads_loses_nothing(tmp_path: Path) -> None:
    """``dcp-cdc capture --follow`` into S3, killed at random moments (mid-upload, between an
    upload and its checkpoint, ...) and restarted: every object in the landing is a whole
    file, and after ``--until now`` the captures hold the bucket's truth."""
    rng = random.Random(11)
    with (
        s3_server() as s3,
        producer(
            tmp_path, nodes=2, vbuckets=16, docs=300, ops=300 * KILLS, batch=30, pause=0.25
        ) as prod,
    ):
        config = write_s3_config(
            tmp_path, s3, prod.info["connection_string"], rotate_bytes=8192, buffer_bytes=65536
        )
        for _ in range(KILLS):
            agent = subprocess.Popen(
                agent_command(config, "--follow"),
                env=agent_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            landed = len(s3.keys(PREFIX))
            deadline = time.monotonic() + 60
            while len(s3.keys(PREFIX)) <= landed:  # uploading (however slow the start)
                assert agent.poll() is None and time.monotonic() < deadline, "no upload"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
            assert agent.poll() is None, agent.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            agent.send_signal(signal.SIGKILL)
            agent.wait()
        prod.wait_workload()
        done = subprocess.run(
            agent_command(config, "--until", "now"),
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        landing = s3.download(PREFIX, tmp_path / "landing")
        assert assert_landing_whole(landing) == len(list(landing.glob("*.dcpcap")))
        assert assert_captures_equal_truth(landing, prod.truth_out) > 200
