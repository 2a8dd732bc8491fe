"""A driver started by ``spark-submit`` with the Delta jars in ``--jars`` uses those, also when
its code comes from the shipped zip (``--py-files``), as on a ``spark://`` master: there is no
checkout around that code, so no ``.cache/jars``, and no ``$DCP_CDC_JARS_DIR`` is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.shipping import package_files, write_zip
from pipelines.spark_session import JARS_DIR_ENV, find_delta_jars

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRIVER = """
import sys
import pipelines
from pipelines.spark_session import CHECKOUT_JARS_DIR, build_spark_session

assert ".zip" in pipelines.__file__, pipelines.__file__  # the shipped code, not a checkout
assert not CHECKOUT_JARS_DIR.exists(), CHECKOUT_JARS_DIR
spark = build_spark_session("submitted-jars", sys.argv[1], master="local[1]")
spark.sql("CREATE TABLE t (a INT) USING delta")
spark.sql("INSERT INTO t VALUES (1), (2)")
print("ROWS", spark.sql("SELECT sum(a) FROM t").first()[0], spark.conf.get("spark.jars"))
spark.stop()
"""


def test_a_submitted_driver_running_the_shipped_zip_uses_the_submitters_jars(
    tmp_path: Path,
) -> None:
    import pyspark

    code = write_zip(tmp_path / "code" / "dcp_cdc-test.zip", package_files())
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    jars = ",".join(str(jar) for jar in find_delta_jars())
    env = {k: v for k, v in os.environ.items() if k not in (JARS_DIR_ENV, "PYTHONPATH")}
    env |= {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    done = subprocess.run(
        [
            *(str(submit), "--master", "local[1]", "--jars", jars, "--py-files", str(code)),
            *("--conf", "spark.ui.enabled=false", "--driver-java-options", "-XX:+UseSerialGC"),
            *(str(driver), str(tmp_path / "warehouse")),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = next(line for line in done.stdout.splitlines() if line.startswith("ROWS"))
    total, used = rows.split()[1:]
    assert total == "3"
    # the submitter's jars (spark-submit made them file: URLs), not a folder the driver found
    given = [Path(url.removeprefix("file:")).resolve() for url in used.split(",")]
    assert given == [jar.resolve() for jar in find_delta_jars()]
