"""The landing filesystem: one pyarrow stack lists and reads local paths and URIs."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipelines.bronze.landing import (
    Skipped,
    filesystem,
    gone,
    list_files,
    location_problem,
    open_input,
    s3_options,
)


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    root = tmp_path / "landing"
    (root / "a" / "b").mkdir(parents=True)
    (root / "one.dcpcap").write_bytes(b"first")
    (root / "a" / "b" / "two.dcpcap").write_bytes(b"second file")
    (root / "a" / "notes.txt").write_bytes(b"not a capture")
    (root / "a" / "dir.dcpcap").mkdir()  # a folder with the suffix is not a file
    return root


def test_local_path_lists_and_reads(landing: Path) -> None:
    listing = list_files(str(landing), ".dcpcap")
    found = listing.files
    assert [(f.path, f.size) for f in found] == [
        (str(landing / "a" / "b" / "two.dcpcap"), 11),
        (str(landing / "one.dcpcap"), 5),
    ]
    stat = os.stat(landing / "one.dcpcap")
    assert found[1].modified_ms == int(stat.st_mtime * 1000)  # what earlier runs logged
    with open_input(found[0].path) as fh:
        assert fh.read(6) == b"second" and fh.read(100) == b" file" and fh.read(1) == b""


def test_relative_path_is_resolved(landing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(landing.parent)
    assert [f.path for f in list_files("landing", ".dcpcap").files] == [
        str(landing / "a" / "b" / "two.dcpcap"),
        str(landing / "one.dcpcap"),
    ]


@pytest.mark.parametrize("uri", ["file://{root}", "file:{root}"])
def test_file_uris_list_as_hadoop_wrote_them_and_read_back(landing: Path, uri: str) -> None:
    found = list_files(uri.format(root=landing), ".dcpcap").files
    assert [f.path for f in found] == [
        f"file:{landing / 'a' / 'b' / 'two.dcpcap'}",
        f"file:{landing / 'one.dcpcap'}",
    ]
    with open_input(found[1].path) as fh:
        assert fh.read() == b"first"


def test_a_missing_location_has_no_files_and_is_a_problem(tmp_path: Path) -> None:
    for location in (str(tmp_path / "nothing"), f"file://{tmp_path / 'nothing'}"):
        assert list_files(location, ".dcpcap").files == []
        assert location_problem(location) == "does not exist"
    (tmp_path / "file").write_bytes(b"x")
    assert location_problem(str(tmp_path / "file")) == "is a file, not a folder"
    assert location_problem(str(tmp_path)) is None


def test_odd_entries_are_skipped_and_reported(landing: Path) -> None:
    (landing / "empty.dcpcap").touch()
    (landing / "dangling.dcpcap").symlink_to(landing / "nowhere")
    (landing / "linked.dcpcap").symlink_to(landing / "one.dcpcap")
    listing = list_files(str(landing), ".dcpcap")
    assert [Path(f.path).name for f in listing.files] == [
        "two.dcpcap",
        "linked.dcpcap",
        "one.dcpcap",
    ]
    assert listing.skipped == [
        Skipped(str(landing / "a" / "dir.dcpcap"), "a folder, not a file"),
        Skipped(str(landing / "dangling.dcpcap"), "a dangling link, or gone while listing"),
        Skipped(str(landing / "empty.dcpcap"), "empty (0 bytes)"),
    ]
    assert str(listing.skipped[2]) == f"{landing / 'empty.dcpcap'}: empty (0 bytes)"


def test_a_name_that_is_not_utf8_is_skipped_and_reported(landing: Path) -> None:
    """pyarrow raises UnicodeDecodeError for such a name: it must not stop the listing."""
    odd = os.path.join(os.fsencode(landing), b"bad\xff.dcpcap")
    with open(odd, "wb") as fh:
        fh.write(b"frames")
    with open(os.path.join(os.fsencode(landing), b"other\xfe.txt"), "wb") as fh:
        fh.write(b"not ours")
    listing = list_files(str(landing), ".dcpcap")
    assert [Path(f.path).name for f in listing.files] == ["two.dcpcap", "one.dcpcap"]
    assert listing.skipped == [
        Skipped(str(landing / "a" / "dir.dcpcap"), "a folder, not a file"),
        Skipped(f"{landing}/bad\\xff.dcpcap", "its name is not UTF-8 (rename it to read it)"),
    ]


def test_why_a_listed_file_can_no_longer_be_read(landing: Path) -> None:
    assert gone(str(landing / "one.dcpcap")) is None  # still a file
    assert gone(str(landing / "vanished.dcpcap")) == "vanished"
    assert gone(str(landing / "a" / "dir.dcpcap")) == "is no longer a file"


def test_an_object_store_prefix_needs_only_its_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    class Store:  # what pyarrow's S3 filesystem says of a bucket and of an absent prefix
        type_name = "s3"

        def get_file_info(self, path: str) -> pafs.FileInfo:
            known = {"landing": pafs.FileType.Directory, "landing/a/file": pafs.FileType.File}
            return pafs.FileInfo(path, known.get(path, pafs.FileType.NotFound))

    monkeypatch.setattr(
        "pipelines.bronze.landing.filesystem",
        lambda location, settings: (Store(), location.split("://", 1)[1]),
    )
    assert location_problem("s3a://landing/not/yet/written") is None
    assert location_problem("s3a://landing/a/file") == "is a file, not a folder"
    assert location_problem("s3a://typo/captures") == "its bucket 'typo' does not exist"


def test_s3_options_come_from_sparks_s3a_settings() -> None:
    settings = {
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.sql.shuffle.partitions": "4",
    }
    assert s3_options(settings) == {
        "access_key": "AK",
        "secret_key": "SK",
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
        "region": "eu-west-1",
        "force_virtual_addressing": False,
    }
    assert s3_options({"spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}) == {"scheme": "http"}
    assert s3_options({}) == {}


def test_s3a_and_s3_are_the_same_s3_filesystem() -> None:
    settings = {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:1",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    }
    for uri in ("s3a://bucket/some/prefix/", "s3://bucket/some/prefix"):
        fs, path = filesystem(uri, settings)
        assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/some/prefix"
        assert fs.region == "us-east-1"
