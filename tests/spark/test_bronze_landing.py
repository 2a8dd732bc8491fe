"""Bronze ingest on an unlucky landing folder: odd entries, files that vanish, grow or are
replaced around a run and around a killed run. Good files are ingested exactly once; the
rest is reported, and never blocks the other files."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from dcp_cdc.capture import iter_capture
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.simulator import simulate
from pipelines import schemas
from pipelines.bronze import job
from pipelines.bronze.job import IngestSummary, ingest_bucket
from pipelines.lake import delta_io
from pipelines.tables import BucketTables


class Killed(RuntimeError):
    """Stands for the process dying at a given point of a run."""


@pytest.fixture
def bucket(spark: SparkSession) -> Iterator[str]:
    name = f"l-{uuid.uuid4().hex[:8]}"
    yield name
    for table in BucketTables(name).bronze.values():
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def _config(landing: Path, warehouse: Path, bucket: str) -> AppConfig:
    return AppConfig(
        landing=str(landing), warehouse=str(warehouse), buckets=[BucketConfig(name=bucket)]
    )


def _ingest(spark: SparkSession, config: AppConfig, **kw: Any) -> IngestSummary:
    return ingest_bucket(spark, config, config.buckets[0], **kw)


def _frames(data: bytes, tmp: Path) -> int:
    """Well-formed frames of a capture file's bytes (by the event iterator, not bronze)."""
    tmp.write_bytes(data)
    return sum(1 for e in iter_capture(tmp) if not isinstance(e, MalformedFrameError))


def _bronze(spark: SparkSession, bucket: str) -> dict[str, int]:
    rows = spark.table(BucketTables(bucket).events).groupBy("file").count().collect()
    return {Path(r["file"]).name: r["count"] for r in rows}


def _log(spark: SparkSession, bucket: str, status: str) -> list[dict[str, Any]]:
    rows = spark.table(BucketTables(bucket).ingest_log).where(f"status = '{status}'").collect()
    return sorted((r.asDict() for r in rows), key=lambda r: r["file"])


def _captures(tmp_path: Path, bucket: str, seed: int, max_file_bytes: int) -> list[Path]:
    sim = tmp_path / f"sim{seed}"
    return simulate(
        sim,
        scenario="basic",
        seed=seed,
        bucket=bucket,
        vbuckets=2,
        docs=20,
        ops=60,
        max_file_bytes=max_file_bytes,
    ).files


@pytest.mark.parametrize("point", ["events", "planned"])
def test_a_file_that_grows_before_a_killed_run_resumes(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path, point: str
) -> None:
    """Half a file landed and was planned; the run was killed; the whole file replaced it.
    If the events had committed, bronze keeps the planned half and the log says so (and the
    growth is reported); if not, the file is left out and ingested whole by a later run."""
    whole, other = _captures(tmp_path, bucket, 3, 1 << 20)
    landing = tmp_path / "landing"
    landing.mkdir()
    shutil.copy(other, landing)
    data = whole.read_bytes()
    half = data[: len(data) // 2]
    target = landing / whole.name
    target.write_bytes(half)
    config = _config(landing, spark_warehouse, bucket)

    def die(at: str) -> None:
        if at == point:
            raise Killed(at)

    with pytest.raises(Killed):
        _ingest(spark, config, hook=die)
    target.write_bytes(data)
    resumed = _ingest(spark, config)
    assert resumed.resumed
    later = _ingest(spark, config)
    frames_half, frames_whole = _frames(half, tmp_path / "h"), _frames(data, tmp_path / "w")
    [row] = [r for r in _log(spark, bucket, "ingested") if r["file"] == str(target)]
    if point == "events":
        assert resumed.files == 2 and resumed.changed == [
            f"{target} (grew past the {len(half)} bytes planned after its events were written)"
        ]
        assert (row["size"], row["frames"]) == (len(half), frames_half)
        assert _bronze(spark, bucket)[target.name] == frames_half
        assert later.run_version is None and later.changed == [str(target)]
    else:
        assert resumed.files == 1 and resumed.left_out == [
            f"{target}: grew past the {len(half)} bytes planned"
        ]
        assert later.files == 1 and (row["size"], row["frames"]) == (len(data), frames_whole)
        assert _bronze(spark, bucket)[target.name] == frames_whole
    assert _bronze(spark, bucket)[other.name] == _frames(other.read_bytes(), tmp_path / "o")


def test_a_planned_file_moved_away_or_overwritten_does_not_block_the_bucket(
    spark: SparkSession, bucket: str, tmp_path: Path, spark_warehouse: Path
) -> None:
    files = _captures(tmp_path, bucket, 4, 4000)
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in files:
        shutil.copy(f, landing)
    expected = {f.name: _frames(f.read_bytes(), tmp_path / "x") for f in files}
    moved = landing / f"{bucket}-s01-4-00001.dcpcap"
    overwritten = landing / f"{bucket}-s02-4-00000.dcpcap"
    config = _config(landing, spark_warehouse, bucket)

    def die(at: str) -> None:
        if at == "planned":
            raise Killed(at)

    with pytest.raises(Killed):
        _ingest(spark, config, hook=die)
    moved.rename(tmp_path / moved.name)
    overwritten.write_bytes(b"\x00" * 40)
    resumed = _ingest(spark, config)
    assert resumed.resumed and resumed.files == 1
    assert sorted(resumed.left_out) == [
        f"{moved}: vanished",
        f"{overwritten}: now not a capture file: magic {bytes(8)!r}",
    ]
    assert len(resumed.waiting) == len(files) - 3  # the later files of both sessions
    assert [(r["file"], r["status"]) for r in _log(spark, bucket, "missing")] == [
        (str(moved), "missing")
    ]
    assert [r["file"] for r in _log(spark, bucket, "changed")] == [str(overwritten)]
    assert _bronze(spark, bucket) == {
        f"{bucket}-s01-4-00000.dcpcap": expected[f"{bucket}-s01-4-00000.dcpcap"]
    }

    (tmp_path / moved.name).rename(moved)  # back: its session flows again
    again = _ingest(spark, config)
    assert again.files == 4 and not again.resumed
    assert _bronze(spark, bucket) == {
        n: c for n, c in expected.items() if not n.startswith(f"{bucket}-s02-")
    }


def test_landing_folder_torture(
    spark: SparkSession,
    bucket: str,
    tmp_path: Path,
    spark_warehouse: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Among good files: a folder, a dangling link, an empty file, junk named as captures and
    a capture whose name is not UTF-8;
    a file that vanishes and one that grows between listing and reading; one replaced (same
    size) between planning and writing. An ingest log of the version before digests."""
    landing = tmp_path / "landing"
    landing.mkdir()
    files = _captures(tmp_path, bucket, 2, 4000)
    for f in files:
        shutil.copy(f, landing)
    by_name = {f.name: landing / f.name for f in files}
    original = {name: path.read_bytes() for name, path in by_name.items()}
    expected = {name: _frames(data, tmp_path / "x") for name, data in original.items()}
    vanishing = f"{bucket}-s02-2-00001.dcpcap"  # a session's last file
    growing = f"{bucket}-s01-2-00004.dcpcap"
    replaced = f"{bucket}-s01-2-00003.dcpcap"
    (landing / "folder.dcpcap").mkdir()
    (landing / "dangling.dcpcap").symlink_to(tmp_path / "nowhere")
    (landing / "empty.dcpcap").touch()
    (landing / "junk.dcpcap").write_bytes(b"not a capture file at all")
    with open(os.path.join(os.fsencode(landing), b"named\xff.dcpcap"), "wb") as fh:
        fh.write(original[replaced])  # a good capture, under a name that is not UTF-8
    by_name[growing].write_bytes(original[growing][: len(original[growing]) // 2])

    listed = job.list_captures

    def list_then_change(*args: Any) -> Any:
        found = listed(*args)
        if by_name[vanishing].exists():  # the first listing only
            by_name[vanishing].unlink()
            by_name[growing].write_bytes(original[growing])
        return found

    def replace(point: str) -> None:
        if point == "planned" and by_name[replaced].read_bytes() == original[replaced]:
            data = original[replaced]
            by_name[replaced].write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))

    names = BucketTables(bucket)  # the ingest log and events as the version before made them
    delta_io.ensure_database(spark, names.ingest_log)
    old_log = StructType([f for f in schemas.INGEST_LOG.fields if f.name != "digest"])
    delta_io.create_table(spark, names.ingest_log, old_log, {})
    added = ("stream_flag_names", "stream_opaque")
    old_events = StructType([f for f in schemas.EVENTS.fields if f.name not in added])
    delta_io.create_table(spark, names.events, old_events, {})

    monkeypatch.setattr(job, "list_captures", list_then_change)
    config = _config(landing, spark_warehouse, bucket)
    first = _ingest(spark, config, hook=replace)

    assert first.resumed  # the write failed on the replaced file; the run resumed without it
    assert first.left_out == [
        f"{by_name[replaced]}: its first {len(original[replaced])} bytes "
        "are not those planned (sha256 differs)"
    ]
    assert first.unreadable == [f"{landing / 'junk.dcpcap'}: not a capture file: magic b'not a ca'"]
    assert sorted(first.skipped) == sorted(
        [
            f"{landing / 'dangling.dcpcap'}: a dangling link, or gone while listing",
            f"{landing / 'empty.dcpcap'}: empty (0 bytes)",
            f"{landing / 'folder.dcpcap'}: a folder, not a file",
            f"{landing}/named\\xff.dcpcap: its name is not UTF-8 (rename it to read it)",
            f"{by_name[vanishing]}: vanished before it was read",
            f"{by_name[growing]}: grew past the {len(original[growing]) // 2} bytes planned "
            "(while planning); left for a later run",
        ]
    )
    rendered = first.render()
    assert "skipped (not a file to read): " in rendered and "LEFT OUT" in rendered
    [changed] = _log(spark, bucket, "changed")
    assert changed["file"] == str(by_name[replaced]) and changed["digest"]
    assert "sha256 differs" in changed["message"]

    by_name[replaced].write_bytes(original[replaced])  # put back as it was
    second = _ingest(spark, config)
    assert first.files == 4 and second.files == 2 and not second.resumed
    assert _bronze(spark, bucket) == {n: c for n, c in expected.items() if n != vanishing}
    ingested = _log(spark, bucket, "ingested")
    assert sorted(Path(r["file"]).name for r in ingested) == sorted(set(expected) - {vanishing})
    assert all(r["digest"] and r["frames"] == expected[Path(r["file"]).name] for r in ingested)
    assert _ingest(spark, config).run_version is None  # nothing left, nothing twice
    assert set(added) <= set(spark.table(names.events).columns)
