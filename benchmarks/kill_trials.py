"""``kill -9`` trials: kill ``dcp-cdc ingest`` or ``apply`` at a random instant, run it again,
and check that the re-run succeeds and the data are exact.

    python -m benchmarks.kill_trials --ingest 30 --apply 30 [--seed 1] [--workdir DIR]

One simulated capture (the ``mixed`` scenario: collections created, flushed and dropped,
rollbacks, two sessions; :data:`tests.support.kill_harness.SIMULATION`). A base run measures each
job uninterrupted: its duration, the instants of its steps, bronze as it should be. Each trial
then starts from a clean warehouse (ingest) or from bronze alone (apply, a copy of the base
warehouse at the same path), kills the job's process group at a seeded random instant (two in
three spread over the whole run, start-up included; one in three inside the window of the
first table creations and commits), runs the job again to its end and checks:

- ingest: bronze holds every frame exactly once, as the uninterrupted run wrote it;
- apply: silver equals the simulator's truth, and no published version of any collection
  table moved a key back (:func:`tests.support.kill_harness.regressions`).

The step a kill hit is the last fault point the killed run passed (:mod:`pipelines.lake.faults`'s
trace). Prints a table and writes ``benchmarks/results/kill_trials.json``. Not part of
``make bench`` (it takes hours on a busy machine): ``make kill-trials``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support import kill_harness as kh

RESULTS = Path(__file__).resolve().parent / "results"


def _base(setup: kh.Setup) -> dict[str, Any]:
    """Uninterrupted ingest then apply: durations, step instants, bronze as it should be."""
    shutil.rmtree(setup.warehouse, ignore_errors=True)
    base: dict[str, Any] = {}
    for verb in ("ingest", "apply"):
        run = kh.run_to_end(setup, verb, f"base-{verb}")
        if run.process.returncode:
            raise SystemExit(f"the base {verb} failed:\n{run.output()[-3000:]}")
        points = [(at - run.started, name) for at, name in run.points()]
        creations = [at for at, name in points if name.startswith(("create:", "commit:"))]
        base[verb] = {
            "seconds": time.monotonic() - run.started,
            "window": (min(creations) - 0.5, creations[min(len(creations), 6) - 1] + 0.5),
        }
        if verb == "ingest":
            base["bronze"] = kh.bronze_rows(setup)
            shutil.copytree(setup.warehouse, setup.workdir / "bronze-only", symlinks=True)
    problems = kh.silver_problems(setup) + kh.regressions(setup)
    if problems:
        raise SystemExit(f"the base run is not exact: {problems}")
    return base


def trial(setup: kh.Setup, base: dict[str, Any], verb: str, n: int, rng: random.Random) -> dict:
    shutil.rmtree(setup.warehouse, ignore_errors=True)
    if verb == "apply":
        shutil.copytree(setup.workdir / "bronze-only", setup.warehouse, symlinks=True)
    targeted = n % 3 == 2
    low, high = base[verb]["window"] if targeted else (0.0, base[verb]["seconds"])
    delay = rng.uniform(low, high)
    tag = f"{verb}-{n}"
    run = kh.start(setup, verb, tag)
    time.sleep(max(0.0, run.started + delay - time.monotonic()))
    ended_first = run.process.poll() is not None
    at = run.kill()
    step = "ended before the kill" if ended_first else kh.step_at(run.points(), at)
    again = kh.run_to_end(setup, verb, f"{tag}-again")
    problems: list[str] = []
    if again.process.returncode:
        problems.append(f"re-run exit {again.process.returncode}: {again.output()[-1500:]}")
    elif verb == "ingest":
        problems = kh.bronze_problems(setup, base["bronze"])
    else:
        problems = kh.silver_problems(setup) + kh.regressions(setup)
    return {
        "job": verb,
        "trial": n,
        "targeted": targeted,
        "kill_after_s": round(at - run.started, 2),
        "step": step,
        "rerun_s": round(time.monotonic() - again.started, 1),
        "ok": not problems,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ingest", type=int, default=30, help="trials of dcp-cdc ingest")
    parser.add_argument("--apply", type=int, default=30, help="trials of dcp-cdc apply")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/.data/kill_trials"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    setup = kh.prepare(args.workdir.resolve())
    base = _base(setup)
    print(
        f"base: ingest {base['ingest']['seconds']:.0f} s, apply {base['apply']['seconds']:.0f} s",
        flush=True,
    )
    rng = random.Random(args.seed)
    counts: Counter[str] = Counter()
    results = []
    out = RESULTS / "kill_trials.json"
    for verb in _interleave(args.ingest, args.apply):
        counts[verb] += 1
        result = trial(setup, base, verb, counts[verb], rng)
        results.append(result)
        print(
            f"{verb:<6} #{result['trial']:<3} kill at {result['kill_after_s']:>7.2f} s "
            f"{'(window) ' if result['targeted'] else ''}in {result['step']}: "
            f"{'ok' if result['ok'] else 'FAILED ' + '; '.join(result['problems'])}",
            flush=True,
        )
        RESULTS.mkdir(exist_ok=True)
        summary = {"seconds": round(time.monotonic() - started), "base": base, "trials": results}
        out.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    print(f"\n{'job':<7}{'trials':>7}{'ok':>5}{'failed':>8}")
    for verb in ("ingest", "apply"):
        mine = [r for r in results if r["job"] == verb]
        ok = sum(r["ok"] for r in mine)
        print(f"{verb:<7}{len(mine):>7}{ok:>5}{len(mine) - ok:>8}")
    steps = Counter((r["job"], r["step"].partition(":")[0]) for r in results)
    print("\nsteps hit:", ", ".join(f"{j} {s}: {n}" for (j, s), n in sorted(steps.items())))
    print(f"total {time.monotonic() - started:.0f} s; {out}")
    return 0 if all(r["ok"] for r in results) else 1


def _interleave(ingest: int, apply: int) -> list[str]:
    order = []
    for i in range(max(ingest, apply)):
        order += ["ingest"] * (i < ingest) + ["apply"] * (i < apply)
    return order


if __name__ == "__main__":
    raise SystemExit(main())
