"""The landing location's filesystem: one stack (``pyarrow.fs``) to list and to read captures.

The driver lists the landing folder and reads capture headers; the decode tasks, which are
Python in the executors, read the files. Both go through :func:`filesystem`, so both see the
same files with the same credentials. Object-store settings are those Spark is given, taken
from ``[spark.conf]`` (``spark.hadoop.fs.s3a.*``): one place for the credentials of the
landing and of the warehouse.

Locations are local paths, ``file:`` URIs, ``s3a://`` or ``s3://`` (read with pyarrow's S3
filesystem), or any other URI pyarrow knows (``gs://``, ``hdfs://``, ...). File locations keep
the scheme they were listed with (``s3a://bucket/key`` stays so in the ingest log).

The capture files of a landing location are listed here too (:func:`list_captures`, a
:class:`CaptureFile` each, its header read by :func:`read_header`), and a location that cannot
be listed is a configuration error (:func:`check_landing`), found before any Spark starts.

No Spark import here: the module is pyarrow only and is used inside the executors' tasks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlparse

import pyarrow.fs as pafs

from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.capture import EXTENSION, PREAMBLE_LEN, parse_header
from dcp_cdc.config import AppConfig, BucketConfig, is_uri
from dcp_cdc.errors import CaptureFormatError, ConfigError

S3_SCHEMES = ("s3a", "s3")


@dataclass(frozen=True, order=True)
class Listed:
    """A file found below a location: its own location (as a path or URI), size, and
    modification time in milliseconds."""

    path: str
    size: int
    modified_ms: int


def s3_options(settings: Mapping[str, str]) -> dict[str, object]:
    """``pyarrow.fs.S3FileSystem`` options from Spark's ``spark.hadoop.fs.s3a.*`` settings
    (:meth:`S3Options.from_spark_conf`).

    Keys and token, endpoint, region, path-style access and TLS are taken over; without keys
    both Spark and pyarrow fall back to the usual AWS environment and profile.
    """
    s3 = S3Options.from_spark_conf(settings)
    found = {
        "access_key": s3.access_key,
        "secret_key": s3.secret_key,
        "session_token": s3.session_token,
        "region": s3.region,
    }
    options: dict[str, object] = {key: value for key, value in found.items() if value}
    if s3.endpoint_url:
        parsed = urlparse(s3.endpoint_url)
        options["endpoint_override"] = parsed.netloc or s3.endpoint_url
        options["scheme"] = parsed.scheme
    elif not s3.tls:
        options["scheme"] = "http"
    if s3.path_style is not None:
        options["force_virtual_addressing"] = not s3.path_style
    return options


def filesystem(
    location: str, settings: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem ``location`` lies on and its path there.

    ``settings`` are the configuration's Spark settings (``[spark.conf]``); only the S3 ones
    are used.
    """
    if not is_uri(location) and not location.startswith("file:"):
        return pafs.LocalFileSystem(), str(Path(location).expanduser().resolve())
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return pafs.LocalFileSystem(), str(Path(parsed.path).resolve())
    if parsed.scheme in S3_SCHEMES:
        fs = pafs.S3FileSystem(**s3_options(settings or {}))
        return fs, f"{parsed.netloc}{parsed.path}".rstrip("/")
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, str(path)


def _location_of(root: str, path: str) -> str:
    """A listed file's path on its filesystem, back as a location in the root's form."""
    if not is_uri(root) and not root.startswith("file:"):
        return path
    parsed = urlparse(root)
    if parsed.scheme == "file":
        return f"file:{path}"  # as Hadoop writes it
    if path.startswith("/"):
        return f"{parsed.scheme}://{parsed.netloc}{path}"
    return f"{parsed.scheme}://{path}"


def _millis(mtime_ns: int) -> int:
    # As ``int(os.stat(p).st_mtime * 1000)``, which earlier runs logged (Python builds
    # st_mtime as seconds + nanoseconds * 1e-9): the same file keeps the same time.
    return int((mtime_ns // 1_000_000_000 + (mtime_ns % 1_000_000_000) * 1e-9) * 1000)


@dataclass(frozen=True, order=True)
class Skipped:
    """An entry below the location with the files' suffix that is not a file to read: a
    folder, a dangling link, an empty file, or a file that vanished."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class Listing:
    """What :func:`list_files` found: the files to read, sorted, and the entries skipped."""

    files: list[Listed] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


_OBJECT_STORES = ("s3", "gcs")
"""Filesystems (``FileSystem.type_name``) where a folder is only a prefix of keys."""


def location_problem(location: str, settings: Mapping[str, str] | None = None) -> str | None:
    """Why ``location`` cannot be listed as a landing folder, or None when it can.

    It must be a folder. On an object store a folder is only the prefix of the keys below it
    and exists once something landed there, so there the store's bucket must exist and an
    absent prefix is an empty folder (a capture agent that has not written yet).
    """
    try:
        fs, root = filesystem(location, settings)
        kind = fs.get_file_info(root).type
        if kind == pafs.FileType.Directory:
            return None
        if kind != pafs.FileType.NotFound:
            return "is a file, not a folder"
        if fs.type_name not in _OBJECT_STORES:
            return "does not exist"
        store_bucket = root.split("/", 1)[0]
        if fs.get_file_info(store_bucket).type == pafs.FileType.Directory:
            return None
        return f"its bucket {store_bucket!r} does not exist"
    except (OSError, ValueError) as exc:  # unreachable store, bad URI, no credentials
        return f"cannot be listed ({type(exc).__name__}: {exc})"


def list_files(location: str, suffix: str, settings: Mapping[str, str] | None = None) -> Listing:
    """Every file below ``location`` whose name ends with ``suffix``, sorted, and the
    entries with that suffix that are not files to read (:class:`Skipped`): folders,
    dangling links and empty files. Nothing if ``location`` does not exist (callers check
    it first with :func:`location_problem`)."""
    fs, root = filesystem(location, settings)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return Listing()
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    files, skipped = [], []
    undecodable = False
    for info in fs.get_file_info(selector):
        try:
            name, where = info.base_name, info.path
        except UnicodeDecodeError:  # pyarrow decodes names as UTF-8 when asked for them
            undecodable = True
            continue
        if not name.endswith(suffix):
            continue
        path = _location_of(location, where)
        if info.type == pafs.FileType.File and info.size:
            files.append(Listed(path, info.size, _millis(info.mtime_ns)))
        else:
            skipped.append(Skipped(path, _SKIPPED.get(info.type, "not a regular file")))
    if isinstance(fs, pafs.LocalFileSystem):  # pyarrow's listing leaves dangling links out
        skipped += [
            Skipped(_location_of(location, link), _SKIPPED[pafs.FileType.NotFound])
            for link in _dangling_links(root, suffix)
        ]
    if undecodable:
        skipped += _undecodable(location, root, suffix, local=isinstance(fs, pafs.LocalFileSystem))
    return Listing(sorted(files), sorted(set(skipped)))


NOT_UTF8 = "its name is not UTF-8 (rename it to read it)"


def _undecodable(location: str, root: str, suffix: str, *, local: bool) -> list[Skipped]:
    """The entries named with bytes that are not UTF-8, shown with those bytes escaped
    (``\\xff``): bronze keeps every path as text, so such a file cannot be read or logged as
    it is. A local folder is walked for them by name; elsewhere one entry says they exist."""
    if not local:
        return [Skipped(_location_of(location, root) + "/…", NOT_UTF8)]
    tail = suffix.encode()
    found = []
    for folder, dirs, names in os.walk(os.fsencode(root)):
        for name in [*names, *dirs]:
            if not name.endswith(tail):
                continue
            try:
                name.decode("utf-8")
                os.fsdecode(folder).encode("utf-8")
            except UnicodeError:
                shown = os.path.join(folder, name).decode("utf-8", "backslashreplace")
                found.append(Skipped(_location_of(location, shown), NOT_UTF8))
    return found


def _dangling_links(root: str, suffix: str) -> list[str]:
    return [
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(suffix) and not os.path.exists(os.path.join(folder, name))
    ]


_SKIPPED = {
    pafs.FileType.File: "empty (0 bytes)",
    pafs.FileType.Directory: "a folder, not a file",
    pafs.FileType.NotFound: "a dangling link, or gone while listing",
}


def gone(location: str, settings: Mapping[str, str] | None = None) -> str | None:
    """Why the file at ``location`` can no longer be read, after reading it failed: it
    vanished or became a folder; None when a file is still there (the failure was
    something else, which the caller raises)."""
    fs, path = filesystem(location, settings)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.File:
        return None
    return "vanished" if kind == pafs.FileType.NotFound else "is no longer a file"


def open_input(location: str, settings: Mapping[str, str] | None = None) -> BinaryIO:
    """A binary reader of the file at ``location`` (a path or URI, as :func:`list_files`
    gives them)."""
    fs, path = filesystem(location, settings)
    return fs.open_input_stream(path)  # type: ignore[no-any-return]


# --- capture files -----------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class CaptureFile:
    path: str
    size: int
    modified_ms: int
    bucket: str = ""
    session_id: str = ""
    file_sequence: int = -1
    collections: bool = True
    header_length: int = 0
    started_at: str = ""

    def log_row(self, run_id: str, **more: Any) -> dict[str, Any]:
        """The file's row of the ingest log in run ``run_id``."""
        return {
            "file": self.path,
            "size": self.size,
            "modified_ms": self.modified_ms,
            "session_id": self.session_id,
            "file_sequence": self.file_sequence,
            "ingest_run_id": run_id,
            **more,
        }


def check_landing(
    config: AppConfig, buckets: list[BucketConfig], config_file: object = None
) -> None:
    """Each of ``buckets``' landing locations can be listed (:func:`location_problem`),
    else a :class:`ConfigError` naming the field (and ``config_file``, when known). Costs no
    Spark: jobs call it before they start a session.

    A landing folder that does not exist is an error, not an empty landing: a mistyped path
    would otherwise ingest nothing, run after run, with success. A capture agent creates its
    folder when it starts; a pipeline scheduled before that fails until it has (or until the
    folder is created empty). On object stores only the store's bucket must exist.
    """
    for index, bucket in enumerate(config.buckets):
        if bucket not in buckets:
            continue
        location = config.landing_for(bucket)
        problem = location_problem(location, config.spark.conf)
        if problem is not None:
            name = f"buckets[{index}].landing" if bucket.landing else "landing"
            where = f"{config_file}: " if config_file else ""
            raise ConfigError(
                f"{where}{name}: the landing location {location!r} of bucket {bucket.name!r} "
                f"{problem}"
            )


def list_captures(
    location: str, storage: Mapping[str, str] | None = None
) -> tuple[list[CaptureFile], list[Skipped]]:
    """Every ``*.dcpcap`` file below ``location`` (a local path or a filesystem URI), through
    the landing filesystem (:func:`filesystem`) that the decode tasks read them with;
    and the entries so named that are not files to read (folders, dangling links, empty)."""
    found = list_files(location, EXTENSION, storage)
    return [CaptureFile(f.path, f.size, f.modified_ms) for f in found.files], found.skipped


def read_header(file: CaptureFile, storage: Mapping[str, str] | None = None) -> CaptureFile:
    with open_input(file.path, storage) as fh:
        head = fh.read(PREAMBLE_LEN)
        if len(head) == PREAMBLE_LEN:
            head += fh.read(int.from_bytes(head[8:12], "big"))
    header, length = parse_header(head, file=file.path)
    return CaptureFile(
        file.path,
        file.size,
        file.modified_ms,
        header.bucket,
        header.session_id,
        header.sequence,
        header.collections,
        length,
        header.started_at or "",
    )


@dataclass(frozen=True)
class Problem:
    """Why a file is not read as planned: ``status`` ``missing`` (vanished, or no longer a
    file) or ``changed`` (other bytes than those planned), and what was found."""

    status: str
    message: str


def header_or_problem(
    file: CaptureFile, storage: Mapping[str, str] | None = None
) -> CaptureFile | Problem:
    """:func:`read_header`, or why the file cannot be read: it vanished or became a folder
    (``missing``), or is not a capture file (``changed``, with the header's fault). Other I/O
    errors are raised."""
    try:
        return read_header(file, storage)
    except CaptureFormatError as exc:
        return Problem("changed", exc.reason)
    except OSError:
        reason = gone(file.path, storage)
        if reason is None:  # still a file there: an I/O error, not a change
            raise
        return Problem("missing", reason)
