"""Peer: the same change batch applied by Spark Declarative Pipelines' AutoCDC and by silver.

AutoCDC (``pyspark.pipelines.create_auto_cdc_flow``, SCD type 1, keyed by (collection id,
key), sequenced by seqno, non-mutations applied as deletes) runs with ``spark-pipelines run``
in its own Spark Connect server, with the settings our sessions use (``local[2]``, 4 shuffle
partitions, 6 GiB driver, the same Delta table properties, deletion vectors on:
:func:`benchmarks.apply.table_properties`; not clustered: SDP's
``cluster_by`` fails on Delta with ``DELTA_OPERATION_NOT_ALLOWED``). Its source is a
Delta table of change rows: version 0 holds the table's ``keys`` live documents, version 1
the batch (:mod:`benchmarks.changes`, the same rows the apply benchmark MERGEs). A first run
loads version 0; that state is kept and restored before each timed run, which then applies
only the batch incrementally, as our ``merge_changes`` does against the same table.

Two things of the installed versions (pyspark 4.2.0, delta-spark 4.4.0) stand in the way, and
the benchmark works around both, outside the product:

- AutoCDC refuses a target whose catalog table does not implement the DSv2
  ``SupportsRowLevelOperations`` interface (``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``); Delta
  runs MERGE through its own analyzer rules and does not implement it. A two-class shim,
  compiled here with ``javac`` (a ``DeltaCatalog`` whose tables declare the interface and
  never use it), lets the flow start; its MERGE is then planned by Delta as any other. This is
  what apache/spark#56683 (drop the check) does upstream.
- ``spark-pipelines`` hands its ``--conf`` settings to the server in chunks of 10 of which
  pyspark keeps the last only, and applies the spec's ``configuration`` to every flow, where
  static settings fail (``CANNOT_MODIFY_CONFIG``). Static settings therefore go into a
  ``spark-defaults.conf`` (``SPARK_CONF_DIR``), runtime SQL settings into the spec.

Each side runs twice over: both tables with Delta's change data feed on (our default,
``[silver] change_data_feed``: every MERGE also writes the before and after image of each
change, which costs it a full read of the rows it replaces), then both with it off
(``--change-data-feed``). Reported per setting: our ``merge_changes`` (median of runs, each in a fresh Spark process as each
AutoCDC run is: the ratio's baseline; beside it a second MERGE in the same process, warm),
AutoCDC's micro-batch time (the streaming query's ``triggerExecution``), its flow time
(RUNNING to COMPLETED) and the wall time of the whole ``spark-pipelines run`` (JVM start-up
and graph set-up included). Then the live rows of
both tables are compared: the same set of (collection id, key, seqno, doc).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import apply
from benchmarks.common import Case, report, timed

DATA = Path(__file__).resolve().parent / ".data" / "peer"
TARGET = "silver_peer"
GENERATOR = 1

_SHIM = {
    "RowLevelDeltaTable.java": """
package dcpcdc.bench;

import org.apache.spark.sql.connector.catalog.SupportsRowLevelOperations;
import org.apache.spark.sql.connector.write.RowLevelOperationBuilder;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.delta.catalog.DeltaTableV2;

/** A Delta table that declares DSv2 row-level operations; Delta plans its MERGE itself. */
public class RowLevelDeltaTable extends DeltaTableV2 implements SupportsRowLevelOperations {
  public RowLevelDeltaTable(DeltaTableV2 t) {
    super(t.spark(), t.path(), t.catalogTable(), t.tableIdentifier(), t.timeTravelOpt(),
        t.options());
  }

  @Override
  public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
    throw new UnsupportedOperationException("Delta plans MERGE through its own analyzer rules");
  }
}
""",
    "RowLevelDeltaCatalog.java": """
package dcpcdc.bench;

import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.delta.catalog.DeltaCatalog;
import org.apache.spark.sql.delta.catalog.DeltaTableV2;

/** DeltaCatalog whose tables pass AutoCDC's SupportsRowLevelOperations check. */
public class RowLevelDeltaCatalog extends DeltaCatalog {
  @Override
  public Table loadTable(Identifier ident) {
    Table table = super.loadTable(ident);
    if (table instanceof DeltaTableV2 && !(table instanceof RowLevelDeltaTable)) {
      return new RowLevelDeltaTable((DeltaTableV2) table);
    }
    return table;
  }
}
""",
}

_PIPELINE = '''"""AutoCDC of the benchmark's change rows into a streaming table (written by peer.py)."""

import json
import os

from pyspark import pipelines as dp

SOURCE = os.environ["DCP_CDC_PEER_SOURCE"]


@dp.temporary_view
def change_rows():
    return spark.readStream.format("delta").load(SOURCE)  # noqa: F821 (set by the CLI)


dp.create_streaming_table(
    "{target}",
    table_properties=json.loads(os.environ["DCP_CDC_PEER_PROPERTIES"]),
)
dp.create_auto_cdc_flow(
    target="{target}",
    source="change_rows",
    keys=["collection_id", "key"],
    sequence_by="seqno",
    apply_as_deletes="op <> 'mutation'",
    except_column_list=["op"],
    stored_as_scd_type=1,
)
'''

# Settings a running server accepts per flow; everything else must be there at start-up.
_STATIC_SQL = {
    "spark.sql.catalogImplementation",
    "spark.sql.extensions",
    "spark.sql.warehouse.dir",
    "spark.sql.catalog.spark_catalog",
}


def _runtime(key: str) -> bool:
    return key.startswith(("spark.sql.", "spark.databricks.")) and key not in _STATIC_SQL


class Layout:
    """Where the peer benchmark keeps things, for a table of ``keys`` keys, change data feed
    on or off."""

    def __init__(self, keys: int, changes: int, cdf: bool) -> None:
        self.root = DATA / (f"{keys}-{changes}" + ("" if cdf else "-nocdf"))
        self.source = self.root / "source"
        self.project = self.root / "project"
        self.conf = self.root / "conf"
        self.live = self.root / "live"  # the pipeline's warehouse and storage, as used
        self.pristine = self.root / "pristine"  # the same after the initial load
        self.event_logs = self.root / "event-logs"
        self.marker = self.root / "pristine.json"

    @property
    def warehouse(self) -> Path:
        return self.live / "warehouse"

    @property
    def storage(self) -> Path:
        return self.live / "storage"


def shim_jar() -> Path:
    """Compile the catalog shim (once) against the installed Spark and Delta jars."""
    import pyspark

    from pipelines.lake.spark_session import find_delta_jars

    out = DATA / "shim" / "dcp-cdc-bench-shim.jar"
    if out.exists():
        return out
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise RuntimeError(
            "the peer benchmark compiles a catalog shim: needs javac and jar (a JDK)"
        )
    src, classes = out.parent / "src", out.parent / "classes"
    shutil.rmtree(out.parent, ignore_errors=True)
    (src / "dcpcdc" / "bench").mkdir(parents=True)
    for name, code in _SHIM.items():
        (src / "dcpcdc" / "bench" / name).write_text(code)
    spark_jars = Path(pyspark.__file__).parent / "jars"
    classpath = os.pathsep.join([str(spark_jars / "*"), *(str(j) for j in find_delta_jars())])
    sources = sorted(str(p) for p in (src / "dcpcdc" / "bench").glob("*.java"))
    subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", classpath, *sources], check=True)
    subprocess.run([jar, "cf", str(out), "-C", str(classes), "."], check=True)
    return out


def write_project(layout: Layout, keys: int) -> Path:
    """The pipeline project, its ``spark-defaults.conf`` and spec; returns the spec."""
    import yaml

    from dcp_cdc.config import SparkConfig
    from pipelines.lake.spark_session import find_delta_jars, spark_conf

    defaults = SparkConfig()
    conf = spark_conf(
        "dcp-cdc-bench-autocdc",
        layout.warehouse,
        master=defaults.master,
        shuffle_partitions=defaults.shuffle_partitions,
        jars=[*find_delta_jars(), shim_jar()],
    )
    conf.pop("spark.master")  # the server's master comes from --remote
    conf |= dict(defaults.conf) | {
        "spark.sql.catalog.spark_catalog": "dcpcdc.bench.RowLevelDeltaCatalog",
        # a streaming table without a format takes this; naming `format="delta"` instead makes
        # the second run fail altering the reserved `provider` property
        "spark.sql.sources.default": "delta",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": layout.event_logs.as_uri(),
    }
    layout.conf.mkdir(parents=True, exist_ok=True)
    layout.event_logs.mkdir(parents=True, exist_ok=True)
    (layout.conf / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in sorted(conf.items()) if not _runtime(k))
    )
    (layout.project / "transformations").mkdir(parents=True, exist_ok=True)
    (layout.project / "transformations" / "autocdc.py").write_text(
        _PIPELINE.replace("{target}", TARGET)
    )
    spec = {
        "name": f"dcp-cdc-bench-autocdc-{keys}",
        "storage": layout.storage.as_uri(),
        "configuration": {k: v for k, v in sorted(conf.items()) if _runtime(k)},
        "libraries": [{"glob": {"include": "transformations/**"}}],
    }
    path = layout.project / "spark-pipeline.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def source_rows(rows: Any, *, walked: bool) -> Any:
    """Silver rows (``walked=False``) or walked changes as AutoCDC source rows."""
    from pyspark.sql import functions as F

    if walked:
        return rows.select(
            F.col("collection_id"),
            F.col("key").cast("string").alias("key"),
            F.col("vbucket"),
            F.col("by_seqno").alias("seqno"),
            F.col("rev_seqno"),
            F.col("cas"),
            F.col("op"),
            F.when(F.col("op") == "mutation", F.col("value").cast("string")).alias("doc"),
        )
    return rows.select(
        F.col("_collection_id").alias("collection_id"),
        "key",
        F.col("_vbucket").alias("vbucket"),
        F.col("_seqno").alias("seqno"),
        F.col("_rev_seqno").alias("rev_seqno"),
        F.col("_cas").alias("cas"),
        F.lit("mutation").alias("op"),
        "doc",
    )


def run_pipeline(layout: Layout, spec: Path, properties: dict[str, str]) -> dict[str, float]:
    """One ``spark-pipelines run``: its wall seconds, the flow's RUNNING→COMPLETED seconds
    and the micro-batch seconds of its streaming query (from the event log)."""
    from dcp_cdc.config import SparkConfig

    cli = Path(sys.executable).with_name("spark-pipelines")
    env = dict(os.environ) | {
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_CONF_DIR": str(layout.conf),
        "DCP_CDC_PEER_SOURCE": str(layout.source),
        "DCP_CDC_PEER_PROPERTIES": json.dumps(properties),
    }
    before = set(layout.event_logs.iterdir())
    started = time.perf_counter()
    done = subprocess.run(
        [str(cli), "run", "--spec", str(spec), "--remote", SparkConfig().master],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    log = done.stdout + done.stderr
    (layout.root / "last-run.log").write_text(log)
    if done.returncode != 0 or "Run is COMPLETED" not in log:
        tail = "\n".join(line for line in log.splitlines() if not line.startswith("\tat "))[-3000:]
        raise RuntimeError(f"spark-pipelines run failed ({done.returncode}):\n{tail}")
    new_logs = sorted(set(layout.event_logs.iterdir()) - before)
    return {
        "wall_s": wall,
        "flow_s": _flow_seconds(log),
        "micro_batch_s": _micro_batch_seconds(new_logs),
    }


_EVENT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): Flow \S+ (is RUNNING|has COMPLETED)")


def _flow_seconds(log: str) -> float:
    stamps = {}
    for line in log.splitlines():
        m = _EVENT.match(line)
        if m:
            stamps.setdefault(m.group(2), datetime.fromisoformat(m.group(1)))
    if set(stamps) != {"is RUNNING", "has COMPLETED"}:
        raise RuntimeError(f"no flow RUNNING/COMPLETED events in the run's output: {stamps}")
    return (stamps["has COMPLETED"] - stamps["is RUNNING"]).total_seconds()


def _micro_batch_seconds(logs: list[Path]) -> float:
    total = 0
    for path in logs:
        files = sorted(path.rglob("events_*")) if path.is_dir() else [path]
        for f in files:
            for line in f.open():
                if "QueryProgressEvent" in line:
                    total += json.loads(line)["progress"]["durationMs"].get("triggerExecution", 0)
    return total / 1000


def prepare(spark: Any, keys: int, changes: int, cdf: bool, *, fresh: bool) -> tuple[Layout, Path]:
    """The source table and the pipeline's state after the initial load (built or reused)."""
    from benchmarks.changes import table_rows
    from pipelines.schemas import WALKED

    layout = Layout(keys, changes, cdf)
    spec = write_project(layout, keys)
    properties = apply.table_properties(change_data_feed=cdf)
    wanted = {
        "generator": GENERATOR,
        "apply_generator": apply.GENERATOR,
        "properties": properties,
    }
    marker = json.loads(layout.marker.read_text()) if layout.marker.exists() else {}
    if not fresh and marker == wanted and layout.pristine.exists():
        return layout, spec
    print(f"  AutoCDC initial load of {keys:,} keys", flush=True)
    layout.marker.unlink(missing_ok=True)
    for folder in (layout.source, layout.live, layout.pristine):
        shutil.rmtree(folder, ignore_errors=True)
    source_rows(table_rows(spark, keys), walked=False).write.format("delta").save(
        str(layout.source)
    )
    run_pipeline(layout, spec, properties)
    _, _, batch = apply.prepare(spark, keys, changes, change_data_feed=cdf)
    walked = spark.read.schema(WALKED).parquet(str(batch))
    source_rows(walked, walked=True).write.format("delta").mode("append").save(str(layout.source))
    shutil.copytree(layout.live, layout.pristine)
    layout.marker.write_text(json.dumps(wanted) + "\n")
    return layout, spec


def compare(spark: Any, table: str, layout: Layout) -> dict[str, int]:
    """Rows live in one table and not the other, both ways, on (collection id, key, seqno, doc)."""
    from pyspark.sql import functions as F

    ours = (
        spark.table(table)
        .where(~F.col("_deleted"))
        .select(
            F.col("_collection_id").alias("collection_id"),
            "key",
            F.col("_seqno").alias("seqno"),
            "doc",
        )
    )
    theirs = (
        spark.read.format("delta")
        .load(str(layout.warehouse / TARGET))
        .select("collection_id", "key", "seqno", "doc")
    )
    return {
        "ours_live": ours.count(),
        "autocdc_live": theirs.count(),
        "only_ours": ours.exceptAll(theirs).count(),
        "only_autocdc": theirs.exceptAll(ours).count(),
    }


def ours_once(keys: int, changes: int, cdf: bool) -> dict[str, float]:
    """Our ``merge_changes`` in a fresh Spark session (a cold JVM, as every AutoCDC run has):
    the first MERGE after restoring the table, then a second one after restoring it again
    (the same work in a warm JVM)."""
    from pipelines import schemas
    from pipelines.silver import store

    spark = apply.session()
    try:
        table, version, batch = apply.prepare(spark, keys, changes, change_data_feed=cdf)
        walked = spark.read.schema(schemas.WALKED).parquet(str(batch))
        registry = apply.registry_of(keys, change_data_feed=cdf)
        bucket = apply.bucket_of(keys, change_data_feed=cdf)
        seconds = []
        for _ in range(2):
            spark.sql(f"RESTORE TABLE {table} TO VERSION AS OF {version}")
            timed_s, _ = timed(lambda: store.merge_changes(spark, bucket, registry, walked), 1)
            seconds += timed_s
    finally:
        spark.stop()
    return {"cold_s": seconds[0], "warm_s": seconds[1]}


def step(name: str, keys: int, changes: int, cdf: bool, *, fresh: bool) -> Any:
    """One step with a Spark session of its own, run in a child process (an embedded Derby
    metastore is released only when its JVM exits)."""
    if name == "ours":
        return ours_once(keys, changes, cdf)
    spark = apply.session()
    try:
        table, _, _ = apply.prepare(spark, keys, changes, fresh=fresh, change_data_feed=cdf)
        layout, _ = prepare(spark, keys, changes, cdf, fresh=fresh)
        return compare(spark, table, layout) if name == "compare" else {}
    finally:
        spark.stop()


def _child(name: str, keys: int, changes: int, cdf: bool, *, fresh: bool = False) -> Any:
    out = DATA / f"step-{name}.json"
    out.unlink(missing_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.peer",
            "--keys",
            str(keys),
            "--changes",
            str(changes),
            "--step",
            name,
            "--change-data-feed",
            "on" if cdf else "off",
            "--out",
            str(out),
            *(["--fresh"] if fresh else []),
        ],
        check=True,
    )
    return json.loads(out.read_text())


def compare_setting(keys: int, changes: int, runs: int, cdf: bool) -> tuple[list[Case], Any]:
    """Ours and AutoCDC, ``runs`` times each, on tables with change data feed ``cdf``."""
    layout = Layout(keys, changes, cdf)
    spec = write_project(layout, keys)
    # Ours in a fresh process each run, as each AutoCDC run is.
    ours = [_child("ours", keys, changes, cdf) for _ in range(runs)]
    peer: list[dict[str, float]] = []
    for _ in range(runs):
        shutil.rmtree(layout.live, ignore_errors=True)
        shutil.copytree(layout.pristine, layout.live)
        peer.append(run_pipeline(layout, spec, apply.table_properties(change_data_feed=cdf)))
    equal = _child("compare", keys, changes, cdf)
    tag = f", CDF {'on' if cdf else 'off'}"
    cases = [
        Case(
            f"silver merge_changes, fresh JVM{tag}", changes, "changes", [o["cold_s"] for o in ours]
        ),
        Case(
            f"silver merge_changes, warm JVM{tag}", changes, "changes", [o["warm_s"] for o in ours]
        ),
        Case(f"AutoCDC micro-batch{tag}", changes, "changes", [p["micro_batch_s"] for p in peer]),
        Case(
            f"AutoCDC flow (RUNNING→COMPLETED){tag}",
            changes,
            "changes",
            [p["flow_s"] for p in peer],
        ),
        Case(f"AutoCDC spark-pipelines run{tag}", changes, "changes", [p["wall_s"] for p in peer]),
    ]
    return cases, equal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="rebuild the cached inputs")
    parser.add_argument(
        "--change-data-feed",
        default="on,off",
        help="comma-separated: on, off (both tables' delta.enableChangeDataFeed)",
    )
    parser.add_argument("--step", choices=["prepare", "ours", "compare"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    keys, changes = args.keys, args.changes
    settings = [v.strip() == "on" for v in args.change_data_feed.split(",")]
    if args.step:
        result = step(args.step, keys, changes, settings[0], fresh=args.fresh)
        args.out.write_text(json.dumps(result))
        return
    cases: list[Case] = []
    equal: dict[str, Any] = {}
    for cdf in settings:
        _child("prepare", keys, changes, cdf, fresh=args.fresh)
        setting_cases, equal[f"cdf_{'on' if cdf else 'off'}"] = compare_setting(
            keys, changes, args.runs, cdf
        )
        cases += setting_cases
    cases[0].baseline = True
    same = all(e["only_ours"] == 0 and e["only_autocdc"] == 0 for e in equal.values())
    report(
        "peer",
        cases,
        params={
            "keys": keys,
            "changes": changes,
            "runs": args.runs,
            "live_rows": equal,
            "equal": same,
        },
    )
    for k in range(0, len(cases), 5):
        cold, warm, micro_batch = cases[k : k + 3]
        setting = cold.name.rsplit(", ", 1)[1]
        print(
            f"  {setting}: silver (fresh JVM) vs AutoCDC micro-batch: "
            f"{micro_batch.median / cold.median:.2f}x faster (goal >= 1.5x); "
            f"warm JVM: {micro_batch.median / warm.median:.2f}x"
        )
    print(f"  live rows: {equal} -> {'equal' if same else 'DIFFERENT'}")
    if not same:
        raise AssertionError(f"silver and AutoCDC disagree on the live rows: {equal}")


if __name__ == "__main__":
    main()
