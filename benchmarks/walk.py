"""Silver's per-vbucket walk, alone: frames a second of the function ``applyInArrow`` runs on
each vbucket's group, without Spark: the columnar walk
(``pipelines.silver.walk_columns.walk_group_columns``) against the row walk it is tested
against (``pipelines.silver.walk.walk_group_rows``, a dict per frame through ``walk.walk``),
and silver's ``walk_group``, which takes the row walk for groups below ``SMALL_GROUP`` frames;
then every vbucket in one table through ``walk_vbuckets``, as the driver walks a run's frames
(the vbuckets below ``SMALL_GROUP`` frames share one table in and one out).

The input is the ``mixed`` simulation (``--events`` operations on ``--vbuckets`` vbuckets,
64 and 1024 unless told: groups of some 2,000 frames and of some 140; backfills, live
snapshots, stream ends, a failover, collection creates, a flush and a drop) decoded as bronze
decodes it, cut into the groups the walk gets (``tests/support/walk_groups.py``:
one Arrow table per vbucket with the columns ``walk_frames`` selects, in record batches of 10,000
rows), each vbucket walked from a fresh state. The simulation is cached under
``benchmarks/.data/walk/``. Runs alternate between the walks so that load from other
processes falls on all alike; CPU seconds are kept beside the wall-clock seconds. The walks'
tables are compared once (they must be equal).

One more pass of each is timed step by step, to show where the time goes: for the row walk the
rows built from Arrow (``to_pylist``), their sort into session order, the state machine, the
output rows and table; for the columnar walk the session order, the narrow columns as lists,
the state machine and the output table. ``--profile rows`` (``columns``, ``silver``) runs one more pass
under pyinstrument and prints its tree.

    python -m benchmarks.walk [--events 100000] [--vbuckets 64 ...] [--runs 5] [--profile rows]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import Case, report
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


def walk_all(walker: Walker, tables: list[pa.Table], out_schema: pa.Schema) -> list[pa.Table]:
    """Every group through ``walker``."""
    return [walker(table, out_schema, False) for table in tables]


def alternating(
    walkers: dict[str, Walker], tables: list[pa.Table], out_schema: pa.Schema, runs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[pa.Table]]]:
    """Wall and CPU seconds of ``runs`` passes of each walker, in turn; the last tables."""
    wall: dict[str, list[float]] = {name: [] for name in walkers}
    cpu: dict[str, list[float]] = {name: [] for name in walkers}
    walked: dict[str, list[pa.Table]] = {}
    for _ in range(runs):
        for name, walker in walkers.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            walked[name] = walk_all(walker, tables, out_schema)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
    return wall, cpu, walked


class _Steps:
    """CPU seconds by step, summed over the groups."""

    def __init__(self, *names: str) -> None:
        self.seconds = dict.fromkeys(names, 0.0)
        self.at = time.process_time()

    def start(self) -> None:
        self.at = time.process_time()

    def done(self, name: str) -> None:
        now = time.process_time()
        self.seconds[name] += now - self.at
        self.at = now


def row_steps(tables: list[pa.Table], out_schema: pa.Schema) -> dict[str, float]:
    """The row walk's steps (``walk_group_rows``'), timed one by one."""
    from pipelines.silver.walk import VbState, position_of, walk

    steps = _Steps("rows from arrow", "sort", "state machine", "output")
    for table in tables:
        steps.start()
        rows = table.to_pylist()
        steps.done("rows from arrow")
        rows.sort(key=position_of)
        steps.done("sort")
        result = walk(rows, VbState(rows[0]["vb_key"]))
        steps.done("state machine")
        out: list[dict[str, Any]] = [
            {**{k: c.get(k) for k in out_schema.names}, "kind": "change", "state": None}
            for c in [*result.changes, *result.ended, *result.system_events]
        ]
        out.append({"kind": "state", "state": json.dumps(result.state.to_json())})
        pa.Table.from_pylist(out, schema=out_schema)
        steps.done("output")
    return steps.seconds


def column_steps(tables: list[pa.Table], out_schema: pa.Schema) -> dict[str, float]:
    """The columnar walk's steps (``walk_group``'s), timed one by one."""
    from pipelines.silver import walk_columns as wc
    from pipelines.silver.walk import VbState

    steps = _Steps("session order", "narrow columns", "state machine", "output")
    for table in tables:
        steps.start()
        order = wc._Order(table)
        steps.done("session order")
        frames = wc._Frames(table, order, 0)
        steps.done("narrow columns")
        walked = wc._walk(frames, VbState(0), False)
        steps.done("state machine")
        state = json.dumps(VbState(0).to_json())
        last = {"frames": len(frames), "ignored": 0, "state": state, "position_run_id": None}
        output = wc._Output(wc._gatherable(table, out_schema), out_schema)
        output.add(0, 0, frames.rows, walked, last)
        output.table()
        steps.done("output")
    return steps.seconds


def profile(walker: Walker, tables: list[pa.Table], out_schema: pa.Schema) -> None:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    walk_all(walker, tables, out_schema)
    profiler.stop()
    print(profiler.output_text(unicode=True, color=False))


WALKS = {
    "rows": "walk (rows, the reference)",
    "columns": "walk (columns)",
    "silver": "silver's walk_group",
}
TOGETHER = "silver's walk_vbuckets (one table)"


def together(
    tables: list[pa.Table], out_schema: pa.Schema, runs: int, walked: list[pa.Table]
) -> tuple[Case, bool]:
    """Every vbucket in one table through ``walk_vbuckets`` (what the driver walks, and each
    of Spark's walk groups): its case, and whether its table equals the groups' ``walked``
    one by one, each summed up."""
    from pipelines.silver.walk_columns import walk_vbuckets
    from pipelines.silver.walk_summary import summarize

    table = pa.concat_tables([t.cast(tables[0].schema) for t in tables])
    wall, cpu = [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        got = walk_vbuckets(table, out_schema, False)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    same = got.equals(pa.concat_tables([summarize(t) for t in walked]))
    extra = {"cpu_s": cpu, "cpu_median_s": statistics.median(cpu)}
    print(f"{TOGETHER}: CPU {statistics.median(cpu):.3f} s (median), table equal: {same}")
    return Case(TOGETHER, table.num_rows, "frames", wall, extra=extra), same


def run_size(events: int, vbuckets: int, runs: int, profile_walk: str | None) -> bool:
    """Every walk over the simulation of this size; whether their tables were all equal."""
    from pipelines import schemas
    from pipelines.silver.walk import walk_group_rows
    from pipelines.silver.walk_columns import SMALL_GROUP, walk_group, walk_group_columns

    tables = groups_from_captures(simulation(events, vbuckets))
    frames = sum(t.num_rows for t in tables)
    out_schema = schemas.arrow_schema(schemas.WALKED)
    small = sum(t.num_rows < SMALL_GROUP for t in tables)
    print(
        f"\n{frames:,} frames in {len(tables)} vbuckets, {frames / len(tables):,.0f} a group "
        f"({small} groups below {SMALL_GROUP} frames)"
    )
    walkers: dict[str, Walker] = {
        "rows": walk_group_rows,
        "columns": walk_group_columns,
        "silver": walk_group,
    }
    wall, cpu, walked = alternating(walkers, tables, out_schema, runs)
    same = all(
        all(a.equals(b) for a, b in zip(walked["rows"], walked[name], strict=True))
        for name in walkers
    )
    print(f"the walks' tables are equal: {same}")
    cases = [
        Case(
            WALKS[name],
            frames,
            "frames",
            wall[name],
            baseline=name == "rows",
            extra={
                "cpu_s": cpu[name],
                "cpu_median_s": statistics.median(cpu[name]),
                "frames_per_cpu_s": frames / statistics.median(cpu[name]),
                "rows_out": sum(t.num_rows for t in walked[name]),
            },
        )
        for name in walkers
    ]
    base = statistics.median(cpu["rows"])
    print(
        "CPU seconds (median): "
        + ", ".join(
            f"{name} {statistics.median(cpu[name]):.3f} s ({base / statistics.median(cpu[name]):.1f}×)"
            for name in walkers
        )
    )
    steps = {"rows": row_steps(tables, out_schema), "columns": column_steps(tables, out_schema)}
    for name, spent in steps.items():
        total = sum(spent.values())
        print(f"one pass of the {name} walk, step by step (CPU):")
        for step, seconds in spent.items():
            print(f"  {step:<18}{seconds:8.3f} s {100 * seconds / total:5.0f} %")
    one_table, one_same = together(tables, out_schema, runs, walked["silver"])
    cases.append(one_table)
    same = same and one_same
    if profile_walk:
        profile(walkers[profile_walk], tables, out_schema)
    params = {"events": events, "vbuckets": vbuckets, "runs": runs, "small_group": SMALL_GROUP}
    report(f"walk_{vbuckets}vb", cases, params=params | {"same_tables": same, "steps_cpu_s": steps})
    return same


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.walk", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="simulated operations")
    parser.add_argument(
        "--vbuckets",
        type=int,
        action="append",
        help="vbuckets of the simulation (repeatable; default 64 and 1024: large groups and small)",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--profile", choices=tuple(WALKS), help="pyinstrument over one pass of that walk"
    )
    args = parser.parse_args(argv)
    sizes = args.vbuckets or [64, 1024]
    if not all([run_size(args.events, vb, args.runs, args.profile) for vb in sizes]):
        raise SystemExit("the walks' tables differ")


if __name__ == "__main__":
    main()
