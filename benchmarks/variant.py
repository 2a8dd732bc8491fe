"""Documents as JSON text or as VARIANT: the query time and table size a SQL user would see.

The same ``docs`` documents (default 1M: the apply benchmark's ~200-byte order documents,
:func:`benchmarks.changes.table_rows`) are written to two Delta tables, ``key`` and ``doc``
each, ``doc`` once as a JSON string (silver's ``doc`` today) and once as a VARIANT
(``parse_json(doc)``). Then, in a warm Spark session (``[spark]`` defaults, ``runs`` times
each, every query forced to read all rows):

- a field filter: how many documents have ``customer.tier = 'a'``;
- an aggregation: the total per tier, three fields read per document;
- the same aggregation over the JSON table with the document parsed once per row into a
  VARIANT at query time (what a typed view, ``[[buckets.projections]]``, does), against
  ``get_json_object`` once per field;
- the same aggregation over a typed view (``transforms.projection_query``, the product's
  query) of a table with ``doc`` only, which parses it, and of a table with ``doc`` and its
  companion ``doc_variant`` (``[silver] document_variant``), which the view reads instead.

Every query of an aggregation must give the same answer (totals to the cent). Sizes are the
tables' data files (``DESCRIBE DETAIL``'s ``sizeInBytes``). The inputs are built once under
``benchmarks/.data/variant``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from benchmarks import apply
from benchmarks.common import Case, report, timed
from pipelines import schemas
from pipelines.silver import transforms

DATA = Path(__file__).resolve().parent / ".data" / "variant"
GENERATOR = 2  # 2: the companion table

_JSON = {
    "tier": "get_json_object(doc, '$.customer.tier')",
    "total": "CAST(get_json_object(doc, '$.total') AS DOUBLE)",
    "qty": "CAST(get_json_object(doc, '$.items[0].qty') AS INT)",
}
_VARIANT = {
    "tier": "variant_get(doc, '$.customer.tier', 'string')",
    "total": "variant_get(doc, '$.total', 'double')",
    "qty": "variant_get(doc, '$.items[0].qty', 'int')",
}
_PARSED_ONCE = {k: v.replace("variant_get(doc,", "variant_get(v,") for k, v in _VARIANT.items()}
_TYPED = {"tier": "tier", "total": "total", "qty": "qty"}  # the typed view's columns


def filter_query(table: str, fields: dict[str, str]) -> str:
    return f"SELECT count(*) AS n FROM {table} WHERE {fields['tier']} = 'a'"


def aggregate_query(table: str, fields: dict[str, str], source: str | None = None) -> str:
    return (
        f"SELECT {fields['tier']} AS tier, sum({fields['total']}) AS total, "
        f"sum({fields['qty']}) AS qty, count(*) AS n FROM {source or table} "
        f"GROUP BY {fields['tier']}"
    )


def build(spark: Any, docs: int, *, fresh: bool) -> dict[str, str]:
    """The two tables (built or reused): their paths by kind."""
    from pyspark.sql import functions as F

    from benchmarks.changes import table_rows

    paths = {
        "json": str(DATA / f"json-{docs}"),
        "variant": str(DATA / f"variant-{docs}"),
        "companion": str(DATA / f"companion-{docs}"),
    }
    marker = DATA / f"built-{docs}.json"
    if not fresh and marker.exists() and json.loads(marker.read_text()) == {"g": GENERATOR}:
        return paths
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    print(f"  building {docs:,} documents, as JSON text, VARIANT and both", flush=True)
    rows = table_rows(spark, docs).select("key", "doc").repartition(4)
    rows.write.format("delta").save(paths["json"])
    written = spark.read.format("delta").load(paths["json"])
    written.select("key", F.parse_json("doc").alias("doc")).write.format("delta").save(
        paths["variant"]
    )
    written.select("key", "doc", F.parse_json("doc").alias(schemas.DOCUMENT_VARIANT)).write.format(
        "delta"
    ).save(paths["companion"])
    marker.write_text(json.dumps({"g": GENERATOR}))
    return paths


def typed_view(spark: Any, name: str, table: str, *, document_variant: bool) -> None:
    """The product's typed view (``projection_query``) of tier, total and qty over ``table``,
    shaped as a collection view (the columns the query reads after the document)."""
    from dcp_cdc.config import ProjectionColumn

    spark.sql(
        f"CREATE OR REPLACE TEMP VIEW {table}_silver AS SELECT *, "
        "CAST(NULL AS TIMESTAMP) AS _modified_at, 0L AS _seqno, 0 AS _vbucket FROM "
        f"{table}"
    )
    columns = [
        ProjectionColumn(name="tier", path="$.customer.tier"),
        ProjectionColumn(name="total", path="$.total", type="double"),
        ProjectionColumn(name="qty", path="$.items[0].qty", type="int"),
    ]
    query = transforms.projection_query(
        f"{table}_silver", columns, document_variant=document_variant
    )
    spark.sql(f"CREATE OR REPLACE TEMP VIEW {name} AS {query}")


def _to_the_cent(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Rows sorted, floats to the cent (sums of doubles depend on the order they were
    added in, which follows how a table's files were split)."""
    return sorted(tuple(round(v, 2) if isinstance(v, float) else v for v in r) for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.variant", description=__doc__)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="rebuild the tables")
    args = parser.parse_args(argv)
    spark = apply.session()
    try:
        paths = build(spark, args.docs, fresh=args.fresh)
        for kind, path in paths.items():
            spark.read.format("delta").load(path).createOrReplaceTempView(kind)
        sizes = {
            kind: spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["sizeInBytes"]
            for kind, path in paths.items()
        }
        typed_view(spark, "typed_parsed", "json", document_variant=False)
        typed_view(spark, "typed_variant", "companion", document_variant=True)
        parsed = "(SELECT try_parse_json(doc) AS v FROM json)"
        queries = [
            ("filter, JSON text", filter_query("json", _JSON), "json"),
            ("filter, VARIANT", filter_query("variant", _VARIANT), "variant"),
            ("aggregate, JSON text", aggregate_query("json", _JSON), "json"),
            ("aggregate, VARIANT", aggregate_query("variant", _VARIANT), "variant"),
            (
                "aggregate, JSON parsed once a row",
                aggregate_query("json", _PARSED_ONCE, parsed),
                "json",
            ),
            (
                "aggregate, typed view, doc parsed",
                aggregate_query("typed_parsed", _TYPED),
                "json",
            ),
            (
                "aggregate, typed view, doc_variant",
                aggregate_query("typed_variant", _TYPED),
                "companion",
            ),
        ]
        answers: dict[str, list[Any]] = {}
        cases = []
        for name, sql, kind in queries:
            spark.sql(sql).collect()  # warm: plan, codegen, the files in the page cache
            seconds, rows = timed(lambda q=sql: spark.sql(q).collect(), args.runs)
            answers[name] = _to_the_cent(rows)
            cases.append(
                Case(name, args.docs, "documents", seconds, extra={"table_bytes": sizes[kind]})
            )
        cases[0].baseline = True
    finally:
        spark.stop()
    aggregates = [v for k, v in answers.items() if k.startswith("aggregate")]
    same = answers["filter, JSON text"] == answers["filter, VARIANT"] and all(
        a == aggregates[0] for a in aggregates
    )
    report(
        "variant",
        cases,
        params={"docs": args.docs, "runs": args.runs, "table_bytes": sizes, "same": same},
    )
    print(
        f"  table size: JSON text {sizes['json'] / 2**20:.1f} MiB, "
        f"VARIANT {sizes['variant'] / 2**20:.1f} MiB, "
        f"both (doc and doc_variant) {sizes['companion'] / 2**20:.1f} MiB"
    )
    if not same:
        raise AssertionError(f"the queries disagree: {answers}")


if __name__ == "__main__":
    main()
