"""What follow mode knows of each bucket between micro-batches, and the status line a person
watching reads after each: the lag (the seqnos captured, from the agent's checkpoint, that
silver has not reached yet, summed over vbuckets), the events per second, the age of what
silver holds, and how far silver is behind the bucket per change (freshness,
:mod:`pipelines.observe.freshness`) in the last batch and over the last minute.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.config import BucketConfig
from pipelines.bronze.plan import HeldBack
from pipelines.follow.agent import captured_seqnos
from pipelines.observe.freshness import ChangeTimes, window_quantile

RATE_WINDOW_S = 10.0
"""Events per second are counted over this many seconds of micro-batches."""
FRESHNESS_WINDOW_S = 60.0
"""The status line's freshness p50 and p95 are over the changes merged this many seconds
back."""


@dataclass
class BucketProgress:
    """What follow mode knows of one bucket between micro-batches."""

    bucket: BucketConfig
    checkpoint: Path | str | None
    """The capture agent's checkpoint, when the bucket has one (the lag is read from it): a
    path, or an ``s3://`` URI (read with ``s3``'s options)."""
    applied: dict[int, int] = field(default_factory=dict)
    """vbucket -> the consistent seqno silver reached."""
    batches: int = 0
    frames: int = 0
    unapplied: bool = True
    """Bronze may hold frames silver has not consumed (at the start: a run before ours)."""
    as_of: float | None = None
    """Wall time: silver holds every file that had landed by then."""
    window: deque[tuple[float, int]] = field(default_factory=deque)
    s3: S3Options | None = None
    freshness: deque[ChangeTimes] = field(default_factory=deque)
    """The CAS times of the changes of the batches of the last :data:`FRESHNESS_WINDOW_S`."""

    def lag(self) -> tuple[int, int] | None:
        """(seqnos captured but not applied, summed; vbuckets behind), if the capture is known."""
        if self.checkpoint is None:
            return None
        if isinstance(self.checkpoint, Path) and not self.checkpoint.exists():
            return None
        captured = captured_seqnos(self.checkpoint, self.bucket.name, self.s3)
        if not captured:
            return None
        behind = [max(0, s - self.applied.get(vb, 0)) for vb, s in captured.items()]
        return sum(behind), sum(1 for b in behind if b)

    def rate(self, now: float) -> float:
        while self.window and self.window[0][0] < now - RATE_WINDOW_S:
            self.window.popleft()
        return sum(n for _, n in self.window) / RATE_WINDOW_S

    def recent_freshness(self, now: float) -> list[ChangeTimes]:
        """The batches' change times of the last :data:`FRESHNESS_WINDOW_S`."""
        while self.freshness and self.freshness[0].committed_at < now - FRESHNESS_WINDOW_S:
            self.freshness.popleft()
        return list(self.freshness)


@dataclass(frozen=True)
class Batch:
    """One micro-batch of one bucket."""

    bucket: str
    number: int
    frames: int
    ingest_s: float
    apply_s: float
    files: int = 0
    apply_steps: dict[str, float] = field(default_factory=dict)
    """Seconds of each step of its apply (:attr:`pipelines.silver.job.ApplySummary.steps`)."""
    merged: dict[str, int] = field(default_factory=dict)
    """Silver table -> rows its MERGE wrote."""
    change_times: ChangeTimes | None = None
    """The CAS times of the changes its apply committed (None: it committed none)."""
    lag: tuple[int, int] | None = None
    """After it: seqnos captured but not applied, and the vbuckets behind (None: unknown)."""
    held_back: tuple[HeldBack, ...] = ()
    """The landing's files a missing earlier file of their session holds back, as its
    ingest found them."""


def status_line(progress: BucketProgress, batch: Batch, now: float) -> str:
    """One line a person watching reads: the batch, the lag, the rate, the age of silver,
    its freshness."""
    lag = batch.lag
    lag_text = "lag unknown (no capture checkpoint)"
    if lag is not None:
        lag_text = f"lag {lag[0]:,} seqnos in {lag[1]} vbuckets"
    age = now - progress.as_of if progress.as_of is not None else float("nan")
    return (
        f"{time.strftime('%H:%M:%S', time.localtime(now))} {batch.bucket}: batch {batch.number}, "
        f"{batch.frames:,} frames in {batch.files} files (ingest {batch.ingest_s:.1f} s, "
        f"apply {batch.apply_s:.1f} s) | {lag_text} | {progress.rate(now):,.0f} events/s | "
        f"silver {age:.1f} s behind landing | "
        + freshness_text(batch.change_times, progress.recent_freshness(now))
    )


def freshness_text(last: ChangeTimes | None, recent: list[ChangeTimes]) -> str:
    """``silver N s behind the bucket (p50 X s, p95 Y s over the last minute)``: N is the
    median freshness of the changes the last batch merged, X and Y over those of every batch
    of the last minute."""
    if not recent:
        return "no change merged in the last minute"
    head = "no change in this batch"
    if last is not None:
        head = f"silver {last.quantile(0.5):.1f} s behind the bucket"
    p50, p95 = window_quantile(recent, 0.5), window_quantile(recent, 0.95)
    return f"{head} (p50 {p50:.1f} s, p95 {p95:.1f} s over the last minute)"
