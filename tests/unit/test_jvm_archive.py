"""Which class-data archive a local Spark JVM maps, and with which options (no JVM)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pipelines.lake import jvm_archive
from pipelines.lake.spark_session import class_archive_conf, merge_conf


def test_the_archive_is_the_checkouts_one_per_installation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(jvm_archive.ARCHIVE_ENV, raising=False)
    path = jvm_archive.archive_path()
    assert path is not None and path.parent == jvm_archive.CHECKOUT_ARCHIVE_DIR
    assert path.name.startswith("spark-pyspark-") and path.suffix == ".jsa"
    # another java makes another archive: the JVM would refuse this one anyway
    monkeypatch.setenv("JAVA_HOME", "/opt/another-jdk")
    assert jvm_archive.archive_path() != path


def test_a_missing_archive_gives_no_options_and_a_present_one_is_mapped_if_the_jvm_accepts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, str(archive))
    assert jvm_archive.java_options() == []
    assert class_archive_conf() == {}
    archive.write_bytes(b"")
    assert jvm_archive.java_options() == [
        f"-XX:SharedArchiveFile={archive}",
        "-Xshare:auto",
        "-Xlog:cds=off,cds+dynamic=off",
    ]
    # after the session's own options, a path with spaces kept whole
    spaced = tmp_path / "a b.jsa"
    spaced.write_bytes(b"")
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, str(spaced))
    own = {"spark.driver.extraJavaOptions": "-Duser.timezone=UTC"}
    merged = merge_conf(own, class_archive_conf())
    java = shlex.split(merged["spark.driver.extraJavaOptions"])
    assert java[:2] == ["-Duser.timezone=UTC", f"-XX:SharedArchiveFile={spaced}"]


def test_an_empty_setting_turns_the_archive_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "")
    assert jvm_archive.archive_path() is None
    assert jvm_archive.java_options() == []
