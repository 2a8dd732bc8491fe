"""Capture: the test producer → the capture agent → capture files, at 1M and 10M frames.

The producer (``python -m dcp_cdc.simulator.server --bulk-docs N``: 4 data nodes, 64
vbuckets, N small JSON documents made in bulk) runs in its own process; the agent is the real
command line, ``dcp-cdc capture --until now``, in another, so the two share the machine's two
cores. Reported per size: frames and bytes written, the agent's wall time, its CPU time (user
+ system, from ``wait4``) and frames per agent CPU second (the issue's "per core": the agent
is one thread), MB/s, and the agent's peak RSS (``ru_maxrss``). The goal: at least 250,000
frames/s per core, and memory that does not grow with the bucket.

    python -m benchmarks.capture [--sizes 1000000 10000000] [--body-bytes 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
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


def run_size(docs: int, body_bytes: int, work: Path) -> dict[str, Any]:
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
        config.write_text(
            f'landing = "{landing}"\nwarehouse = "{work / "warehouse"}"\n'
            f'[[buckets]]\nname = "{info["bucket"]}"\n[buckets.capture]\n'
            f'connection_string = "{info["connection_string"]}"\nusername = "bench"\n'
            'password_env = "DCP_CDC_BENCH_PASSWORD"\n',
            encoding="utf-8",
        )
        env = {**os.environ, "DCP_CDC_BENCH_PASSWORD": "bench-password"}
        started = time.perf_counter()
        agent = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "capture", "--config", str(config)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capture")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--body-bytes", type=int, default=64)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="dcp-cdc-bench-capture-") as tmp:
        for docs in args.sizes:
            r = run_size(docs, args.body_bytes, Path(tmp) / str(docs))
            results.append(r)
            print(
                f"{r['frames']:>11,} frames {r['bytes'] / 1e6:>8.1f} MB in {r['files']} files: "
                f"agent {r['agent_wall_s']:.1f} s wall, {r['agent_cpu_s']:.1f} s CPU -> "
                f"{r['frames_per_cpu_s']:,} frames/s per core ({r['mb_per_cpu_s']} MB/s), "
                f"{r['frames_per_wall_s']:,} frames/s wall; peak RSS "
                f"{r['agent_peak_rss_mib']} MiB",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "capture.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
