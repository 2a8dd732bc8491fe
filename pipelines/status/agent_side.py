"""The stages on the capture agent's side of ``dcp-cdc status``: the agent's checkpoint and the
cluster's high seqnos (no Spark: a small JSON document, and the agent's own connections,
:mod:`dcp_cdc.agent.high_seqnos`). What cannot be read is a note of the stage, never an
error: a missing checkpoint, a cluster that cannot be reached or refuses the login, a
password that is not set.
"""

from __future__ import annotations

import datetime as dt

from dcp_cdc.agent.high_seqnos import high_seqnos
from dcp_cdc.agent.landing_store import join_location
from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.agent.settings import settings_from_config
from dcp_cdc.agent.writer import CheckpointStore, checkpoint_name
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.config.capture import CaptureConfig
from dcp_cdc.errors import ConfigError, DcpError
from pipelines.follow.agent import checkpoint_of
from pipelines.status.lag import Stage

DEFAULT_AGENT: str = CaptureConfig.model_fields["agent_id"].default
"""The agent id of a capture section that names none."""


def capture_stage(config: AppConfig, bucket: BucketConfig) -> Stage:
    """The capture agent's checkpoint: its positions and its last commit. Without a capture
    section, the checkpoint a default agent keeps in the landing's capture folder, when there
    is one (an agent run with other settings, or ``dcp-cdc run``'s demo)."""
    location = checkpoint_of(config, bucket, None)
    note = None
    if location is None:
        state = config.capture_dirs(bucket).state
        location = join_location(state, checkpoint_name(bucket.name, DEFAULT_AGENT))
        note = "no [buckets.capture] section: the default agent's checkpoint in the landing"
    store = CheckpointStore(
        location,
        bucket=bucket.name,
        bucket_uuid=None,
        s3=S3Options.from_spark_conf(config.spark.conf),
    )
    try:
        positions = {vb: p.seqno for vb, p in store.load().items()}
    except DcpError as exc:
        return Stage("capture", None, note=str(exc))
    if not positions:
        if bucket.capture is None:
            return Stage("capture", None, note="no [buckets.capture] section, no checkpoint")
        return Stage("capture", None, note=f"no checkpoint yet at {location} (dcp-cdc capture)")
    moved = dt.datetime.fromisoformat(store.updated_at) if store.updated_at else None
    return Stage("capture", positions, moved, note)


def cluster_stage(config: AppConfig, bucket: BucketConfig) -> Stage:
    """The high seqnos of the agent's vbuckets, asked of the cluster's data nodes; a cluster
    that cannot be reached (or refuses the login) is a note, not an error."""
    if bucket.capture is None:
        return Stage("cluster", None, note="not asked: no [buckets.capture] section names it")
    try:
        answer = high_seqnos(settings_from_config(config, bucket))  # reads the password
    except ConfigError as exc:  # no password, a CA file that cannot be read
        return Stage("cluster", None, note=f"not asked: {exc}")
    except DcpError as exc:
        return Stage("cluster", None, note=f"unreachable: {exc}")
    note = "; ".join(answer.problems) or None
    return Stage("cluster", answer.seqnos, answer.asked_at, note)


def not_asked(why: str) -> Stage:
    """The cluster's stage when it is not asked (``--no-cluster``)."""
    return Stage("cluster", None, note=f"not asked ({why})")
