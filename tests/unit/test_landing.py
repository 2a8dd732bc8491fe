"""The landing filesystem: one pyarrow stack lists and reads local paths and URIs."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipelines.landing import filesystem, list_files, open_input, s3_options


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
    found = list_files(str(landing), ".dcpcap")
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
    assert [f.path for f in list_files("landing", ".dcpcap")] == [
        str(landing / "a" / "b" / "two.dcpcap"),
        str(landing / "one.dcpcap"),
    ]


@pytest.mark.parametrize("uri", ["file://{root}", "file:{root}"])
def test_file_uris_list_as_hadoop_wrote_them_and_read_back(landing: Path, uri: str) -> None:
    found = list_files(uri.format(root=landing), ".dcpcap")
    assert [f.path for f in found] == [
        f"file:{landing / 'a' / 'b' / 'two.dcpcap'}",
        f"file:{landing / 'one.dcpcap'}",
    ]
    with open_input(found[1].path) as fh:
        assert fh.read() == b"first"


def test_a_missing_location_has_no_files(tmp_path: Path) -> None:
    assert list_files(str(tmp_path / "nothing"), ".dcpcap") == []
    assert list_files(f"file://{tmp_path / 'nothing'}", ".dcpcap") == []


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
