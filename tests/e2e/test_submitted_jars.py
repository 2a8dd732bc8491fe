"""A driver started by ``spark-submit`` with the Delta jars in ``--jars`` uses those, also when
its code comes from the shipped zip (``--py-files``), as on a ``spark://`` master: there is no
checkout around that code, so no ``.cache/jars``, and no ``$DCP_CDC_JARS_DIR`` is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.lake.shipping import package_files, write_zip
from pipelines.lake.spark_session import JARS_DIR_ENV, delta_jars_dir, find_delta_jars

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRIVER = """
import sys
import pipelines
from pipelines.lake.spark_session import CHECKOUT_JARS_DIR, build_spark_session

assert ".zip" in pipelines.__file__, pipelines.__file__  # the shipped code, not a checkout
assert not CHECKOUT_JARS_DIR.exists(), CHECKOUT_JARS_DIR
metastore = sys.argv[2] if len(sys.argv) > 2 else None
spark = build_spark_session("submitted-jars", sys.argv[1], master="local[1]", metastore=metastore)
spark.sql("CREATE TABLE t (a INT) USING delta")
spark.sql("INSERT INTO t VALUES (1), (2)")
print("ROWS", spark.sql("SELECT sum(a) FROM t").first()[0], spark.conf.get("spark.jars"))
spark.stop()
"""


@pytest.mark.parametrize(
    "catalog", ["embedded", pytest.param("derby server", marks=pytest.mark.long)]
)
def test_a_submitted_driver_running_the_shipped_zip_uses_the_submitters_jars(
    tmp_path: Path, catalog: str
) -> None:
    import pyspark

    from pipelines.catalog import server as metastore_server

    code = write_zip(tmp_path / "code" / "dcp_cdc-test.zip", package_files())
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    jars = ",".join(str(jar) for jar in find_delta_jars())
    env = {k: v for k, v in os.environ.items() if k not in (JARS_DIR_ENV, "PYTHONPATH")}
    env |= {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    served: list[str] = []
    if catalog == "derby server":  # the catalog a DAG's tasks share: its client among the jars
        record, _ = metastore_server.start(tmp_path / "catalog", jars=delta_jars_dir())
        served = [f"{record.address}{record.database}"]
        client = next(jar for jar in find_delta_jars() if jar.name.startswith("derbyclient-"))
        served_flags = ["--driver-class-path", str(client)]
    else:
        served_flags = []
    try:
        done = subprocess.run(
            [
                *(str(submit), "--master", "local[1]", "--jars", jars, "--py-files", str(code)),
                *("--conf", "spark.ui.enabled=false", "--driver-java-options", "-XX:+UseSerialGC"),
                *served_flags,
                *(str(driver), str(tmp_path / "warehouse"), *served),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        if served:
            metastore_server.stop(tmp_path / "catalog", jars=delta_jars_dir())
    assert done.returncode == 0, done.stderr[-4000:]
    if served:  # the table is in the server's database, not in an embedded one
        assert (tmp_path / "catalog" / "metastore_db" / "service.properties").is_file()
        assert not (tmp_path / "warehouse" / "metastore_db").exists()
    rows = next(line for line in done.stdout.splitlines() if line.startswith("ROWS"))
    total, used = rows.split()[1:]
    assert total == "3"
    # the submitter's jars (spark-submit made them file: URLs), not a folder the driver found
    given = [Path(url.removeprefix("file:")).resolve() for url in used.split(",")]
    assert given == [jar.resolve() for jar in find_delta_jars()]
