"""The simulated bucket's time: simulated time from a start (the same seed gives the same data
relative to it), or the wall clock of what serves the bucket, so that a served bucket's CAS
times and expiries are today's and its documents with a TTL stay live until their expiry."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.protocol import HLC_COUNTER_MASK
from dcp_cdc.simulator import simulate
from dcp_cdc.simulator.model import NS, Bucket
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import START_NS, SimConfig
from pipelines.app.cli import main
from pipelines.app.demo import DEMO_NODES, demo_simulation


def _documents(out: Path) -> list[dict[str, Any]]:
    text = (out / "truth" / "documents.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _hlc_time(cas: int) -> int:
    return cas & ~HLC_COUNTER_MASK


def test_a_bucket_on_a_wall_clock_dates_each_change_by_it() -> None:
    wall = [1_900_000_000 * NS + 123_456_789]
    bucket = Bucket(
        name="b", vbuckets=1, rng=random.Random(5), start_ns=START_NS, clock=lambda: wall[0]
    )
    simulated = Bucket(name="b", vbuckets=1, rng=random.Random(5), start_ns=START_NS)
    doc = bucket.upsert(0, b"k1", b"{}", is_json=True, ttl=60)
    assert _hlc_time(doc.cas) == _hlc_time(wall[0])
    assert doc.expiry == wall[0] // NS + 60  # the TTL counts from the change
    bucket.tick()
    simulated.tick()
    assert bucket.clock_ns == wall[0]  # ticks leave a wall clock's time alone...
    assert bucket.rng.random() == simulated.rng.random()  # ...but draw the same numbers
    assert bucket.due_for_expiry(10) == []
    wall[0] += 61 * NS
    assert [d.key for d in bucket.due_for_expiry(10)] == [b"k1"]  # due by the wall clock
    gone = bucket.remove(0, b"k1", change="expire")
    assert gone is not None and gone.delete_time == wall[0] // NS
    wall[0] -= 30 * NS  # the wall clock stepped back: the bucket's time does not
    later = bucket.upsert(0, b"k2", b"{}", is_json=True)
    assert later.cas > gone.cas and bucket.clock_ns == wall[0] + 30 * NS


def test_a_seed_gives_the_same_data_relative_to_the_start(tmp_path: Path) -> None:
    """Two starts 1,280 s apart (a whole number of the HLC counter's 2^16 ns): every
    document's CAS and expiry shift by exactly that, all else is equal."""
    shift_s = 1280
    config = SimConfig(scenario="ttl", seed=8, vbuckets=4, docs=120, ops=400)
    later = dataclasses.replace(config, start_ns=config.start_ns + shift_s * NS)
    simulate(tmp_path / "a", config)
    simulate(tmp_path / "b", later)
    first, second = _documents(tmp_path / "a"), _documents(tmp_path / "b")
    assert len(first) > 50 and any(d["expiry"] for d in first)

    def relative(d: dict[str, Any], start_s: int) -> tuple[object, ...]:
        expiry = d["expiry"] - start_s if d["expiry"] else 0
        cas = d["cas"] - (config.start_ns + start_s * NS)
        return (
            d["collection_id"],
            d.get("key", d.get("key_b64")),
            d["seqno"],
            d["rev_seqno"],
            cas,
            expiry,
        )

    assert [relative(d, 0) for d in first] == [relative(d, shift_s) for d in second]


def test_a_served_bucket_is_made_now_and_its_ttls_count_from_now(tmp_path: Path) -> None:
    """The test producer's bucket (the demo's, ``make run``'s): its CAS times are within the
    seconds it took to make and change it, however the configuration's start reads, and each
    document with a TTL is live (its expiry ahead of the wall clock, as the silver views
    count it) rather than a year past."""
    before = time.time()
    server = ProducerServer(SimConfig(scenario="mixed", seed=3, vbuckets=8, docs=400))
    server.changes(600)  # the pager runs every 100th change
    server.write_truth(tmp_path)
    after = time.time()
    assert before * NS <= server.config.start_ns <= after * NS
    docs = _documents(tmp_path)
    assert len(docs) > 300
    for d in docs:
        assert before - 1 <= d["cas"] / NS <= after + 1, d
    with_ttl = [d for d in docs if d["expiry"]]
    assert len(with_ttl) > 50  # the route collection's max TTL gives each of its documents one
    assert all(d["expiry"] > after and not d["expired"] for d in with_ttl)


def test_a_served_bucket_keeps_up_with_the_wall_clock_while_it_changes() -> None:
    """A burst of changes does not run the bucket's clock ahead (no simulated seconds for the
    pager), nor does a pause leave it behind."""
    server = ProducerServer(demo_simulation("b"), nodes=DEMO_NODES)
    server.changes(2000)
    assert server.sim.bucket.last_cas / NS <= time.time() + 1
    time.sleep(0.3)
    server.changes(1)
    assert server.sim.bucket.last_cas / NS >= time.time() - 0.25


def test_a_server_on_simulated_time_starts_at_the_configured_start() -> None:
    server = ProducerServer(SimConfig(vbuckets=4, docs=50), clock=None)
    assert server.config.start_ns == START_NS
    assert START_NS < server.sim.bucket.last_cas < START_NS + 60 * NS


def test_the_simulate_command_makes_its_bucket_now_unless_given_a_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--seed", "4", "--vbuckets", "4", "--docs", "40", "--ops", "80"]
    before = time.time_ns()
    assert main([*args, "--out", str(tmp_path / "now")]) == 0
    after = time.time_ns()
    summary = json.loads((tmp_path / "now" / "truth" / "summary.json").read_text())
    assert before <= summary["config"]["start_ns"] <= after
    assert min(d["cas"] for d in _documents(tmp_path / "now")) >= before
    pinned = [*args, "--start", "2026-01-05T09:30:00Z"]
    assert main([*pinned, "--out", str(tmp_path / "a")]) == 0
    assert main([*pinned, "--out", str(tmp_path / "b")]) == 0
    a, b = tmp_path / "a" / "landing", tmp_path / "b" / "landing"
    files = sorted(p.name for p in a.glob("*.dcpcap"))
    assert files and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    summary = json.loads((tmp_path / "a" / "truth" / "summary.json").read_text())
    assert summary["config"]["start_ns"] == START_NS
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--out", str(tmp_path / "bad"), "--start", "yesterday"])
    assert "expected an ISO 8601 time" in capsys.readouterr().err
