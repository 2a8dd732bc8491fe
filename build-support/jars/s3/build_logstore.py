"""Compile dcp-cdc's S3 log store (``src/dcpcdc/delta/S3ConditionalPutLogStore.java``) into a
jar beside the S3 jars, for ``make setup-s3``::

    .venv/bin/python build-support/jars/s3/build_logstore.py --dest .cache/jars-s3 \\
        --delta-jars .cache/jars

It compiles against the jars pyspark ships (Hadoop's API), the Delta jars (``delta-storage``)
and the S3 jars in ``--dest`` (``hadoop-aws``), so it runs after ``fetch_jars.py`` filled
``--dest``. It needs a JDK's ``javac`` (a JRE alone runs Spark, but does not compile).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fetch_jars import pyspark_jars_dir  # noqa: E402

JAR_NAME = "dcp-cdc-s3-logstore.jar"
SOURCES = sorted((HERE / "src").rglob("*.java"))


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"], "bin", name)
        found = str(candidate) if candidate.is_file() else None
    if found is None:
        sys.exit(
            f"build_logstore: {name} not found: a JDK (17 or later) is needed on PATH or JAVA_HOME"
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".cache/jars-s3"))
    parser.add_argument("--delta-jars", type=Path, default=Path(".cache/jars"))
    args = parser.parse_args(argv)
    dest: Path = args.dest.resolve()
    if not any(dest.glob("hadoop-aws-*.jar")):
        sys.exit(
            f"build_logstore: no hadoop-aws jar in {dest}; run fetch_jars.py on s3/pom.xml first"
        )
    if not any(args.delta_jars.glob("delta-storage-*.jar")):
        sys.exit(
            f"build_logstore: no delta-storage jar in {args.delta_jars}; run `make setup` first"
        )
    classpath = os.pathsep.join(
        str(folder / "*") for folder in (pyspark_jars_dir(), args.delta_jars.resolve(), dest)
    )
    with tempfile.TemporaryDirectory(prefix="logstore-") as tmp:
        classes = Path(tmp, "classes")
        compiled = subprocess.run(
            [tool("javac"), "--release", "17", "-nowarn", "-d", str(classes), "-cp", classpath]
            + [str(s) for s in SOURCES],
            capture_output=True,
            text=True,
            check=False,
        )
        if compiled.returncode != 0:
            sys.stderr.write(compiled.stdout + compiled.stderr)
            sys.exit(f"build_logstore: javac failed (exit {compiled.returncode})")
        staged = Path(tmp, JAR_NAME)
        subprocess.run([tool("jar"), "cf", str(staged), "-C", str(classes), "."], check=True)
        shutil.move(staged, dest / JAR_NAME)
    with (dest / "MANIFEST.txt").open("a", encoding="utf-8") as manifest:
        manifest.write(f"{JAR_NAME}\tbuilt from build-support/jars/s3/src\n")
    print(f"build_logstore: {dest / JAR_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
