"""Named scenarios: scripts of bucket activity and DCP sessions, and the truth they imply.

:func:`simulate` is the Python API (tests use it); ``dcp-cdc simulate`` wraps it. The same
config and seed give byte-identical captures: every choice comes from one seeded RNG and the
simulated clock, never from the machine.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dcp_cdc.errors import ConfigError
from dcp_cdc.protocol import StreamEndReason
from dcp_cdc.simulator.model import VBucket
from dcp_cdc.simulator.state import SCENARIOS, SimConfig, Simulation
from dcp_cdc.simulator.stream import Checkpoint, Session
from dcp_cdc.simulator.truth import write_truth

__all__ = ["SCENARIOS", "SCENARIO_FUNCS", "SimConfig", "SimulationResult", "simulate"]


@dataclass
class SimulationResult:
    out: Path
    files: list[Path]
    truth: Path
    frames: int
    bytes: int
    event_counts: dict[str, int]
    expected_errors: list[dict[str, object]] = field(default_factory=list)


# --- the scenarios -----------------------------------------------------------------------


def basic(sim: Simulation, landing: Path) -> None:
    """Initial load, a session that backfills and streams changes, then a catch-up session
    bounded at the high seqno (its streams end Ok)."""
    sim.setup()
    s1 = sim.open_session(landing)
    s1.open_all()
    sim.backfill_all(s1)
    sim.live(sim.config.ops * 3 // 4)
    sim.finish(s1)
    checkpoints = s1.checkpoints()
    sim.live(sim.config.ops - sim.config.ops * 3 // 4)  # while no one is connected
    catch_up(sim, landing, checkpoints)


def catch_up(
    sim: Simulation, landing: Path, checkpoints: dict[int, Checkpoint], **options: object
) -> None:
    """A session that resumes from ``checkpoints`` and stops at each vbucket's high seqno."""
    s = sim.open_session(landing, **options)
    for vb in sim.bucket.vbuckets:
        start = s.resume(vb, checkpoints[vb.vbid], end=vb.high_seqno)
        if start >= vb.high_seqno:
            s.end_stream(vb.vbid, StreamEndReason.OK)
        else:
            s.backfill(vb)
    sim.finish(s, close_streams=False)


def ttl(sim: Simulation, landing: Path) -> None:
    """TTLs and max TTL: expired documents stream as mutations until the pager expires them."""
    sim.ttl_share = 0.4
    sim.setup(max_ttl=3600)
    sim.bucket.advance(400)  # some TTLs pass before anyone connects: not yet paged
    s = sim.open_session(landing)
    s.open_all()
    sim.backfill_all(s)
    for _ in range(4):
        sim.live(sim.config.ops // 4, pager_every=50)
        sim.bucket.advance(240)
    sim.pager(limit=10**9)
    sim.finish(s)


def collection_lifecycle(sim: Simulation, landing: Path) -> None:
    """Create, modify, flush and drop collections and scopes while streaming (FlatBuffers)."""
    colls = sim.setup()
    s = sim.open_session(landing, flatbuffers=True)
    s.open_all()
    sim.backfill_all(s)
    quarter = max(sim.config.ops // 5, 1)
    sim.live(quarter)
    scope = sim.manifest(lambda: sim.bucket.create_scope("tenant-b%1"))
    new = sim.manifest(lambda: sim.bucket.create_collection(scope.scope_id, "orders-2026"))  # type: ignore[attr-defined]
    sim.live(quarter)
    sim.manifest(lambda: sim.bucket.modify_collection(new.collection_id, max_ttl=86400))  # type: ignore[attr-defined]
    sim.manifest(lambda: sim.bucket.flush_collection(colls[0].collection_id))
    sim.live(quarter)
    if len(colls) > 1:
        sim.manifest(lambda: sim.bucket.drop_collection(colls[-1].collection_id))
    sim.live(quarter)
    sim.manifest(lambda: sim.bucket.drop_scope(scope.scope_id))  # type: ignore[attr-defined]
    sim.live(quarter)
    sim.finish(s)


def rollback(sim: Simulation, landing: Path) -> None:
    """A failover loses a vbucket's newest changes: rollback (0x23), then a new branch."""
    sim.setup()
    s = sim.open_session(landing)
    s.open_all()
    sim.backfill_all(s)
    sim.live(sim.config.ops // 2)
    for victim in sorted(sim.bucket.vbuckets, key=lambda v: -len(v.docs))[:2]:
        fail_over(sim, s, victim)
    sim.live(sim.config.ops - sim.config.ops // 2)
    sim.finish(s)


def fail_over(sim: Simulation, s: Session, vb: VBucket) -> None:
    s.flush(vb)
    point = vb.high_seqno
    vb.keep_undo_from = point
    keys = [k for k, d in vb.docs.items() if not d.deleted][:12]
    for cid, key in keys:  # changes the consumer sees but the new active never had
        sim.write_doc(cid, key)
    s.flush(vb)
    s.end_stream(vb.vbid, StreamEndReason.STATE_CHANGED)
    sim.bucket.failover(vb, point)
    s.resume(vb, s.checkpoints()[vb.vbid])
    s.backfill(vb)


def oso_backfill(sim: Simulation, landing: Path) -> None:
    """A stream filtered to one collection, backfilled out of seqno order (docs/protocol/dcp.md §6.9)."""
    colls = sim.setup()
    target = colls[0].collection_id
    sim.streamed_collections = {target}
    s = sim.open_session(landing, oso=True, collection_filter=(target,))
    s.open_all()
    for vb in sim.bucket.vbuckets:
        s.oso_backfill(vb)
    sim.live(sim.config.ops)
    sim.finish(s)


def history(sim: Simulation, landing: Path) -> None:
    """A history collection: snapshots keep every version of a key (flags 0x10|0x20)."""
    colls = sim.setup(history=True)
    s = sim.open_session(landing, change_streams=True)
    s.open_all()
    sim.backfill_all(s)
    cid = colls[0].collection_id
    for i in range(sim.config.ops):
        if i % 10 == 0:  # bursts: one key changed several times inside one snapshot
            key = sim.rng.choice(sim.keys[cid])
            sim.thresholds[sim.bucket.vb_for(key).vbid] = 10**9
            for _ in range(3):
                sim.write_doc(cid, key)
            sim.thresholds.pop(sim.bucket.vb_for(key).vbid)
        else:
            sim.random_op([cid, 0])
    sim.finish(s)


def interrupted(sim: Simulation, landing: Path) -> None:
    """The connection dies mid-snapshot: an open snapshot and a cut last frame."""
    sim.setup()
    s = sim.open_session(landing)
    s.open_all()
    sim.backfill_all(s)
    sim.live(sim.config.ops)
    sim.cut_session(s)


def mixed(sim: Simulation, landing: Path) -> None:
    """Everything at once, over two sessions: TTLs, history, stream-ids, a cut, a resume that
    re-sends, lifecycle events, failovers, tombstone purges, an injected malformed frame."""
    sim.ttl_share = 0.15
    colls = sim.setup(history=True, max_ttl=7200)
    s1 = sim.open_session(landing, stream_ids=True, delete_times=False, change_streams=True)
    s1.open_all()
    sim.backfill_all(s1)
    sim.live(sim.config.ops // 4, pager_every=100)
    early = s1.checkpoints()  # a checkpoint the consumer persisted, older than what it has
    sim.live(sim.config.ops // 4, pager_every=100)
    sim.cut_session(s1)
    sim.cut = False
    sim.bucket.advance(600)
    sim.bucket.purge_tombstones(0.2)
    latest = s1.checkpoints()
    resume = {vb: (early[vb] if vb % 4 == 0 else latest[vb]) for vb in latest}
    s2 = sim.open_session(landing, flatbuffers=True)
    s2.open_all(resume)
    sim.backfill_all(s2)
    sim.live(sim.config.ops // 8, pager_every=100)
    scope = sim.manifest(lambda: sim.bucket.create_scope("tenant-b%1"))
    extra = sim.manifest(lambda: sim.bucket.create_collection(scope.scope_id, "orders-2026"))  # type: ignore[attr-defined]
    sim.live(sim.config.ops // 8, pager_every=100)
    sim.manifest(lambda: sim.bucket.modify_collection(extra.collection_id, max_ttl=600))  # type: ignore[attr-defined]
    if len(colls) > 2:
        sim.manifest(lambda: sim.bucket.flush_collection(colls[2].collection_id))
    fail_over(sim, s2, max(sim.bucket.vbuckets, key=lambda v: len(v.docs)))
    sim.live(sim.config.ops // 8, pager_every=100)
    sim.manifest(lambda: sim.bucket.drop_collection(colls[1].collection_id))
    sim.live(sim.config.ops - 7 * (sim.config.ops // 8), pager_every=100)
    sim.finish(s2)


SCENARIO_FUNCS: dict[str, Callable[[Simulation, Path], None]] = {
    "basic": basic,
    "ttl": ttl,
    "collection-lifecycle": collection_lifecycle,
    "rollback": rollback,
    "oso-backfill": oso_backfill,
    "history": history,
    "interrupted": interrupted,
    "mixed": mixed,
}


def run(sim: Simulation, out: Path) -> SimulationResult:
    """Play ``sim``'s scenario into ``out``: captures under ``landing/``, then the truth."""
    landing = out / "landing"
    if any(landing.glob("*.dcpcap")):
        raise ConfigError(
            f"out: {landing} already holds captures; choose an empty folder so that "
            "sessions of different simulations do not mix"
        )
    landing.mkdir(parents=True, exist_ok=True)
    SCENARIO_FUNCS[sim.config.scenario](sim, landing)
    last = sim.sessions[-1]
    if sim.cut:  # the truth is each vbucket at the end of its last whole snapshot
        for vb in sim.bucket.vbuckets:
            sim.bucket.rewind(vb, last.streams[vb.vbid].consistent)
    files = sorted(p for s in sim.sessions for p in s.writer.paths)
    truth = write_truth(sim, out)
    return SimulationResult(
        out,
        files,
        truth,
        sum(s.frames for s in sim.sessions),
        sum(p.stat().st_size for p in files),
        dict(sim.counts),
        sim.expected_errors,
    )


def simulate(
    out: str | Path, config: SimConfig | None = None, **overrides: object
) -> SimulationResult:
    """Simulate one scenario into ``out`` (``landing/`` captures, ``truth/`` ground truth)."""
    cfg = config or SimConfig(**overrides)  # type: ignore[arg-type]
    if config is not None and overrides:
        cfg = SimConfig(**{**asdict(config), **overrides})
    # Millions of small, acyclic objects (documents, undo entries): the cyclic collector's
    # full passes would dominate the run time as the heap grows, and find nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run(Simulation(cfg), Path(out))
    finally:
        if was_enabled:
            gc.enable()
