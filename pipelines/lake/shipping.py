"""The code the executors run: ``dcp_cdc`` and ``pipelines`` as one zip (``[spark] py_files``).

The decode tasks and the transforms' Python functions import ``dcp_cdc`` and ``pipelines`` in
the executors, whose Python need not have the package. ``[spark] py_files`` says where their
code comes from, and :func:`pipelines.lake.spark_session.session_for` (which every entry point goes
through) adds it to the session: ``auto`` builds a zip of the packages this Python imports,
from wherever they are installed (a checkout or site-packages), named by a digest of their
content so that an unchanged package is zipped once. A local master needs nothing.

``python -m pipelines.lake.shipping --out dist/dcp_cdc.zip`` (``make pyfiles``) writes the same zip.
No Spark import here: the DAGs use it at run time and it is stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from dcp_cdc.config import is_uri
from dcp_cdc.errors import ConfigError

PACKAGES = ("dcp_cdc", "pipelines")
AUTO = "auto"
CACHE_DIR_NAME = "dcp-cdc-code"
_SKIPPED_DIRS = {"__pycache__"}
# A zip cannot hold an importable extension: the executors decode with numpy alone, unless
# their Python has the package installed (a wheel builds dcp_cdc._native).
_SKIPPED_SUFFIXES = (".pyc", ".pyo", ".so")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip times: the same code gives the same bytes


def package_files() -> list[tuple[str, Path]]:
    """``(name in the zip, file)`` of every file of the packages, sorted by name."""
    files: list[tuple[str, Path]] = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"package {package} is not importable: cannot ship its code")
        root = Path(next(iter(spec.submodule_search_locations))).resolve()
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
            for name in names:
                if not name.endswith(_SKIPPED_SUFFIXES):
                    path = Path(folder) / name
                    files.append((f"{package}/{path.relative_to(root).as_posix()}", path))
    return sorted(files)


def write_zip(dest: Path, files: Sequence[tuple[str, Path]]) -> Path:
    """``files`` as a zip at ``dest``, written beside it and renamed (no half-written zip)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in files:
                info = zipfile.ZipInfo(name, date_time=_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def code_zip(cache_dir: Path | None = None) -> Path:
    """The zip of the packages as imported now, built once per content in ``cache_dir``
    (default: ``dcp-cdc-code`` in the temporary folder)."""
    files = package_files()
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    folder = cache_dir or Path(tempfile.gettempdir()) / CACHE_DIR_NAME
    dest = folder / f"dcp_cdc-{digest.hexdigest()[:20]}.zip"
    return dest if dest.is_file() else write_zip(dest, files)


def local_master(master: str) -> bool:
    """Executors of a local master are this Python: they import what the driver imports."""
    return master.startswith("local")


def py_files_for(setting: str | None, master: str) -> str | None:
    """What to ship for ``[spark] py_files = setting`` to executors of ``master``: a path or
    URI of a zip, or None (nothing to ship)."""
    if not setting:
        return None
    if setting == AUTO:
        return None if local_master(master) else str(code_zip())
    if not is_uri(setting) and not Path(setting).is_file():
        raise ConfigError(f"[spark] py_files: {setting} is not a file (a zip: make pyfiles)")
    return setting


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.lake.shipping",
        description="Write the zip of dcp_cdc and pipelines that executors are given.",
    )
    parser.add_argument("--out", type=Path, default=Path("dist/dcp_cdc.zip"), help="the zip")
    args = parser.parse_args(argv)
    print(write_zip(args.out, package_files()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
