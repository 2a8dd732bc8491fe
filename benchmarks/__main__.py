"""``make bench``: every benchmark in turn, or those named (``make bench ARGS="decode apply"``).

Benchmarks are separate from the tests: they take minutes, build their own inputs under
``benchmarks/.data`` (ignored by git) and write JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import importlib
import sys
import time

# In the order a change flows through the product.
BENCHMARKS = ["decode", "ingest", "apply", "peer", "e2e"]


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {BENCHMARKS}", file=sys.stderr)
        return 2
    for name in names:
        started = time.perf_counter()
        print(f"== benchmarks.{name}", flush=True)
        importlib.import_module(f"benchmarks.{name}").main([])
        print(f"== benchmarks.{name}: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
