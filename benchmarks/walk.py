"""Silver's per-vbucket walk, alone: frames a second of the function ``applyInArrow`` runs on
each vbucket's group (``pipelines.silver.transforms._walk_group``), without Spark.

The input is the ``mixed`` simulation (``--events`` operations on ``--vbuckets`` vbuckets:
backfills, live snapshots, stream ends, a failover, collection creates, a flush and a drop)
decoded as bronze decodes it, cut into the groups the walk gets (``tests/support/walk_groups.py``:
one Arrow table per vbucket with the columns ``walk_frames`` selects, in record batches of 10,000
rows), each vbucket walked from a fresh state. The simulation is cached under
``benchmarks/.data/walk/``.

A breakdown of one pass shows where the walk's time goes, step by step: the rows built from
Arrow (``to_pylist``), their sort into session order, the state machine
(``pipelines.silver.walk.walk``), the output rows and the output table. ``--profile`` runs one
more pass under pyinstrument and prints its tree.

    python -m benchmarks.walk [--events 100000] [--vbuckets 64] [--runs 3] [--profile]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import Case, report, timed
from tests.support.walk_groups import groups_from_captures

DATA = Path(__file__).resolve().parent / ".data" / "walk"

Walker = Callable[[pa.Table, pa.Schema, bool], pa.Table]


def simulation(events: int, vbuckets: int) -> Path:
    """The landing folder of the ``mixed`` simulation of this size, simulated once."""
    from dcp_cdc.simulator import simulate

    out = DATA / f"mixed-{events}-{vbuckets}"
    done = out / "done"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        simulate(
            out,
            bucket="bench",
            scenario="mixed",
            seed=1,
            vbuckets=vbuckets,
            docs=max(1000, events // 10),
            ops=events,
            versions=False,
        )
        done.write_text("")
        print(f"simulated {events:,} operations in {time.perf_counter() - started:.1f} s")
    return out / "landing"


def walk_all(walker: Walker, tables: list[pa.Table], out_schema: pa.Schema) -> int:
    """Every group through ``walker``; the rows it gave."""
    return sum(walker(table, out_schema, False).num_rows for table in tables)


def breakdown(tables: list[pa.Table], out_schema: pa.Schema) -> dict[str, float]:
    """Seconds of each step of the row walk (``_walk_group``'s steps, timed one by one)."""
    from pipelines.silver.walk import VbState, position_of, walk

    steps = dict.fromkeys(("rows from arrow", "sort", "state machine", "output"), 0.0)

    def step(name: str, started: float) -> float:
        now = time.perf_counter()
        steps[name] += now - started
        return now

    for table in tables:
        t = time.perf_counter()
        rows = table.to_pylist()
        t = step("rows from arrow", t)
        rows.sort(key=position_of)
        t = step("sort", t)
        result = walk(rows, VbState(rows[0]["vb_key"]))
        t = step("state machine", t)
        out: list[dict[str, Any]] = [
            {**{k: c.get(k) for k in out_schema.names}, "kind": "change", "state": None}
            for c in [*result.changes, *result.ended, *result.system_events]
        ]
        out.append({"kind": "state", "state": json.dumps(result.state.to_json())})
        pa.Table.from_pylist(out, schema=out_schema)
        step("output", t)
    return steps


def profile(walker: Walker, tables: list[pa.Table], out_schema: pa.Schema) -> None:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    walk_all(walker, tables, out_schema)
    profiler.stop()
    print(profiler.output_text(unicode=True, color=False))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.walk", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="simulated operations")
    parser.add_argument("--vbuckets", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="pyinstrument over one pass")
    args = parser.parse_args(argv)

    from pipelines import schemas
    from pipelines.silver.transforms import _walk_group

    tables = groups_from_captures(simulation(args.events, args.vbuckets))
    frames = sum(t.num_rows for t in tables)
    out_schema = schemas.arrow_schema(schemas.WALKED)
    print(f"{frames:,} frames in {len(tables)} vbuckets")

    seconds, rows = timed(lambda: walk_all(_walk_group, tables, out_schema), args.runs)
    cases = [Case("walk (rows)", frames, "frames", seconds, baseline=True, extra={"rows": rows})]

    steps = breakdown(tables, out_schema)
    total = sum(steps.values())
    print("\none pass of the row walk, step by step:")
    for name, spent in steps.items():
        print(f"  {name:<18}{spent:8.3f} s {100 * spent / total:5.0f} %")
    if args.profile:
        profile(_walk_group, tables, out_schema)
    params = {"events": args.events, "vbuckets": args.vbuckets, "runs": args.runs}
    report("walk", cases, params=params | {"row_walk_steps_s": steps})


if __name__ == "__main__":
    main()
