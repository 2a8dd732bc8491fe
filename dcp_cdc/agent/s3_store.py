"""The capture agent on an S3 object store: its capture files (:class:`S3Landing`) and its
checkpoint (:class:`S3Checkpoint`) in a bucket, through boto3 (the ``s3`` extra, imported
only when a landing is ``s3://`` or ``s3a://``).

The S3 primitives relied on, and why each keeps the agent's guarantees (docs/capture.md):

- A PUT (or a multipart upload's completion) makes an object visible whole or not at all:
  a reader never lists half a capture file. The body's checksum (boto3 sends a CRC32 by
  default) makes the store refuse a body damaged on the way.
- A PUT is strongly consistent (read-after-write, list-after-write): once it returned, bronze
  lists and reads the file. The checkpoint is written only after that.
- Conditional writes: the checkpoint's PUT carries ``If-None-Match: *`` (the first one) or
  ``If-Match: <the ETag read or written last>``, so an agent whose checkpoint another agent
  changed (or created) gets :class:`~dcp_cdc.errors.CheckpointConflictError` and stops
  instead of overwriting it.

Settings are the landing reader's (:mod:`pipelines.bronze.landing`): ``[spark.conf]``'s
``spark.hadoop.fs.s3a.*`` (endpoint, keys, region, path style), else the usual AWS
environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...). Errors are
typed (:class:`~dcp_cdc.errors.ObjectStoreError`) and name the location and the setting,
never a secret.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from dcp_cdc.config.capture import OBJECT_STORE_SCHEMES, is_object_store
from dcp_cdc.errors import CheckpointConflictError, ConfigError, ObjectStoreError

log = logging.getLogger(__name__)

S3_SCHEMES = OBJECT_STORE_SCHEMES
_S3A = "spark.hadoop.fs.s3a."
ENDPOINT_SETTING = "[spark.conf] spark.hadoop.fs.s3a.endpoint, or AWS_ENDPOINT_URL"
KEYS_SETTING = "[spark.conf] spark.hadoop.fs.s3a.access.key and .secret.key"
ENV_CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials"
_REFUSED = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "403",
}
_CONFLICT = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_T = TypeVar("_T")


is_object_location = is_object_store


@dataclass(frozen=True)
class ObjectLocation:
    """``s3://bucket/prefix`` split: the bucket, the key prefix (no slash at either end)
    and the scheme it was written with (``s3a://`` stays so: bronze lists it so)."""

    scheme: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, location: str) -> ObjectLocation:
        parsed = urlparse(location)
        if parsed.scheme not in S3_SCHEMES or not parsed.netloc:
            raise ConfigError(f"{location!r}: expected s3://bucket/prefix or s3a://bucket/prefix")
        if parsed.query or parsed.fragment or "@" in parsed.netloc:
            raise ConfigError(f"{location!r}: expected s3://bucket/prefix, without ?, # or @")
        return cls(parsed.scheme, parsed.netloc, parsed.path.strip("/"))

    def key(self, *names: str) -> str:
        """The key of ``names`` below the prefix."""
        return "/".join(part for part in (self.prefix, *names) if part)

    def child(self, *names: str) -> ObjectLocation:
        return ObjectLocation(self.scheme, self.bucket, self.key(*names))

    def uri(self, key: str | None = None) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix if key is None else key}"

    def __str__(self) -> str:
        return self.uri()


@dataclass(frozen=True)
class S3Options:
    """How the agent reaches the store. Keys left None fall back to the AWS environment."""

    endpoint_url: str | None = None
    tls: bool = True
    """``connection.ssl.enabled``: with it off, an endpoint without a scheme is ``http://``."""
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    path_style: bool | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    max_attempts: int = 4
    """Attempts per request (boto3's standard retry mode: throttling, 5xx, connection errors)."""
    multipart_bytes: int = 256 << 20
    """Files larger than this are uploaded in parts (completion is atomic), smaller ones with
    one PUT."""
    part_bytes: int = 64 << 20

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str]) -> S3Options:
        """The options of Spark's ``spark.hadoop.fs.s3a.*`` settings (``[spark.conf]``), read
        the one reading of them: the landing's reader (:func:`pipelines.bronze.landing.s3_options`),
        the jobs' preflight and ``dcp-cdc status`` take theirs from here."""
        s3a = {k[len(_S3A) :]: v for k, v in conf.items() if k.startswith(_S3A)}
        endpoint = s3a.get("endpoint") or None
        tls = s3a.get("connection.ssl.enabled", "true").lower() != "false"
        if endpoint and "://" not in endpoint:
            endpoint = f"{'https' if tls else 'http'}://{endpoint}"
        style = s3a.get("path.style.access")
        return cls(
            endpoint_url=endpoint,
            tls=tls,
            region=s3a.get("endpoint.region") or s3a.get("region") or None,
            access_key=s3a.get("access.key") or None,
            secret_key=s3a.get("secret.key") or None,
            session_token=s3a.get("session.token") or None,
            path_style=None if style is None else style.lower() == "true",
        )

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to, for messages."""
        return self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or "AWS's S3 endpoint"

    @property
    def credentials_setting(self) -> str:
        return KEYS_SETTING if self.access_key else ENV_CREDENTIALS


class S3Client:
    """One boto3 client (thread-safe) and the translation of its failures into typed errors."""

    def __init__(self, options: S3Options | None) -> None:
        self.options = options or S3Options()
        self._client: Any = None
        self._making = threading.Lock()  # uploads run in worker threads, several at once

    def _make(self) -> Any:
        try:
            import boto3  # type: ignore[import-untyped]
            from botocore.config import Config  # type: ignore[import-untyped]
        except ImportError:  # pragma: no cover - the s3 extra is installed in development
            raise ConfigError("an s3:// landing needs boto3: pip install 'dcp-cdc[s3]'") from None
        o = self.options
        config = Config(
            connect_timeout=o.connect_timeout_s,
            read_timeout=o.read_timeout_s,
            retries={"max_attempts": o.max_attempts, "mode": "standard"},
            s3={"addressing_style": "path" if o.path_style else "auto"}
            if o.path_style is not None
            else None,
        )
        try:
            return boto3.session.Session().client(
                "s3",
                endpoint_url=o.endpoint_url,
                region_name=o.region,
                aws_access_key_id=o.access_key,
                aws_secret_access_key=o.secret_key,
                aws_session_token=o.session_token,
                config=config,
            )
        except ValueError as exc:  # a malformed endpoint URL
            raise ObjectStoreError(
                "s3", f"endpoint {o.endpoint!r}: {exc}", ENDPOINT_SETTING
            ) from None

    def call(self, where: ObjectLocation, key: str | None, op: str, **kwargs: Any) -> Any:
        """``client.<op>(**kwargs)``; a failure is an :class:`ObjectStoreError` naming
        ``where`` (and ``key``)."""
        return self._guarded(where, key, lambda: getattr(self._get(), op)(**kwargs))

    def put_if(self, where: ObjectLocation, key: str, **kwargs: Any) -> tuple[str | None, str]:
        """A conditional ``PutObject``: ``(the new ETag, "")``, or ``(None, the store's code)``
        when the condition did not hold (412, or 409 for a concurrent conditional write)."""

        def put() -> tuple[str | None, str]:
            try:
                answer = self._get().put_object(Bucket=where.bucket, Key=key, **kwargs)
            except _errors().ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in _CONFLICT or status in (409, 412):
                    return None, code or str(status)
                raise
            return answer["ETag"], ""

        return self._guarded(where, key, put)

    def _get(self) -> Any:
        with self._making:
            if self._client is None:
                self._client = self._make()
            return self._client

    def _guarded(self, where: ObjectLocation, key: str | None, fn: Callable[[], _T]) -> _T:
        errors = _errors()
        location = where.uri(key)
        o = self.options
        try:
            return fn()
        except (errors.NoCredentialsError, errors.PartialCredentialsError) as exc:
            raise ObjectStoreError(
                location, f"no usable credentials ({type(exc).__name__})", o.credentials_setting
            ) from None
        except errors.ConnectionError as exc:  # connect/read timeouts, refused, closed
            raise ObjectStoreError(
                location,
                f"the endpoint {o.endpoint} does not answer ({type(exc).__name__})",
                ENDPOINT_SETTING,
            ) from None
        except errors.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket" or (code in ("404", "NotFound") and key is None):
                raise ObjectStoreError(
                    location, f"the bucket {where.bucket!r} does not exist at {o.endpoint}"
                ) from None
            if code in _REFUSED:
                raise ObjectStoreError(
                    location, f"the store refused the credentials ({code})", o.credentials_setting
                ) from None
            message = exc.response.get("Error", {}).get("Message", "")
            raise ObjectStoreError(
                location, f"{exc.operation_name} failed: {code or status} {message}".rstrip()
            ) from None
        except errors.BotoCoreError as exc:
            raise ObjectStoreError(location, f"{type(exc).__name__}: {exc}") from None


def _errors() -> Any:
    """botocore's exception classes (imported with boto3, when a store is first used)."""
    import botocore.exceptions  # type: ignore[import-untyped]

    return botocore.exceptions


def _missing(exc: BaseException) -> bool:
    if not isinstance(exc, _errors().ClientError):
        return False
    return str(exc.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound")


class S3Landing:
    """Capture files published into ``s3://bucket/prefix``: each uploaded whole from its
    closed staging file, then the staging file deleted."""

    def __init__(self, location: ObjectLocation, client: S3Client) -> None:
        self.where = location
        self.client = client

    @property
    def location(self) -> str:
        return self.where.uri()

    def check(self) -> None:
        """The bucket exists and the credentials are accepted (HEAD bucket)."""
        self.client.call(self.where, None, "head_bucket", Bucket=self.where.bucket)

    def publish(self, staged: Path, name: str) -> str:
        """Upload the closed, fsync'd ``staged`` file as ``<prefix>/<name>``; returns its URI.
        One PUT, or a multipart upload whose completion publishes it at once."""
        key = self.where.key(name)
        size = staged.stat().st_size
        if size > self.client.options.multipart_bytes:
            self._multipart(staged, key)
        else:
            with open(staged, "rb") as body:
                self.client.call(
                    self.where, key, "put_object", Bucket=self.where.bucket, Key=key, Body=body
                )
        staged.unlink(missing_ok=True)
        return self.where.uri(key)

    def _multipart(self, staged: Path, key: str) -> None:
        bucket, where = self.where.bucket, self.where
        upload = self.client.call(where, key, "create_multipart_upload", Bucket=bucket, Key=key)
        upload_id = upload["UploadId"]
        parts = []
        try:
            with open(staged, "rb") as fh:
                number = 1
                while chunk := fh.read(self.client.options.part_bytes):
                    done = self.client.call(
                        where,
                        key,
                        "upload_part",
                        Bucket=bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=chunk,
                    )
                    parts.append({"ETag": done["ETag"], "PartNumber": number})
                    number += 1
            self.client.call(
                where,
                key,
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            try:  # best effort: a lifecycle rule removes what an abort could not
                self.client.call(
                    where, key, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
                )
            except ObjectStoreError as exc:
                log.warning("capture: could not abort the upload of %s: %s", where.uri(key), exc)
            raise


class S3Checkpoint:
    """One checkpoint object, read and replaced with conditional writes: ``If-None-Match: *``
    while none was read, else ``If-Match`` on the ETag read or written last."""

    def __init__(self, location: ObjectLocation, client: S3Client) -> None:
        self.where = location
        self.client = client
        self.etag: str | None = None
        """The ETag of the object as this agent last read or wrote it; None: absent."""

    @property
    def location(self) -> str:
        return self.where.uri()

    def read(self) -> bytes | None:
        """The object's bytes, None when there is none; remembers its ETag."""
        client_error = _errors().ClientError
        where, key = self.where, self.where.prefix

        def get() -> tuple[bytes, str] | None:
            try:
                answer = self.client._get().get_object(Bucket=where.bucket, Key=key)
            except client_error as exc:
                if _missing(exc) and str(exc.response["Error"].get("Code")) != "NoSuchBucket":
                    return None
                raise
            return answer["Body"].read(), answer["ETag"]

        got = self.client._guarded(where, key, get)
        if got is None:
            self.etag = None
            return None
        data, self.etag = got
        return data

    def write(self, data: bytes) -> None:
        """Replace the object with ``data`` if nobody else changed it since :meth:`read` (or
        the last write); :class:`CheckpointConflictError` otherwise."""
        where, key = self.where, self.where.prefix
        condition = {"IfMatch": self.etag} if self.etag else {"IfNoneMatch": "*"}
        etag, refused = self.client.put_if(
            where, key, Body=data, ContentType="application/json", **condition
        )
        if etag is None:
            if self._already(data):  # our own PUT, whose answer was lost and retried
                return
            how = f"If-Match on ETag {self.etag}" if self.etag else "If-None-Match: *, none existed"
            raise CheckpointConflictError(
                self.location,
                f"another writer changed it since this agent read it (the conditional write "
                f"{how} was refused: {refused}); two agents with the same bucket and agent_id "
                "share this checkpoint, stop one of them",
            )
        self.etag = etag

    def _already(self, data: bytes) -> bool:
        """True (and the ETag taken) when the object holds ``data`` already."""
        previous = self.etag
        current = self.read()
        if current == data:
            return True
        self.etag = previous
        return False
