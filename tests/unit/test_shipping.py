"""The code shipped to executors: one zip of dcp_cdc and pipelines, built from the packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pipelines.lake.spark_session as spark_session
from dcp_cdc.config import AppConfig, BucketConfig, SparkConfig
from dcp_cdc.errors import ConfigError
from pipelines.errors import SparkSetupError
from pipelines.lake.shipping import code_zip, main, package_files, py_files_for
from pipelines.lake.spark_session import JARS_DIR_ENV, LOCAL_LOG_STORE_JAR, launch_conf

REPO = Path(__file__).resolve().parents[2]


def test_the_zip_holds_both_packages_and_their_data_but_no_bytecode(tmp_path: Path) -> None:
    zipped = code_zip(tmp_path)
    names = zipfile.ZipFile(zipped).namelist()
    assert names == sorted(names) == [name for name, _ in package_files()]
    for name in (
        "dcp_cdc/__init__.py",
        "dcp_cdc/simulator/__init__.py",
        "pipelines/lake/shipping.py",
        "pipelines/bronze/decode.py",
        "pipelines/lake/log4j2.properties",
    ):
        assert name in names
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]
    # built once per content: the same code is the same file, with the same bytes
    before = zipped.stat().st_mtime_ns
    assert code_zip(tmp_path) == zipped and zipped.stat().st_mtime_ns == before
    assert main(["--out", str(tmp_path / "dist" / "dcp_cdc.zip")]) == 0
    assert (tmp_path / "dist" / "dcp_cdc.zip").read_bytes() == zipped.read_bytes()


def test_the_zip_is_importable_and_decodes_with_numpy_alone(tmp_path: Path) -> None:
    """A zip cannot hold the compiled pass: from one, the columnar face falls back to numpy."""
    zipped = code_zip(tmp_path)
    probe = (
        f"import sys; sys.path.insert(0, {str(zipped)!r})\n"
        # an executor's Python without the package: no editable install's finder
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in f.__module__]\n"
        "import pipelines.bronze.decode, dcp_cdc.columnar as c\n"
        "from dcp_cdc.encoder import encode, make_header\n"
        "from dcp_cdc.events import SeqnoAdvanced\n"
        "frame = encode(SeqnoAdvanced(make_header(0x64, vbucket=3), 9))\n"
        "table = c.decode_batch(frame * 2, collections=True).table\n"
        "print(pipelines.bronze.decode.__file__, c.NATIVE, table['by_seqno'].to_pylist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    where, native, rows = done.stdout.strip().split(" ", 2)
    assert where == str(zipped / "pipelines" / "bronze" / "decode.py")
    assert (native, rows) == ("False", "[9, 9]")


def test_what_is_shipped_depends_on_the_setting_and_the_master(tmp_path: Path) -> None:
    assert py_files_for("auto", "local[2]") is None  # local executors are this Python
    auto = py_files_for("auto", "spark://127.0.0.1:7077")
    assert auto is not None and zipfile.is_zipfile(auto)
    assert py_files_for("s3a://artifacts/dcp_cdc.zip", "yarn") == "s3a://artifacts/dcp_cdc.zip"
    (tmp_path / "code.zip").write_bytes(b"")
    assert py_files_for(str(tmp_path / "code.zip"), "local[2]") == str(tmp_path / "code.zip")
    with pytest.raises(ConfigError, match=r"\[spark\] py_files: .*missing.zip is not a file"):
        py_files_for(str(tmp_path / "missing.zip"), "yarn")
    assert py_files_for(None, "yarn") is None and py_files_for("", "yarn") is None


def test_jars_from_the_setting_else_the_checkout_else_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "jars"
    folder.mkdir()
    for name in ("delta-spark_2.13-4.4.0.jar", LOCAL_LOG_STORE_JAR):
        (folder / name).write_bytes(b"")
    monkeypatch.delenv(JARS_DIR_ENV, raising=False)
    config = AppConfig(
        landing="l",
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b")],
        spark=SparkConfig(jars_dir=str(folder)),
    )
    assert launch_conf(config, "app", master=None)["spark.jars"] == ",".join(
        str(folder / name) for name in (LOCAL_LOG_STORE_JAR, "delta-spark_2.13-4.4.0.jar")
    )
    # an installed package has no checkout beside it: without a setting, the error names it
    monkeypatch.setattr(spark_session, "CHECKOUT_JARS_DIR", tmp_path / "no-checkout")
    unset = config.model_copy(update={"spark": SparkConfig()})
    with pytest.raises(SparkSetupError, match=r"\[spark\] jars_dir.*DCP_CDC_JARS_DIR"):
        launch_conf(unset, "app", master=None)
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))  # the environment still works
    assert launch_conf(unset, "app", master=None)["spark.jars"].endswith(".jar")
