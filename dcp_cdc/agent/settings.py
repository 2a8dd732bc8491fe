"""What a capture run is given and what it reports: :class:`CaptureSettings` (built from a
bucket's ``[buckets.capture]`` section by :func:`settings_from_config`) and
:class:`CaptureSummary`.

Apart from the agent's code so that a job or a test can build settings without importing
the sockets and the placement logic (:mod:`dcp_cdc.agent.driver` runs them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dcp_cdc.agent.landing_store import join_location
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.s3_store import S3Options, is_object_location
from dcp_cdc.agent.writer import checkpoint_name
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.config.capture import CAPTURE_DIR, ConnectionString, parse_connection_string
from dcp_cdc.errors import ConfigError
from dcp_cdc.logs import register_secret

Mode = Literal["until-now", "follow"]
MAX_BACKOFF_S = 10.0
"""The longest wait between two connection attempts to a node that is down."""


@dataclass(frozen=True)
class CaptureSettings:
    """Everything a capture run needs; :func:`settings_from_config` builds it from TOML."""

    connection_string: str
    bucket: str
    username: str
    """The user to authenticate as; with a client certificate only a label for messages
    (``""``: the configuration names none)."""
    password: str = field(repr=False)
    """``""`` with a client certificate: none is sent."""
    landing: Path | str
    """A local folder, or an object store's ``s3://bucket/prefix`` (``s3a://`` too)."""
    staging: Path
    """Always local: the files being written (``*.partial``); what is lost with it was
    never checkpointed."""
    state_dir: Path | str
    """The checkpoint's folder: local, or a prefix in an object store."""
    agent_id: str = "agent"
    vbuckets: tuple[int, int] | None = None
    collections: tuple[str, ...] | None = None
    """``scope.collection`` names; None = every collection."""
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    """With ``couchbases://``: the client certificate (PEM) presented to every node; the
    node authenticates the user it maps to, and SASL is skipped."""
    tls_key_file: Path | None = None
    """The private key (PEM, not encrypted) of ``tls_cert_file``."""
    buffer_bytes: int = 16 << 20
    noop_interval_s: int = 120
    rotate_bytes: int = 64 << 20
    rotate_seconds: float = 300.0
    connect_timeout_s: float = 10.0
    backoff_s: float = 0.5
    """First reconnection delay; doubled per failed attempt (with jitter), at most
    :data:`MAX_BACKOFF_S`."""
    reconnect_timeout_s: float = 60.0
    """How long a node that went away is tried again before the capture gives up: a node
    that restarts or fails over within this time costs a pause, not the run."""
    metrics_port: int | None = None
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on this port (0: any free port, which
    the log names); None: no endpoint."""
    metrics_host: str = "127.0.0.1"
    lag_poll_s: float = 10.0
    """Seconds between two requests for every node's high seqnos (the lag's other end)."""
    stall_after_s: float = 300.0
    """A vbucket behind the cluster whose position has not moved for this long is stalled."""
    s3: S3Options | None = field(default=None, repr=False, compare=False)
    """How ``s3://`` locations are reached (endpoint, keys, region); None: the AWS
    environment alone."""
    connection: ConnectionString | None = field(default=None, repr=False, compare=False)
    """``connection_string`` parsed: :func:`settings_from_config` passes the configuration's
    own parse; settings built by hand are parsed here, once."""

    def __post_init__(self) -> None:
        if self.connection is None:
            object.__setattr__(self, "connection", parse_connection_string(self.connection_string))
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_cert_file, tls_key_file: set both or neither")
        if self.client_certificate and not self.cluster.tls:
            raise ConfigError("tls_cert_file: a client certificate needs couchbases://")

    @property
    def client_certificate(self) -> bool:
        """True when the agent authenticates by a client certificate (mutual TLS)."""
        return self.tls_cert_file is not None

    @property
    def cluster(self) -> ConnectionString:
        """The parsed connection string (TLS or not, the seed nodes)."""
        assert self.connection is not None  # set by __post_init__
        return self.connection

    @classmethod
    def into(cls, landing: Path, **settings: Any) -> CaptureSettings:
        """Settings whose staging folder and checkpoint are in ``landing``'s capture folder,
        where a bucket's capture section puts them by default."""
        folder = landing / CAPTURE_DIR
        return cls(landing=landing, staging=folder, state_dir=folder, **settings)

    @property
    def checkpoint_path(self) -> Path | str:
        """The checkpoint: a local path, or an ``s3://`` URI."""
        return join_location(self.state_dir, checkpoint_name(self.bucket, self.agent_id))

    @property
    def on_object_store(self) -> bool:
        """True when the landing or the checkpoint is in an object store."""
        return is_object_location(self.landing) or is_object_location(self.state_dir)


@dataclass
class CaptureSummary:
    mode: str
    vbuckets: int = 0
    files: list[Path | str] = field(default_factory=list)
    """The files published: local paths, or ``s3://`` URIs."""
    bytes_captured: int = 0
    sessions: int = 0
    reconnects: int = 0
    rollbacks: int = 0
    moves: int = 0
    frames_received: int = 0
    """Frames read from the nodes' connections (after their handshakes)."""
    bytes_received: int = 0
    bytes_durable: int = 0
    """Bytes of the files published (headers included)."""
    stream_ends: dict[str, int] = field(default_factory=dict)
    """STREAM_END reason (``ok``, ``closed``, ..., ``unknown``) → how many."""
    done: list[int] = field(default_factory=list)
    """vbuckets that reached their end seqno (``until-now``), or were there already."""
    filter_empty: list[int] = field(default_factory=list)
    positions: dict[int, VbPosition] = field(default_factory=dict)
    """The committed positions at the end."""

    def lines(self) -> list[str]:
        return [
            f"capture ({self.mode}): {self.vbuckets} vbuckets, {len(self.files)} files, "
            f"{self.bytes_captured} bytes in {self.sessions} sessions",
            f"vbuckets done: {len(self.done)}; filter empty: {self.filter_empty or 'none'}; "
            f"rollbacks: {self.rollbacks}; moves: {self.moves}; reconnects: {self.reconnects}",
        ]


def settings_from_config(
    app: AppConfig, bucket: BucketConfig, *, vbuckets: tuple[int, int] | None = None
) -> CaptureSettings:
    """:class:`CaptureSettings` of ``bucket`` (a :class:`~dcp_cdc.config.BucketConfig` with a
    ``capture`` section) in ``app`` (its :class:`~dcp_cdc.config.AppConfig`); the password
    is read now (none with a client certificate), and masked in this process's log lines from
    then on."""
    cap = bucket.capture
    if cap is None:
        raise ConfigError(f"bucket {bucket.name!r} has no [buckets.capture] section")
    dirs = app.capture_dirs(bucket)
    password = ""
    if not cap.client_certificate:
        password = cap.password()
        register_secret(password)
    return CaptureSettings(
        connection_string=cap.connection_string,
        connection=cap.connection,
        bucket=bucket.name,
        username=cap.username or "",
        password=password,
        landing=dirs.landing,
        staging=dirs.staging,
        state_dir=dirs.state,
        agent_id=cap.agent_id,
        vbuckets=vbuckets if vbuckets is not None else cap.vbucket_range(),
        collections=tuple(cap.collections) if cap.collections else None,
        tls_ca_file=Path(cap.tls_ca_file) if cap.tls_ca_file else None,
        tls_cert_file=Path(cap.tls_cert_file) if cap.tls_cert_file else None,
        tls_key_file=Path(cap.tls_key_file) if cap.tls_key_file else None,
        buffer_bytes=cap.buffer_bytes,
        noop_interval_s=cap.noop_interval_s,
        rotate_bytes=cap.rotate_bytes,
        rotate_seconds=cap.rotate_seconds,
        connect_timeout_s=cap.connect_timeout_s,
        reconnect_timeout_s=cap.reconnect_timeout_s,
        metrics_port=cap.metrics_port,
        metrics_host=cap.metrics_host,
        lag_poll_s=cap.lag_poll_s,
        stall_after_s=cap.stall_after_s,
        s3=S3Options.from_spark_conf(app.spark.conf),
    )
