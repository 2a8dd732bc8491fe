"""Spark on S3 (``s3a://``): the jars, the session settings and a preflight, kept apart from
:mod:`pipelines.lake.spark_session`, which calls :func:`s3_jars` and :func:`s3_session_conf` for a
session whose warehouse is on S3 (or that asks for S3 tables).

- **Jars.** pyspark ships Hadoop's client but not its S3A filesystem (``hadoop-aws``) nor the
  AWS SDK. ``make setup-s3`` resolves them, with dcp-cdc's log store, into ``.cache/jars-s3``
  (or ``$DCP_CDC_S3_JARS_DIR``); a session on S3 without them fails here, before Spark starts,
  with :class:`~pipelines.errors.S3SetupError` naming ``make setup-s3``.
- **Several writers.** Every commit goes through the log store ``[storage] log_store`` names
  (:mod:`dcp_cdc.config.storage`): by default S3's conditional PUT, so two drivers never both
  commit one version.
- **Preflight.** :func:`preflight` asks the configured endpoint for each bucket the warehouse
  and landing use (boto3, ``HeadBucket``, seconds at most), so missing or refused credentials,
  a bucket that does not exist and an endpoint that does not answer are typed errors naming
  the setting and location, not a JVM stack trace minutes later. Secrets never reach a message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.config import is_uri
from dcp_cdc.config.storage import LOG_STORE_CLASSES, S3_LOG_STORE_KEYS
from pipelines.errors import (
    S3BucketNotFoundError,
    S3CredentialsError,
    S3EndpointError,
    S3SetupError,
)

S3_JARS_DIR_ENV = "DCP_CDC_S3_JARS_DIR"
"""Environment variable naming the folder of the S3 jars instead of ``.cache/jars-s3``."""
CHECKOUT_S3_JARS_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jars-s3"
"""Where ``make setup-s3`` puts them, when this package runs from a checkout."""
LOG_STORE_JAR = "dcp-cdc-s3-logstore.jar"
S3_SCHEMES = ("s3a", "s3")
_S3A = "spark.hadoop.fs.s3a."


def on_s3(location: str | Path) -> bool:
    """True for an ``s3a://`` (or ``s3://``) location."""
    text = str(location)
    return is_uri(text) and text.split(":", 1)[0].lower() in S3_SCHEMES


def s3_jars_dir() -> Path:
    """``$DCP_CDC_S3_JARS_DIR``, else the checkout's ``.cache/jars-s3``."""
    chosen = os.environ.get(S3_JARS_DIR_ENV)
    return Path(chosen).expanduser().resolve() if chosen else CHECKOUT_S3_JARS_DIR


def s3_jars() -> list[Path]:
    """The jars of a session on S3: ``hadoop-aws``, the AWS SDK modules and the log store."""
    folder = s3_jars_dir()
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    missing = missing_s3_jars(jar.name for jar in jars)
    if missing:
        raise S3SetupError(
            f"the jars of a warehouse on S3 (s3a://) are missing: expected "
            f"{', '.join(missing)} in {folder}. Run `make setup-s3` to resolve them (the "
            f"default `make setup` leaves them out), or set {S3_JARS_DIR_ENV} to a folder "
            "that has them."
        )
    return jars


def missing_s3_jars(names: Iterable[str]) -> list[str]:
    """Which of the S3 jars none of the jar file ``names`` is."""
    names = set(names)
    return [
        what
        for what, present in (
            ("hadoop-aws-*.jar", any(n.startswith("hadoop-aws-") for n in names)),
            ("s3-*.jar (AWS SDK)", any(n.startswith("s3-2") for n in names)),
            (LOG_STORE_JAR, LOG_STORE_JAR in names),
        )
        if not present
    ]


def check_submitted_s3_jars(spark_jars: str) -> None:
    """A driver that ``spark-submit`` started on S3 uses the jars it was given (a driver may run
    from a shipped zip, with no ``.cache/jars-s3`` beside it): they must hold the S3 jars, as
    ``dcp-cdc spark-conf`` and the DAGs' launches give them."""
    names = [uri.rstrip("/").rsplit("/", 1)[-1] for uri in spark_jars.split(",") if uri]
    missing = missing_s3_jars(names)
    if missing:
        raise S3SetupError(
            f"this driver was launched by spark-submit for a warehouse on S3 (s3a://) without "
            f"the S3 jars in spark.jars: {', '.join(missing)} missing. Launch it with "
            "`dcp-cdc spark-conf`'s properties (or the DAGs), which list them after "
            "`make setup-s3`."
        )


def s3_session_conf(log_store: str) -> dict[str, str]:
    """The Spark settings of a session on S3: the S3A filesystem for ``s3a://`` and ``s3://``,
    S3A's conditional create, and Delta's log store for both schemes."""
    store = LOG_STORE_CLASSES[log_store]
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
    }
    conf |= {key: store for key in S3_LOG_STORE_KEYS}
    return conf


def buckets_of(locations: Iterable[str]) -> dict[str, str]:
    """Each S3 bucket the ``locations`` name, with the first location naming it."""
    found: dict[str, str] = {}
    for location in locations:
        if on_s3(location):
            found.setdefault(urlparse(location).netloc, location)
    return found


def preflight(locations: Mapping[str, str], settings: Mapping[str, str]) -> None:
    """Check that every S3 bucket of ``locations`` (setting name → location, such as
    ``{"warehouse": "s3a://lake/wh"}``) answers ``HeadBucket`` at the endpoint of
    ``settings`` (``[spark.conf]``'s ``spark.hadoop.fs.s3a.*``) with its credentials.
    Raises an :class:`~pipelines.errors.ObjectStorageError` subclass naming the setting."""
    named = {
        bucket: setting
        for setting, location in locations.items()
        for bucket in buckets_of([location])
    }
    if not named:
        return
    import boto3  # type: ignore[import-untyped]
    import botocore.config  # type: ignore[import-untyped]
    import botocore.exceptions as aws  # type: ignore[import-untyped]

    s3 = S3Options.from_spark_conf(settings)
    endpoint = s3.endpoint_url
    where = f"endpoint {endpoint} ({_S3A}endpoint)" if endpoint else "AWS S3 (no endpoint set)"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=s3.region,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        aws_session_token=s3.session_token,
        config=botocore.config.Config(
            connect_timeout=5,
            read_timeout=10,
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"} if s3.path_style else None,
        ),
    )
    keys_from = (
        f"{_S3A}access.key and {_S3A}secret.key in [spark.conf]"
        if s3.access_key
        else "the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, a profile or a role)"
    )
    for bucket, setting in named.items():
        location = locations[setting]
        try:
            client.head_bucket(Bucket=bucket)
        except aws.NoCredentialsError:
            raise S3CredentialsError(
                f"{setting} {location}: no S3 credentials: set {_S3A}access.key and "
                f"{_S3A}secret.key in [spark.conf], or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the environment"
            ) from None
        except (aws.EndpointConnectionError, aws.ConnectTimeoutError, aws.ReadTimeoutError) as exc:
            raise S3EndpointError(
                f"{setting} {location}: {where} does not answer ({type(exc).__name__})"
            ) from None
        except aws.ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "")
            if status == 404 or code in ("404", "NoSuchBucket"):
                raise S3BucketNotFoundError(
                    f"{setting} {location}: bucket {bucket!r} does not exist at {where}"
                ) from None
            if status in (401, 403):
                raise S3CredentialsError(
                    f"{setting} {location}: {where} refused the credentials from {keys_from} "
                    f"for bucket {bucket!r} (HTTP {status})"
                ) from None
            raise S3EndpointError(
                f"{setting} {location}: {where} answered HTTP {status} {code} for bucket {bucket!r}"
            ) from None
