"""Resolve the Delta Lake jars once, into a project folder, for offline Spark sessions.

Run by ``make setup`` with the project's venv Python (it needs the installed pyspark to know
which jars Spark already ships)::

    .venv/bin/python build-support/jars/fetch_jars.py --dest .cache/jars

Maven resolves the runtime closure of the artifacts in ``pom.xml`` beside this file; every jar
whose artifact is already in ``pyspark/jars`` is dropped (Spark's own copy wins on the classpath
anyway, and two versions of one library only invite trouble). What is left is copied flat into
``--dest`` with a ``MANIFEST.txt`` naming each jar's coordinates and what was skipped.
``pipelines.lake.spark_session`` hands these files to ``spark.jars``.

``make setup-s3`` runs it again on ``s3/pom.xml`` (Hadoop's S3A filesystem and the AWS SDK
modules it calls) into ``.cache/jars-s3``, with ``--require hadoop-aws``: a set only sessions
on ``s3a://`` storage load.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Artifact:
    group_id: str
    artifact_id: str
    version: str
    path: Path

    @property
    def coordinates(self) -> str:
        return f"{self.group_id}:{self.artifact_id}:{self.version}"


def pyspark_jars_dir() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "fetch_jars: pyspark is not installed in this Python; run it with .venv/bin/python"
        )
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    if not jars.is_dir():
        sys.exit(f"fetch_jars: {jars} is missing; is this the full pyspark (not pyspark-client)?")
    return jars


def run_or_exit(command: list[str], what: str, about: str = "") -> None:
    """Runs ``command``; when it fails, writes its output to stderr and exits saying
    "``what`` failed (exit <its code>)``about``"."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"{what} failed (exit {done.returncode}){about}")


def resolve(pom: Path, staging: Path) -> list[Artifact]:
    """The runtime closure of ``pom``, copied into ``staging`` in repository layout."""
    run_or_exit(
        [
            "mvn",
            "-B",
            "-q",
            "-ntp",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
            "-Dmdep.useRepositoryLayout=true",
        ],
        "fetch_jars: mvn",
        f" resolving {pom}",
    )
    artifacts = []
    for jar in sorted(staging.rglob("*.jar")):
        # <group path>/<artifactId>/<version>/<artifactId>-<version>[-classifier].jar
        rel = jar.relative_to(staging).parts
        group_id, artifact_id, version = ".".join(rel[:-3]), rel[-3], rel[-2]
        artifacts.append(Artifact(group_id, artifact_id, version, jar))
    return artifacts


def shipped_by_spark(artifact_id: str, spark_jar_names: set[str]) -> bool:
    """True when pyspark/jars holds some version of ``artifact_id`` (``<id>-<digit>...jar``)."""
    prefix = artifact_id + "-"
    return any(
        name.startswith(prefix) and name[len(prefix) : len(prefix) + 1].isdigit()
        for name in spark_jar_names
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".cache/jars"))
    parser.add_argument("--pom", type=Path, default=HERE / "pom.xml")
    parser.add_argument(
        "--require",
        default="delta-spark_",
        help="fail unless a kept jar's artifact id starts with this (default: delta-spark_)",
    )
    args = parser.parse_args(argv)

    spark_jar_names = {p.name for p in pyspark_jars_dir().glob("*.jar")}
    dest: Path = args.dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".jars-staging-", dir=dest.parent) as tmp:
        artifacts = resolve(args.pom.resolve(), Path(tmp) / "repo")
        kept = [a for a in artifacts if not shipped_by_spark(a.artifact_id, spark_jar_names)]
        skipped = [a for a in artifacts if a not in kept]
        if not any(a.artifact_id.startswith(args.require) for a in kept):
            sys.exit(f"fetch_jars: Maven gave no {args.require}* jar for {args.pom}")

        # Build the new folder beside the old one and swap, so a failed run leaves no half set.
        fresh = Path(tmp) / "out"
        fresh.mkdir()
        manifest = ["# Written by build-support/jars/fetch_jars.py; do not edit."]
        for a in kept:
            shutil.copy2(a.path, fresh / a.path.name)
            manifest.append(f"{a.path.name}\t{a.coordinates}")
        manifest.append("# Skipped, already in pyspark/jars:")
        manifest += [f"#   {a.coordinates}" for a in skipped]
        (fresh / "MANIFEST.txt").write_text("\n".join(manifest) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(fresh, dest)

    print(f"fetch_jars: {len(kept)} jars in {dest} ({len(skipped)} already shipped by pyspark)")
    for a in kept:
        print(f"  {a.path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
