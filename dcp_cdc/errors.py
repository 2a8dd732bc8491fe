"""The error types of dcp-cdc.

One base, :class:`DcpError`; a subclass says whose fault it was. Malformed input is the
producer's (or the capture's) fault and carries where it happened; misuse of an API is the
caller's. Any other exception escaping the decoder is a bug in dcp-cdc.
"""

from __future__ import annotations


class DcpError(Exception):
    """Base of every error dcp-cdc raises on purpose."""


class MalformedFrameError(DcpError):
    """A frame that does not match the wire format (docs/protocol/dcp.md §1–§6).

    ``frame_length`` is the frame's full length when its boundary is still trustworthy, so a
    reader can skip it and go on; ``None`` when the rest of the stream cannot be framed.
    """

    def __init__(
        self,
        reason: str,
        *,
        offset: int,
        opcode: int | None = None,
        expected: str | None = None,
        got: str | None = None,
        frame_length: int | None = None,
        file: str | None = None,
    ) -> None:
        self.reason = reason
        self.offset = offset
        self.opcode = opcode
        self.expected = expected
        self.got = got
        self.frame_length = frame_length
        self.file = file
        super().__init__(self._render())

    @property
    def recoverable(self) -> bool:
        """True when the frame boundary is known and decoding can resume after it."""
        return self.frame_length is not None

    def _render(self) -> str:
        where = f"{self.file}@{self.offset}" if self.file else f"offset {self.offset}"
        parts = [f"malformed frame at {where}"]
        if self.opcode is not None:
            parts.append(f"opcode 0x{self.opcode:02x}")
        text = ", ".join(parts) + f": {self.reason}"
        if self.expected is not None:
            text += f" (expected {self.expected}"
            text += f", got {self.got})" if self.got is not None else ")"
        return text

    def with_file(self, file: str, base_offset: int = 0) -> MalformedFrameError:
        """The same error located in ``file``, its offset shifted by ``base_offset``."""
        return type(self)(
            self.reason,
            offset=self.offset + base_offset,
            opcode=self.opcode,
            expected=self.expected,
            got=self.got,
            frame_length=self.frame_length,
            file=file,
        )


class TruncatedFrameError(MalformedFrameError):
    """The stream ended inside a frame: a cut tail, valid up to ``offset`` (capture format)."""

    def __init__(
        self,
        *,
        offset: int,
        available: int,
        needed: int | None,
        opcode: int | None = None,
        file: str | None = None,
    ) -> None:
        self.available = available
        self.needed = needed
        super().__init__(
            "truncated tail: the stream ends inside a frame",
            offset=offset,
            opcode=opcode,
            expected=f"{needed} bytes" if needed is not None else "a 24-byte header",
            got=f"{available} bytes",
            frame_length=None,
            file=file,
        )

    def with_file(self, file: str, base_offset: int = 0) -> TruncatedFrameError:
        return TruncatedFrameError(
            offset=self.offset + base_offset,
            available=self.available,
            needed=self.needed,
            opcode=self.opcode,
            file=file,
        )


class CaptureFormatError(DcpError):
    """A capture file whose header is not the dcp-cdc capture format (docs/protocol/capture-format.md)."""

    def __init__(self, reason: str, *, file: str | None = None) -> None:
        self.reason = reason
        self.file = file
        super().__init__(f"{file}: {reason}" if file else reason)


class DecoderUsageError(DcpError):
    """The caller used the decoder wrongly (e.g. fed data after end of stream)."""


class ConfigError(DcpError):
    """Invalid or missing configuration; the message names the field and the file."""


class FieldError(DcpError):
    """A part of a frame (key prefix, value, xattrs) is malformed.

    Raised by the value helpers, which do not know where the frame is; the decoder turns it
    into a :class:`MalformedFrameError` with the offset and opcode.
    """

    def __init__(self, reason: str, *, expected: str | None = None, got: str | None = None):
        self.reason = reason
        self.expected = expected
        self.got = got
        super().__init__(reason)


class ProtocolError(DcpError):
    """The other side of a connection broke the protocol: a reply that does not fit the
    request, a frame the consumer or producer cannot accept in its state. Raised by the
    sans-I/O cores, which do not know the node; drivers re-raise it as a
    :class:`CaptureConnectionError` naming it."""


class ScramError(ProtocolError):
    """A SCRAM message that does not parse, or a proof or signature that does not match."""


class CaptureConnectionError(DcpError):
    """A data node could not be reached, refused us, or broke the connection.

    ``node`` is ``host:port``; ``cause`` says what happened. Never carries a secret.
    """

    def __init__(self, node: str, cause: str) -> None:
        self.node = node
        self.cause = cause
        super().__init__(f"{node}: {cause}")

    def __reduce__(self) -> tuple[type[CaptureConnectionError], tuple[str, str]]:
        # a copy made from (node, cause), not from the message: the agent's child process
        # sends its error back to follow mode pickled (pipelines.follow.agent.AgentProcess)
        return type(self), (self.node, self.cause)


class AuthenticationError(CaptureConnectionError):
    """SASL authentication failed (wrong user or password, no common mechanism)."""


class TlsError(CaptureConnectionError):
    """The TLS handshake failed: an untrusted or mismatched certificate, a bad CA file."""


class ClientCertificateError(TlsError):
    """A node refused the agent's client certificate (mutual TLS), or its absence: the
    cluster requires one and none was set, does not trust its issuer, or maps it to no user.
    Names the node and what it said; never the key."""


class CheckpointError(DcpError):
    """A capture checkpoint that cannot be read or does not fit the capture it resumes."""


class AgentUsageError(DcpError):
    """The capture agent's driver used the consumer core wrongly (a stream opened twice, a
    request before the handshake finished): a bug in the caller, not the server's fault."""


class VbucketStateError(AgentUsageError):
    """The capture agent's placement told a vbucket's state machine something its status does
    not allow (:mod:`dcp_cdc.agent.vbucket_state`), or asked about a vbucket not in the run:
    a bug in the placement, not the server's fault. ``status`` is None for a vbucket not in
    the run; ``event`` None when none was told."""

    def __init__(self, vbucket: int, status: str | None, event: str | None = None) -> None:
        self.vbucket = vbucket
        self.status = status
        self.event = event
        where = "is not in this run" if status is None else f"is {status}"
        told = f": {event!r} is not allowed" if event is not None else ""
        super().__init__(f"vbucket {vbucket} {where}{told}")

    def __reduce__(self) -> tuple[type[VbucketStateError], tuple[int, str | None, str | None]]:
        # pickled back from the follow mode's agent process, as CaptureConnectionError
        return type(self), (self.vbucket, self.status, self.event)


class ConnectionLostError(CaptureConnectionError):
    """An established connection went silent (2 × the noop interval), was reset or closed:
    the capture agent closes that session durably and resumes its vbuckets elsewhere."""


class ObjectStoreError(DcpError):
    """The object store of a capture landing or checkpoint cannot be used: no credentials,
    credentials refused, a bucket that does not exist, an endpoint that does not answer.

    ``location`` is the ``s3://`` location concerned; ``setting`` the configuration setting
    (or environment variable) to look at; ``cause`` what happened. Never carries a secret."""

    def __init__(self, location: str, cause: str, setting: str | None = None) -> None:
        self.location = location
        self.cause = cause
        self.setting = setting
        where = f" (see {setting})" if setting else ""
        super().__init__(f"{location}: {cause}{where}")

    def __reduce__(self) -> tuple[type[ObjectStoreError], tuple[str, str, str | None]]:
        # pickled back from the follow mode's agent process, as CaptureConnectionError
        return type(self), (self.location, self.cause, self.setting)


class CheckpointConflictError(CheckpointError):
    """A conditional write of a capture checkpoint was refused: another writer changed (or
    created) the checkpoint object since this agent last read or wrote it. Two agents think
    they own the same checkpoint; this one stops instead of overwriting the other's."""

    def __init__(self, location: str, cause: str) -> None:
        self.location = location
        self.cause = cause
        super().__init__(f"checkpoint {location}: {cause}")

    def __reduce__(self) -> tuple[type[CheckpointConflictError], tuple[str, str]]:
        return type(self), (self.location, self.cause)
