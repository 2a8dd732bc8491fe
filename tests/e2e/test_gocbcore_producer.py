"""gocbcore's own DCP agent (v10.8.1, tests/gocbcore/main.go) streams the test producer.

The Go program streams every vbucket of the simulated bucket from seqno 0 and prints, per
vbucket, the final state of each key. What it received must equal the simulator's truth file
(documents.jsonl): the same keys, values, xattrs, seqnos, rev seqnos, CAS, flags and expiry.
An independent client accepting the producer is what proves the producer speaks DCP.

The Go binary is built once and cached under ``.cache/go-build-out/<hash of go.sum+main.go>``
(the first build downloads nothing, it takes about a minute on two cores).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.protocol import Datatype
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from dcp_cdc.xattrs import split_xattrs

ROOT = Path(__file__).resolve().parents[2]
GO_DIR = ROOT / "tests" / "gocbcore"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("go") is None,
        reason="the gocbcore check needs the Go toolchain (go not on PATH)",
    ),
]


@pytest.fixture(scope="module")
def gocbcore_check() -> Path:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((GO_DIR / name).read_bytes())
    out = ROOT / ".cache" / "go-build-out" / digest.hexdigest()[:16] / "gocbcorecheck"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        env = {**os.environ, "GOFLAGS": "-mod=mod"}
        subprocess.run(
            ["go", "build", "-o", str(tmp), "."], cwd=GO_DIR, check=True, env=env, timeout=600
        )
        tmp.replace(out)
    return out


def _truth_by_vbucket(folder: Path) -> dict[int, dict[tuple[int, bytes], dict[str, Any]]]:
    out: dict[int, dict[tuple[int, bytes], dict[str, Any]]] = {}
    for line in (folder / "truth" / "documents.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        key = rec["key"].encode() if "key" in rec else base64.b64decode(rec["key_b64"])
        value = rec["value"].encode() if "value" in rec else base64.b64decode(rec["value_b64"])
        out.setdefault(rec["vbucket"], {})[(rec["collection_id"], key)] = {
            "seqno": rec["seqno"],
            "rev_seqno": rec["rev_seqno"],
            "cas": rec["cas"],
            "flags": rec["flags"],
            "expiry": rec["expiry"],
            "value": value,
            "xattrs": rec["xattrs"] or {},
            "is_json": rec["is_json"],
        }
    return out


def _received_by_vbucket(
    result: dict[str, Any],
) -> dict[int, dict[tuple[int, bytes], dict[str, Any]]]:
    out: dict[int, dict[tuple[int, bytes], dict[str, Any]]] = {}
    for vb, state in result["vbuckets"].items():
        docs = out.setdefault(int(vb), {})
        for d in state["docs"]:
            raw = base64.b64decode(d["value"] or "")
            assert not d["datatype"] & Datatype.SNAPPY, "gocbcore hands values decompressed"
            xattrs, body = split_xattrs(raw) if d["datatype"] & Datatype.XATTR else ({}, raw)
            docs[(d["collection_id"], base64.b64decode(d["key"]))] = {
                "seqno": d["seqno"],
                "rev_seqno": d["rev_seqno"],
                "cas": d["cas"],
                "flags": d["flags"],
                "expiry": d["expiry"],
                "value": body,
                "xattrs": xattrs,
                "is_json": bool(d["datatype"] & Datatype.JSON),
            }
    return out


async def _stream_with_gocbcore(
    binary: Path, tmp: Path, *, live: bool
) -> tuple[dict[str, Any], ProducerServer]:
    config = SimConfig(scenario="mixed", seed=15, vbuckets=64, docs=1500, ops=3000)
    users = {"dcp-reader": "s3cret-Pass"}
    async with ProducerServer(config, nodes=4, users=users) as server:
        workload = asyncio.create_task(server.run_workload(3000, batch=100, pause_s=0.01))
        if not live:
            await workload
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            "-connstr",
            server.connection_string,
            "-bucket",
            config.bucket,
            "-user",
            "dcp-reader",
            "-password",
            "s3cret-Pass",
            "-out",
            str(tmp / "gocbcore.json"),
            "-timeout",
            "60s",
            "-buffer",
            str(64 * 1024),  # small: flow control stops and resumes the producer often
            *(["-live", "-settle", "700ms"] if live else []),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        await workload
        assert proc.returncode == 0, err.decode()[-3000:]
        server.write_truth(tmp)
        # flow control: never more than the buffer plus the one frame that crossed it
        assert 0 < server.cluster.peak_unacked <= 64 * 1024 + 4096
        result = json.loads((tmp / "gocbcore.json").read_text())
        return result, server


@pytest.mark.parametrize("live", [False, True], ids=["backfill", "live-workload"])
def test_gocbcore_streams_the_producer_and_sees_the_truth(
    gocbcore_check: Path, tmp_path: Path, live: bool
) -> None:
    result, server = asyncio.run(_stream_with_gocbcore(gocbcore_check, tmp_path, live=live))
    truth = _truth_by_vbucket(tmp_path)
    received = _received_by_vbucket(result)
    bucket = server.sim.bucket
    assert sorted(received) == list(range(64))
    for vb in bucket.vbuckets:
        state = result["vbuckets"][str(vb.vbid)]
        assert state["last_seqno"] == vb.high_seqno, f"vbucket {vb.vbid}"
        if not live:
            assert state["end"] == "ok", f"vbucket {vb.vbid}: {state['end']}"
        assert received[vb.vbid] == truth.get(vb.vbid, {}), f"vbucket {vb.vbid}"
    total = sum(len(v) for v in received.values())
    assert total == sum(len(v) for v in truth.values()) > 1000
    # the load had what the check is about: several collections, xattrs, binary values,
    # and deletions and expirations that removed keys gocbcore had seen
    docs = [d for v in received.values() for d in v.values()]
    assert len({cid for v in received.values() for cid, _ in v}) >= 4
    assert any(d["xattrs"] for d in docs) and any(not d["is_json"] for d in docs)
    assert sum(s["items"] for s in result["vbuckets"].values()) > total
    assert server.sim.bucket.live_collections()
