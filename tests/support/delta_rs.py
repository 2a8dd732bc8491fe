"""Reading Delta tables with delta-rs (the ``deltalake`` package), as a user without Spark
would: through its SQL reader (``QueryBuilder``), which reads tables with deletion vectors
(silver's ``_all`` tables have them by default); ``DeltaTable.to_pyarrow_table`` refuses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa


def read_delta(
    location: str | Path, columns: list[str] | None = None, version: int | None = None
) -> pa.Table:
    """The rows of the Delta table at ``location`` (its latest version, or ``version``)."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(str(location), version=version)
    names = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    result = QueryBuilder().register("t", table).execute(f"SELECT {names} FROM t")
    return pa.table(result.read_all())


def rows(
    location: str | Path, columns: list[str] | None = None, version: int | None = None
) -> list[dict[str, Any]]:
    """:func:`read_delta` as a list of dicts."""
    return list(read_delta(location, columns, version).to_pylist())
