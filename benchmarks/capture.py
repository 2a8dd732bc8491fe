"""Capture: the test producer → the capture agent → capture files, at 1M and 10M frames.

The producer (``python -m dcp_cdc.simulator.server --bulk-docs N``: 4 data nodes, 64
vbuckets, N small JSON documents made in bulk) runs in its own process; the agent is the real
command line, ``dcp-cdc capture --until now``, in another, so the two share the machine's two
cores. Reported per size: frames and bytes written, the agent's wall time, its CPU time (user
+ system, from ``wait4``) and frames per agent CPU second (the issue's "per core": the agent
is one thread), MB/s, and the agent's peak RSS (``ru_maxrss``). The goal: at least 250,000
frames/s per core, and memory that does not grow with the bucket.

``--metrics off,on`` (the default) runs each size twice, in that order: with the agent's
metrics off, then on (its section's ``metrics_port`` set, and ``/metrics`` scraped every
``--scrape-interval`` seconds from this process while the agent runs, as a Prometheus
server would, only more often); the goal there: on within 5 % of off, in frames per agent CPU
second (docs/metrics.md, "What it costs"). ``--repeat N`` measures each pair N times and
reports the medians.

    python -m benchmarks.capture [--sizes 1000000 10000000] [--body-bytes 64]
        [--metrics off,on] [--repeat 1] [--scrape-interval 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS

HEADER = struct.Struct(">BBHBBHIIQ")


def count_frames(landing: Path) -> tuple[int, int]:
    """(frames, bytes) in every capture file of ``landing``: a walk over the frame headers."""
    from dcp_cdc.capture import read_capture_header

    frames = size = 0
    for path in sorted(landing.glob("*.dcpcap")):
        _, start = read_capture_header(path)
        data = path.read_bytes()
        size += len(data)
        at, end = start, len(data)
        while at + 24 <= end:
            at += 24 + int.from_bytes(data[at + 8 : at + 12], "big")
            frames += 1
        assert at == end, f"{path.name}: a cut frame at {at}"
    return frames, size


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class Scraper:
    """GET ``/metrics`` of ``port`` every ``interval`` seconds in a thread, until stopped;
    counts the answers (the agent listens a moment after it starts: refusals before are not
    counted)."""

    def __init__(self, port: int, interval: float) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.scrapes = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    self.bytes += len(answer.read())
                self.scrapes += 1
            except OSError:
                continue  # not listening yet, or gone at the end of its run


def run_size(
    docs: int, body_bytes: int, work: Path, *, metrics: bool = False, scrape_s: float = 1.0
) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port_file = work / "producer.json"
    producer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dcp_cdc.simulator.server",
            "--nodes",
            "4",
            "--vbuckets",
            "64",
            "--docs",
            "1",
            "--ops",
            "0",
            "--bulk-docs",
            str(docs),
            "--body-bytes",
            str(body_bytes),
            "--users",
            "bench:bench-password",
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        while not port_file.exists():
            assert producer.poll() is None, "the producer exited"
            time.sleep(0.05)
        info = json.loads(port_file.read_text())
        landing = work / "landing"
        config = work / "capture.toml"
        port = free_port()
        config.write_text(
            f'landing = "{landing}"\nwarehouse = "{work / "warehouse"}"\n'
            f'[[buckets]]\nname = "{info["bucket"]}"\n[buckets.capture]\n'
            f'connection_string = "{info["connection_string"]}"\nusername = "bench"\n'
            'password_env = "DCP_CDC_BENCH_PASSWORD"\n'
            + (f"metrics_port = {port}\n" if metrics else ""),
            encoding="utf-8",
        )
        env = {**os.environ, "DCP_CDC_BENCH_PASSWORD": "bench-password"}
        scraper = Scraper(port, scrape_s)
        started = time.perf_counter()
        agent = subprocess.Popen(
            [sys.executable, "-m", "pipelines.app.cli", "capture", "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        if metrics:
            with scraper:
                _, status, usage = os.wait4(agent.pid, 0)
        else:
            _, status, usage = os.wait4(agent.pid, 0)
        wall = time.perf_counter() - started
        agent.returncode = os.waitstatus_to_exitcode(status)
        out = agent.stdout.read() if agent.stdout else ""
        assert agent.returncode == 0, out
    finally:
        producer.send_signal(signal.SIGTERM)
        producer.wait(timeout=120)
    frames, size = count_frames(landing)
    cpu = usage.ru_utime + usage.ru_stime
    result = {
        "metrics": "on" if metrics else "off",
        "scrapes": scraper.scrapes,
        "documents": docs,
        "frames": frames,
        "bytes": size,
        "files": len(list(landing.glob("*.dcpcap"))),
        "agent_wall_s": round(wall, 2),
        "agent_cpu_s": round(cpu, 2),
        "frames_per_cpu_s": round(frames / cpu),
        "frames_per_wall_s": round(frames / wall),
        "mb_per_cpu_s": round(size / cpu / 1e6, 1),
        "agent_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "summary": out.strip().splitlines(),
    }
    shutil.rmtree(work, ignore_errors=True)
    return result


def _variants(text: str) -> list[bool]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or set(names) - {"off", "on"}:
        raise argparse.ArgumentTypeError(f"expected off, on or off,on; got {text!r}")
    return [v == "on" for v in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capture")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--body-bytes", type=int, default=64)
    parser.add_argument(
        "--metrics",
        type=_variants,
        default=[False, True],
        help="off, on, or off,on (the default): the agent's metrics endpoint, scraped",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size and variant")
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="seconds between two scrapes"
    )
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="dcp-cdc-bench-capture-") as tmp:
        for docs in args.sizes:
            for run in range(args.repeat):
                for metrics in args.metrics:  # interleaved: drift of the machine hits both
                    r = run_size(
                        docs,
                        args.body_bytes,
                        Path(tmp) / str(docs),
                        metrics=metrics,
                        scrape_s=args.scrape_interval,
                    )
                    r["run"] = run
                    results.append(r)
                    scraped = f", {r['scrapes']} scrapes" if metrics else ""
                    print(
                        f"{r['frames']:>11,} frames {r['bytes'] / 1e6:>8.1f} MB in "
                        f"{r['files']} files, metrics {r['metrics']}{scraped}: "
                        f"agent {r['agent_wall_s']:.1f} s wall, {r['agent_cpu_s']:.1f} s CPU -> "
                        f"{r['frames_per_cpu_s']:,} frames/s per core ({r['mb_per_cpu_s']} MB/s), "
                        f"{r['frames_per_wall_s']:,} frames/s wall; peak RSS "
                        f"{r['agent_peak_rss_mib']} MiB",
                        flush=True,
                    )
    comparison = compare(results)
    for line in comparison["lines"]:
        print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {"runs": results, "metrics_on_vs_off": comparison["sizes"]}
    (RESULTS / "capture.json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per size with both variants: the medians of frames per agent CPU second and of wall
    seconds, and on against off (the goal: at most 5 % slower)."""
    sizes, lines = [], []
    for docs in sorted({r["documents"] for r in results}):
        of_size = [r for r in results if r["documents"] == docs]
        medians = {}
        for variant in ("off", "on"):
            runs = [r for r in of_size if r["metrics"] == variant]
            if runs:
                medians[variant] = (
                    statistics.median(r["frames_per_cpu_s"] for r in runs),
                    statistics.median(r["agent_wall_s"] for r in runs),
                )
        if len(medians) < 2:
            continue
        (off_rate, off_wall), (on_rate, on_wall) = medians["off"], medians["on"]
        change = on_rate / off_rate - 1  # -0.03: 3 % fewer frames per CPU second with metrics
        within = change >= -0.05
        sizes.append(
            {
                "documents": docs,
                "frames_per_cpu_s_off": off_rate,
                "frames_per_cpu_s_on": on_rate,
                "agent_wall_s_off": off_wall,
                "agent_wall_s_on": on_wall,
                "frames_per_cpu_s_change": round(change, 4),
                "within_5_percent": within,
            }
        )
        lines.append(
            f"{docs:>11,} documents: metrics on {on_rate:,.0f} frames/s per core against "
            f"{off_rate:,.0f} off ({change:+.1%}; wall {on_wall:.1f} s against "
            f"{off_wall:.1f} s): {'within' if within else 'NOT within'} 5 %"
        )
    return {"sizes": sizes, "lines": lines}


if __name__ == "__main__":
    raise SystemExit(main())
