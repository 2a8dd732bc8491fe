"""Compile dcp-cdc's Java sources (its Delta log stores) into a jar beside the jars they run with.

``make setup`` builds the log store of local tables, ``make setup-s3`` the one of S3::

    .venv/bin/python build-support/jars/build_jar.py --src build-support/jars/local/src \\
        --jar .cache/jars/dcp-cdc-local-logstore.jar --classpath .cache/jars --needs delta-storage-
    .venv/bin/python build-support/jars/build_jar.py --src build-support/jars/s3/src \\
        --jar .cache/jars-s3/dcp-cdc-s3-logstore.jar --classpath .cache/jars \\
        --classpath .cache/jars-s3 --needs delta-storage- --needs hadoop-aws-

It compiles every ``*.java`` under ``--src`` against the jars pyspark ships (Hadoop's API) and
those of each ``--classpath`` folder, so it runs after ``fetch_jars.py`` filled them, and notes
the jar in its folder's ``MANIFEST.txt``. It needs a JDK's ``javac`` (a JRE alone runs Spark,
but does not compile). Tests build their own Java helpers with it too.
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
sys.path.insert(0, str(HERE))
from fetch_jars import pyspark_jars_dir, run_or_exit  # noqa: E402


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"], "bin", name)
        found = str(candidate) if candidate.is_file() else None
    if found is None:
        sys.exit(f"build_jar: {name} not found: a JDK (17 or later) is needed on PATH or JAVA_HOME")
    return found


def note_in_manifest(jar: Path, src: Path) -> None:
    """One line for ``jar`` in its folder's ``MANIFEST.txt`` (written by fetch_jars.py)."""
    manifest = jar.parent / "MANIFEST.txt"
    if not manifest.is_file():
        return
    try:
        origin = src.relative_to(HERE.parent.parent)
    except ValueError:
        origin = src
    lines = [
        line
        for line in manifest.read_text(encoding="utf-8").splitlines()
        if not line.startswith(f"{jar.name}\t")
    ]
    lines.append(f"{jar.name}\tbuilt from {origin}")
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="folder of the .java sources")
    parser.add_argument("--jar", type=Path, required=True, help="the jar to write")
    parser.add_argument(
        "--classpath", type=Path, action="append", default=[], help="a folder of jars"
    )
    parser.add_argument(
        "--needs",
        action="append",
        default=[],
        help="a jar name prefix that must be in a --classpath folder (e.g. delta-storage-)",
    )
    args = parser.parse_args(argv)
    src: Path = args.src.resolve()
    jar: Path = args.jar.resolve()
    folders = [pyspark_jars_dir(), *(folder.resolve() for folder in args.classpath)]
    for prefix in args.needs:
        if not any(any(f.glob(f"{prefix}*.jar")) for f in folders):
            sys.exit(
                f"build_jar: no {prefix}*.jar in {', '.join(str(f) for f in folders[1:])}; "
                "run `make setup` (and `make setup-s3` for S3) first"
            )
    sources = sorted(src.rglob("*.java"))
    if not sources:
        sys.exit(f"build_jar: no .java file under {src}")
    classpath = os.pathsep.join(str(folder / "*") for folder in folders)
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-jar-") as tmp:
        classes = Path(tmp, "classes")
        run_or_exit(
            [tool("javac"), "--release", "17", "-nowarn", "-d", str(classes), "-cp", classpath]
            + [str(s) for s in sources],
            "build_jar: javac",
        )
        staged = jar.with_name(f".{jar.name}.tmp")  # renamed: whole or not at all
        subprocess.run([tool("jar"), "cf", str(staged), "-C", str(classes), "."], check=True)
        os.replace(staged, jar)
    note_in_manifest(jar, src)
    print(f"build_jar: {jar}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
