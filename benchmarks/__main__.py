"""``make bench``: every benchmark in turn, or those named (``make bench ARGS="decode apply"``).

Benchmarks are separate from the tests: they take minutes, build their own inputs under
``benchmarks/.data`` (ignored by git) and write JSON under ``benchmarks/results/``. Each runs
in a process of its own: its own JVM, memory and embedded metastore (a local warehouse
admits one Spark process at a time, and a stopped session keeps it until its JVM exits).
"""

from __future__ import annotations

import subprocess
import sys
import time

# In the order a change flows through the product.
BENCHMARKS = [
    "capture",
    "decode",
    "ingest",
    "walk",
    "apply",
    "small-run",
    "peer",
    "variant",
    "e2e",
    "check-cost",
    "freshness",
    "dag-run",
]


def _module(name: str) -> str:
    """A benchmark's module: its name with ``-`` as ``_`` (``small-run``: ``small_run``)."""
    return name.replace("-", "_")


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {BENCHMARKS}", file=sys.stderr)
        return 2
    for name in names:
        started = time.perf_counter()
        print(f"== benchmarks.{_module(name)}", flush=True)
        done = subprocess.run([sys.executable, "-m", f"benchmarks.{_module(name)}"], check=False)
        if done.returncode:
            print(f"== benchmarks.{_module(name)}: failed ({done.returncode})", file=sys.stderr)
            return done.returncode
        print(f"== benchmarks.{_module(name)}: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
