"""The bucket simulator: its captures decode, its invariants hold, and its truth is right.

The truth is checked against :mod:`tests.support.reference_consumer`, a naive consumer of the decoded
captures; negative controls show that a consumer breaking a rule would not match it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.capture import iter_capture
from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import Deletion, Event, Expiration, Mutation, SnapshotMarker, SystemEvent
from dcp_cdc.simulator import SCENARIOS, SimulationResult, simulate
from dcp_cdc.simulator.model import vbucket_of
from dcp_cdc.simulator.scenarios import SCENARIO_FUNCS
from pipelines.app.cli import main
from tests.support.reference_consumer import ReferenceConsumer, capture_files

SMALL = {"vbuckets": 16, "docs": 300, "ops": 1200, "collections": 3}


@pytest.fixture(scope="module")
def scenario_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimulationResult]:
    runs = {}
    for name in SCENARIOS:
        out = tmp_path_factory.mktemp(name)
        runs[name] = simulate(out, scenario=name, seed=11, inject_malformed=1, **SMALL)
    return runs


def _truth(
    result: SimulationResult,
) -> tuple[dict[str, Any], dict[tuple[int, bytes], dict[str, Any]]]:
    summary = json.loads(result.truth.read_text())
    docs = {}
    for line in (result.out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"].encode() if "key" in d else base64.b64decode(d["key_b64"])
        docs[(d["collection_id"], key)] = d
    return summary, docs


def _events(result: SimulationResult) -> list[tuple[Path, Event | MalformedFrameError]]:
    return [(p, e) for p in capture_files(result.out / "landing") for e in iter_capture(p)]


def _matches_truth(
    consumer: ReferenceConsumer, docs: dict[tuple[int, bytes], dict[str, Any]]
) -> bool:
    state = consumer.state()
    return {k: (v.seqno, v.rev_seqno) for k, v in state.items()} == {
        k: (d["seqno"], d["rev_seqno"]) for k, d in docs.items()
    }


@pytest.mark.parametrize("name", SCENARIOS)
def test_captures_decode_with_only_the_injected_errors(
    scenario_runs: dict[str, SimulationResult], name: str
) -> None:
    result = scenario_runs[name]
    summary, _ = _truth(result)
    errors = [
        (p.name, e.offset, e.reason)
        for p, e in _events(result)
        if isinstance(e, MalformedFrameError)
    ]
    assert errors == [(e["file"], e["offset"], e["reason"]) for e in summary["expected_errors"]]
    counts: dict[str, int] = defaultdict(int)
    for _, e in _events(result):
        if not isinstance(e, MalformedFrameError):
            counts[e.op] += 1
    expected = {
        k: v for k, v in summary["event_counts"].items() if k not in ("malformed", "truncated")
    }
    assert dict(counts) == expected


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_consumer_ends_with_the_truth(tmp_path: Path, name: str, seed: int) -> None:
    result = simulate(tmp_path, scenario=name, seed=seed, vbuckets=8, docs=120, ops=500)
    summary, docs = _truth(result)
    consumer = ReferenceConsumer()
    consumer.consume(tmp_path / "landing")
    assert _matches_truth(consumer, docs)
    live = consumer.state()
    for ident, d in docs.items():  # the whole document, not only its seqno
        v = live[ident]
        body = d["value"].encode() if "value" in d else base64.b64decode(d["value_b64"])
        assert (v.value, v.xattrs, v.expiry, v.cas, v.flags) == (
            body,
            d["xattrs"],
            d["expiry"],
            d["cas"],
            d["flags"],
        )
    consistent = {vb: s.consistent for vb, s in consumer.streams.items()}
    for vb in summary["vbuckets"]:
        assert consistent.get(vb["vbucket"], 0) == vb["last_consistent_seqno"]


def test_same_seed_gives_byte_identical_captures(tmp_path: Path) -> None:
    def digest(out: Path) -> dict[str, str]:
        return {
            p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }

    a = simulate(tmp_path / "a", scenario="mixed", seed=5, inject_malformed=1, **SMALL)
    b = simulate(tmp_path / "b", scenario="mixed", seed=5, inject_malformed=1, **SMALL)
    c = simulate(tmp_path / "c", scenario="mixed", seed=6, inject_malformed=1, **SMALL)
    assert digest(a.out) == digest(b.out)
    assert digest(a.out) != digest(c.out)


def _by_stream(result: SimulationResult) -> dict[tuple[str, int], list[Event]]:
    """Data events per (session, vbucket), in wire order."""
    streams: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for path, e in _events(result):
        if isinstance(e, MalformedFrameError) or e.header.vbucket is None:
            continue
        session = path.name.rsplit("-", 1)[0]
        streams[(session, e.header.vbucket)].append(e)
    return streams


@pytest.mark.parametrize("name", SCENARIOS)
def test_seqnos_strictly_increase_per_vbucket_outside_oso(
    scenario_runs: dict[str, SimulationResult], name: str
) -> None:
    for events in _by_stream(scenario_runs[name]).values():
        last = -1
        in_oso = False
        for e in events:
            if e.op == "oso_snapshot":
                in_oso = e.is_start  # type: ignore[union-attr]
                continue
            if e.op == "stream_end":
                last = -1  # a new stream may restart lower after a rollback
            seqno = getattr(e, "by_seqno", None)
            if seqno is None or in_oso:
                continue
            assert seqno > last
            last = seqno


@pytest.mark.parametrize("name", SCENARIOS)
def test_no_duplicate_key_inside_a_non_history_snapshot(
    scenario_runs: dict[str, SimulationResult], name: str
) -> None:
    duplicates_seen = 0
    for events in _by_stream(scenario_runs[name]).values():
        marker: SnapshotMarker | None = None
        keys: set[tuple[int | None, bytes]] = set()
        for e in events:
            if isinstance(e, SnapshotMarker):
                marker, keys = e, set()
            elif isinstance(e, (Mutation, Deletion, Expiration)) and marker is not None:
                ident = (e.collection_id, e.key)
                if ident in keys:
                    assert marker.snapshot_flags & 0x30 == 0x30, "duplicate key without 0x10|0x20"
                    duplicates_seen += 1
                keys.add(ident)
    if name == "history":
        assert duplicates_seen > 0


def _history(result: SimulationResult) -> list[dict[str, Any]]:
    lines = (result.out / "truth" / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_history_truth_holds_every_version_and_what_was_streamed(
    scenario_runs: dict[str, SimulationResult], name: str
) -> None:
    """``history.jsonl``: each live document's newest version is the truth's document; every
    version a complete snapshot carried is ``streamed`` (none that a rollback retracted or a
    deduplicated snapshot left out); rev seqnos count each key's versions."""
    result = scenario_runs[name]
    _, docs = _truth(result)
    versions = _history(result)
    newest: dict[tuple[int, bytes], dict[str, Any]] = {}
    for v in versions:  # sorted by collection, key and seqno
        key = v["key"].encode() if "key" in v else base64.b64decode(v["key_b64"])
        ident = (v["collection_id"], key)
        if ident in newest:
            assert v["seqno"] > newest[ident]["seqno"]
            # one more, or 1: a new document after a flush of the collection
            assert v["rev_seqno"] in (newest[ident]["rev_seqno"] + 1, 1)
        newest[ident] = v
    ends = {  # a drop or flush of the collection in the vbucket ends every older version
        (vb["vbucket"], e["collection_id"], e["seqno"])
        for vb in json.loads(result.truth.read_text())["vbuckets"]
        for e in vb["collection_ends"]
    }
    live = {
        k: (v["seqno"], v["cas"])
        for k, v in newest.items()
        if not v["deleted"]
        and not any(vb == v["vbucket"] and c == k[0] and s > v["seqno"] for vb, c, s in ends)
    }
    assert {k: (d["seqno"], d["cas"]) for k, d in docs.items()} == live
    # what the consumer received in complete snapshots: every mutation and deletion frame
    # that a marker's end (or the stream's next marker) closed, less what a rollback retracted
    streamed = {(v["vbucket"], v["seqno"]) for v in versions if v["streamed"]}
    assert streamed and streamed < {(v["vbucket"], v["seqno"]) for v in versions}
    sent = {
        (e.header.vbucket, e.by_seqno)
        for _, e in _events(result)
        if isinstance(e, (Mutation, Deletion, Expiration))
    }
    assert streamed <= sent
    if name == "history":  # the history collection streams every version after the load
        history_cid = min(c for c, _ in newest if c != 0)
        assert all(v["streamed"] for v in versions if v["collection_id"] == history_cid)


def test_drop_events_reach_every_vbucket(scenario_runs: dict[str, SimulationResult]) -> None:
    result = scenario_runs["collection-lifecycle"]
    summary, docs = _truth(result)
    drops: dict[int, set[int]] = defaultdict(set)
    for _, e in _events(result):
        if isinstance(e, SystemEvent) and e.event == "drop_collection":
            assert e.collection_id is not None and e.header.vbucket is not None
            drops[e.collection_id].add(e.header.vbucket)
    assert set(drops) == set(summary["dropped_collections"]) and drops
    for vbuckets in drops.values():
        assert vbuckets == set(range(SMALL["vbuckets"]))
    assert not [k for k in docs if k[0] in drops]


def test_after_a_rollback_the_truth_has_no_rolled_back_changes(
    scenario_runs: dict[str, SimulationResult],
) -> None:
    result = scenario_runs["rollback"]
    _, docs = _truth(result)
    rollbacks = [e for _, e in _events(result) if getattr(e, "rollback_seqno", None) is not None]
    assert len(rollbacks) == 2
    rolled = {e.header.opaque: e.rollback_seqno for e in rollbacks}  # type: ignore[union-attr]
    lost_cas = set()  # versions the consumer received on the branch that was lost
    for events in _by_stream(result).values():
        for e in events:
            vb = e.header.vbucket
            if e.op == "stream_end" and vb in rolled:
                break
            if isinstance(e, Mutation) and vb in rolled and e.by_seqno > rolled[vb]:
                lost_cas.add(e.header.cas)
    assert lost_cas
    assert not lost_cas & {d["cas"] for d in docs.values()}
    # negative control: a consumer that ignores the rollback ends elsewhere
    naive = ReferenceConsumer()
    naive.rollback = lambda vb, seqno: None  # type: ignore[method-assign]
    naive.consume(result.out / "landing")
    assert not _matches_truth(naive, docs)


def test_negative_controls_break_the_truth(scenario_runs: dict[str, SimulationResult]) -> None:
    """Each rule matters: a consumer that drops it does not end with the truth."""
    lifecycle = scenario_runs["collection-lifecycle"]
    _, docs = _truth(lifecycle)
    consumer = ReferenceConsumer()
    consumer.consume(lifecycle.out / "landing")
    assert _matches_truth(consumer, docs)
    for stream in consumer.streams.values():  # forget every drop and flush
        stream.log = [v for v in stream.log if not isinstance(v, SystemEvent)]
    assert not _matches_truth(consumer, docs)

    interrupted = scenario_runs["interrupted"]
    _, docs = _truth(interrupted)
    eager = ReferenceConsumer()
    eager.consume(interrupted.out / "landing")
    for vb in list(eager.streams):
        eager.complete(vb)  # apply the open snapshot's tail as if it were complete
    assert not _matches_truth(eager, docs)


def test_interrupted_reports_the_open_snapshot_and_a_cut_tail(
    scenario_runs: dict[str, SimulationResult],
) -> None:
    result = scenario_runs["interrupted"]
    summary, _ = _truth(result)
    (open_snapshot,) = summary["open_snapshots"]
    assert open_snapshot["start"] <= open_snapshot["last_seqno"] < open_snapshot["end"]
    cut = [e for _, e in _events(result) if isinstance(e, TruncatedFrameError)]
    assert len(cut) == 1 and cut[0].available > 0


def test_oso_backfill_is_in_key_order_and_filtered(
    scenario_runs: dict[str, SimulationResult],
) -> None:
    result = scenario_runs["oso-backfill"]
    summary, docs = _truth(result)
    (target,) = summary["streamed_collections"]
    assert {k[0] for k in docs} == {target}
    for events in _by_stream(result).values():
        inside, keys = False, []
        for e in events:
            if e.op == "oso_snapshot":
                if e.is_end:  # type: ignore[union-attr]
                    assert keys == sorted(keys)
                inside, keys = e.is_start, []  # type: ignore[union-attr]
            elif inside and isinstance(e, Mutation):
                assert e.collection_id == target
                keys.append(e.key)
            if isinstance(e, (Mutation, Deletion, Expiration)):
                assert e.collection_id == target


def test_ttl_scenario_streams_expired_documents_before_the_pager(
    scenario_runs: dict[str, SimulationResult],
) -> None:
    result = scenario_runs["ttl"]
    summary, _ = _truth(result)
    events = [e for _, e in _events(result) if not isinstance(e, MalformedFrameError)]
    expirations = [e for e in events if isinstance(e, Expiration)]
    assert expirations
    first_expiry = {(e.collection_id, e.key): e.by_seqno for e in reversed(expirations)}
    stale = [
        e
        for e in events
        if isinstance(e, Mutation)
        and e.expiration
        and (e.collection_id, e.key) in first_expiry
        and e.by_seqno < first_expiry[(e.collection_id, e.key)]
        and e.expiration <= summary["as_of_unix"]
    ]
    assert stale, "an expired document streamed as a mutation before its expiration"


def test_vbucket_mapping_is_couchbase_crc32() -> None:
    for key in (b"hello", b"airline_10", "ключ".encode()):
        assert vbucket_of(key, 1024) == ((zlib.crc32(key) >> 16) & 0x7FFF) % 1024
    assert {vbucket_of(f"k{i}".encode(), 64) for i in range(5000)} == set(range(64))


def test_1024_vbuckets_and_file_rotation(tmp_path: Path) -> None:
    result = simulate(
        tmp_path,
        scenario="basic",
        seed=2,
        vbuckets=1024,
        docs=2000,
        ops=1000,
        max_file_bytes=256 * 1024,
    )
    assert len(result.files) > 2
    sequences = [
        json.loads(p.read_bytes()[12 : 12 + int.from_bytes(p.read_bytes()[8:12], "big")])[
            "sequence"
        ]
        for p in result.files
        if "-s01-" in p.name
    ]
    assert sequences == list(range(len(sequences)))
    consumer = ReferenceConsumer()
    consumer.consume(tmp_path / "landing")
    assert _matches_truth(consumer, _truth(result)[1])


def test_simulate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "simulate",
            "--out",
            str(tmp_path),
            "--seed",
            "4",
            "--scenario",
            "ttl",
            "--vbuckets",
            "8",
            "--docs",
            "50",
            "--ops",
            "200",
        ]
    )
    assert code == 0
    assert (tmp_path / "truth" / "summary.json").is_file()
    assert list((tmp_path / "landing").glob("*.dcpcap"))
    assert "events/s" in capsys.readouterr().out


@pytest.mark.parametrize(("scenario", "seed"), [("ttl", 3), ("mixed", 3), ("mixed", 11)])
def test_the_pager_finds_exactly_what_a_scan_of_every_document_finds(
    scenario: str, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expiry heap (no scan per pager round) against the scan it replaced, at every
    round; ``mixed`` has max-TTL changes, a failover's rollback, a flush and a drop."""
    from dcp_cdc.simulator import model

    heap_based = model.Bucket.due_for_expiry
    rounds: list[int] = []

    def checked(self: model.Bucket, limit: int) -> list[model.Doc]:
        scan = sorted(
            (
                d
                for vb in self.vbuckets
                for d in vb.docs.values()
                if not d.deleted and 0 < d.expiry <= self.now
            ),
            key=lambda d: (d.vbucket, d.seqno),
        )[:limit]
        got = heap_based(self, limit)
        assert got == scan
        rounds.append(len(got))
        return got

    monkeypatch.setattr(model.Bucket, "due_for_expiry", checked)
    simulate(
        tmp_path / "sim", bucket="b", scenario=scenario, seed=seed, vbuckets=8, docs=200, ops=3000
    )
    assert rounds and sum(rounds) > 0  # the pager did expire documents


def test_due_for_expiry_keeps_what_it_did_not_hand_out() -> None:
    import random

    from dcp_cdc.simulator.model import Bucket

    bucket = Bucket(name="b", vbuckets=1, rng=random.Random(5), start_ns=10**18)
    for i in range(5):
        bucket.upsert(0, f"k{i}".encode(), b"{}", is_json=True, ttl=10)
    bucket.upsert(0, b"k1", b"{}", is_json=True)  # no TTL any more: never due
    assert bucket.due_for_expiry(2) == []
    bucket.advance(11)
    first = bucket.due_for_expiry(2)
    assert [d.key for d in first] == [b"k0", b"k2"]
    assert bucket.due_for_expiry(2) == first  # not removed: still due, still first
    for d in first:
        bucket.remove(0, d.key, change="expire")
    assert [d.key for d in bucket.due_for_expiry(10)] == [b"k3", b"k4"]


def test_every_scenario_name_has_a_script() -> None:
    assert tuple(SCENARIO_FUNCS) == SCENARIOS


def test_a_simulation_makes_as_many_collections_as_asked(tmp_path: Path) -> None:
    """Past the six named ones, collections are numbered; each takes a share of the load,
    and the truth names them all."""
    result = simulate(
        tmp_path, scenario="basic", seed=3, vbuckets=8, docs=340, ops=0, collections=16
    )
    summary, _ = _truth(result)
    names = [c["name"] for c in summary["collections"] if c["scope"] == "inventory"]
    assert len(names) == len(set(names)) == 16
    assert names[:6] == ["airline", "route", "hotel-reviews", "orders%2026", "landmark", "airport"]
    assert names[6:8] == ["events-07", "events-08"]
    per_collection = {c["collection_id"]: c["live_documents"] for c in summary["collections"]}
    assert all(n == 20 for n in per_collection.values()), per_collection  # 340 over 17


def test_collections_past_the_limit_are_refused() -> None:
    from dcp_cdc.errors import ConfigError
    from dcp_cdc.simulator.state import SimConfig

    with pytest.raises(ConfigError, match=r"collections: expected 1\.\.64, got 65"):
        SimConfig(collections=65)
