"""The landing location's filesystem: one stack (``pyarrow.fs``) to list and to read captures.

The driver lists the landing folder and reads capture headers; the decode tasks, which are
Python in the executors, read the files. Both go through :func:`filesystem`, so both see the
same files with the same credentials. Object-store settings are those Spark is given, taken
from ``[spark.conf]`` (``spark.hadoop.fs.s3a.*``): one place for the credentials of the
landing and of the warehouse.

Locations are local paths, ``file:`` URIs, ``s3a://`` or ``s3://`` (read with pyarrow's S3
filesystem), or any other URI pyarrow knows (``gs://``, ``hdfs://``, ...). File locations keep
the scheme they were listed with (``s3a://bucket/key`` stays so in the ingest log).

No Spark import here: the module is pyarrow only and is used inside the executors' tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

import pyarrow.fs as pafs

from dcp_cdc.config import is_uri

S3_SCHEMES = ("s3a", "s3")
_S3A = "spark.hadoop.fs.s3a."


@dataclass(frozen=True, order=True)
class Listed:
    """A file found below a location: its own location (as a path or URI), size, and
    modification time in milliseconds."""

    path: str
    size: int
    modified_ms: int


def s3_options(settings: Mapping[str, str]) -> dict[str, object]:
    """``pyarrow.fs.S3FileSystem`` options from Spark's ``spark.hadoop.fs.s3a.*`` settings.

    Keys and token, endpoint, region, path-style access and TLS are taken over; without keys
    both Spark and pyarrow fall back to the usual AWS environment and profile.
    """
    s3a = {key[len(_S3A) :]: value for key, value in settings.items() if key.startswith(_S3A)}
    options: dict[str, object] = {}
    for ours, theirs in (
        ("access.key", "access_key"),
        ("secret.key", "secret_key"),
        ("session.token", "session_token"),
        ("endpoint.region", "region"),
    ):
        if s3a.get(ours):
            options[theirs] = s3a[ours]
    endpoint = s3a.get("endpoint")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
        options["endpoint_override"] = parsed.netloc or endpoint
        if parsed.scheme:
            options["scheme"] = parsed.scheme
    if s3a.get("connection.ssl.enabled", "").lower() == "false":
        options["scheme"] = "http"
    if "path.style.access" in s3a:
        options["force_virtual_addressing"] = s3a["path.style.access"].lower() != "true"
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


def list_files(
    location: str, suffix: str, settings: Mapping[str, str] | None = None
) -> list[Listed]:
    """Every file below ``location`` whose name ends with ``suffix``, sorted; none if
    ``location`` does not exist."""
    fs, root = filesystem(location, settings)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return sorted(
        Listed(_location_of(location, info.path), info.size, _millis(info.mtime_ns))
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File and info.base_name.endswith(suffix)
    )


def open_input(location: str, settings: Mapping[str, str] | None = None) -> BinaryIO:
    """A binary reader of the file at ``location`` (a path or URI, as :func:`list_files`
    gives them)."""
    fs, path = filesystem(location, settings)
    return fs.open_input_stream(path)  # type: ignore[no-any-return]
