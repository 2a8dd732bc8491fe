"""The error types of the Spark jobs, all :class:`~dcp_cdc.errors.DcpError` subclasses.

The library's errors (malformed input, configuration, misuse) live in :mod:`dcp_cdc.errors`;
these are the pipelines' own: a caller catches each by name, and ``python -m`` entry points
turn any of them into a one-line message and exit status 2.
"""

from __future__ import annotations

from dcp_cdc.errors import DcpError


class SparkSetupError(DcpError):
    """The local Spark set-up is missing or conflicts with the session asked for."""


class CatalogError(SparkSetupError):
    """The embedded catalog of a local warehouse (``<warehouse>/metastore_db``) cannot be
    opened: another process has it, or it is damaged. The message says which and what to do."""


class MetastoreError(SparkSetupError):
    """The catalog service (a Derby network server that ``dcp-cdc metastore`` runs, or the
    configured ``[spark] metastore``) cannot be started, stopped or used; the message names
    the warehouse or the setting and the address."""


class MetastoreUnreachableError(MetastoreError):
    """Nothing answers at the catalog service's address: the setting that names it and the
    address are in the message (checked before the Spark session starts)."""


class CommitConflictError(DcpError):
    """Another writer kept winning the Delta commit race (or the catalog race) on a table;
    nothing of the step was written, and running again is safe."""


class DataQualityError(DcpError):
    """A data-quality expectation of severity ``error`` failed, or there is nothing to check."""


class BrowserError(DcpError):
    """No headless Chromium to open the report with, or it failed."""


class TableLocationError(DcpError):
    """A table's location holds Delta data the catalog does not know, more than an interrupted
    creation leaves (which is cleared and created again): it is not ours to delete."""


class CollectionNameError(DcpError):
    """A collection that learned its name cannot take it: a table of that name exists already
    (the message names both tables; nothing was changed)."""


class LandingChangedError(DcpError):
    """A capture file planned for an ingest run changed or vanished before the run wrote it:
    its bytes are not those the plan bound to (size and digest). Nothing of the run's write
    committed; the next attempt leaves the file out and reports it."""


class LandingSkipError(DcpError):
    """A capture file cannot be declared lost (``dcp-cdc landing skip``): it is ingested, or
    no later file of its session waits for it. The message names the session and sequence."""


class S3SetupError(SparkSetupError):
    """A session on S3 (``s3a://``) lacks its jars (``make setup-s3``)."""


class ObjectStorageError(DcpError):
    """The object store of the warehouse or landing cannot be used; the message names the
    setting and location (never a secret)."""


class S3CredentialsError(ObjectStorageError):
    """No S3 credentials were found, or the endpoint refused them."""


class S3BucketNotFoundError(ObjectStorageError):
    """A bucket the configuration names does not exist at the endpoint."""


class S3EndpointError(ObjectStorageError):
    """The S3 endpoint does not answer, or answers something unexpected."""


class TableReadError(DcpError):
    """A Delta table of the warehouse that exists cannot be read without Spark (delta-rs: a
    reader feature it lacks, a log or data file it cannot read, storage that refuses): the
    message names the table, its location and delta-rs's reason."""

    def __init__(self, table: str, location: str, reason: str) -> None:
        super().__init__(f"table {table} at {location} cannot be read: {reason}")
        self.table = table
        self.location = location


class QueryError(DcpError):
    """A statement of ``dcp-cdc sql`` that Spark cannot parse or analyse (a misspelt column, a
    syntax error): Spark's reason, in one line."""


class TableNotFoundError(QueryError):
    """A statement names a table, view or database the catalog does not hold: the message says
    whether its bucket has not reached that layer yet (and which command makes it) or the name
    is wrong (with the closest names the catalog holds)."""


class FullCheckNeeded(DcpError):
    """Raised inside a quality check, never out of it: the state the last check carried
    cannot answer this one (the message says why), so it reads all of bronze
    (:mod:`pipelines.quality.compute`)."""


class NotOnDriver(DcpError):
    """A bucket the quality check leaves to Spark rather than compute in the driver
    (:mod:`pipelines.quality.small`): what it found is outside the rules the driver keeps
    (a response's opaque beyond an INT, which Spark's cast refuses)."""
