"""Several JVMs committing to one Delta log through a log store, without Spark: seconds.

:func:`build_test_jar` compiles the tests' Java helpers (``tests/support/java``): ``CommitRace``,
one JVM of the race, which commits as Delta does (read the latest version L, write
``<L+1>.json`` with overwrite=false, on ``FileAlreadyExistsException`` read again and retry),
each commit one line naming its writer and number; and ``SlowRenameLocalFs``, the fault point
that holds Delta's stock local store between its check and its rename. :func:`race` starts the
JVMs at once on one folder and reads back which commits the folder kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.support.concurrent_writers import ROOT

JAVA_SOURCES = Path(__file__).resolve().parent / "java"
BUILD_JAR = ROOT / "build-support" / "jars" / "build_jar.py"
STOCK_LOCAL_STORE = "io.delta.storage.HDFSLogStore"
"""Delta's log store of ``file:`` paths when nothing else is set."""
SLOW_RENAME_FS = "dcpcdc.test.SlowRenameLocalFs"
SLOW_RENAME_DELAY = "dcpcdc.test.rename.delay.ms"


def slow_rename_conf(delay_ms: int) -> dict[str, str]:
    """The Hadoop settings that put the fault point under FileContext's ``file:`` paths."""
    return {"fs.AbstractFileSystem.file.impl": SLOW_RENAME_FS, SLOW_RENAME_DELAY: str(delay_ms)}


def build_test_jar(jar: Path) -> Path:
    """Compile ``tests/support/java`` into ``jar`` (against pyspark's and the Delta jars)."""
    from pipelines.lake.spark_session import delta_jars_dir

    subprocess.run(
        [
            *(sys.executable, str(BUILD_JAR), "--src", str(JAVA_SOURCES), "--jar", str(jar)),
            *("--classpath", str(delta_jars_dir()), "--needs", "delta-storage-"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return jar


@dataclass(frozen=True, slots=True)
class RaceResult:
    expected: int
    """Commits the writers made (each was told it succeeded)."""
    found: int
    """Distinct commits in the log."""
    duplicated: int
    """Commits in the log more than once (a write reported as refused that landed)."""
    refused: int
    """Attempts refused with FileAlreadyExistsException: the writers raced for a version."""
    versions: int

    @property
    def lost(self) -> int:
        return self.expected - self.found


def race(
    store: str,
    log: Path,
    test_jar: Path,
    *,
    writers: int = 2,
    commits: int,
    hadoop_conf: dict[str, str] | None = None,
    timeout_s: float = 900,
) -> RaceResult:
    """``writers`` JVMs each making ``commits`` commits to the log folder ``log`` through the
    log store class ``store``; what the folder kept."""
    import pyspark

    from pipelines.lake.spark_session import delta_jars_dir

    log.mkdir(parents=True)
    go = log.parent / f"{log.name}.go"
    classpath = os.pathsep.join(
        str(entry)
        for entry in (
            test_jar,
            Path(pyspark.__file__).parent / "jars" / "*",
            delta_jars_dir() / "*",
        )
    )
    settings = [f"{key}={value}" for key, value in (hadoop_conf or {}).items()]
    procs = [
        subprocess.Popen(
            [
                *("java", "-cp", classpath, "dcpcdc.test.CommitRace", store, str(log)),
                *(f"w{writer}", str(commits), str(go), *settings),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for writer in range(writers)
    ]
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}.w{writer}.ready").exists() for writer in range(writers)):
        assert time.monotonic() < deadline, "the writers' JVMs did not start"
        assert all(proc.poll() is None for proc in procs), "a writer's JVM stopped"
        time.sleep(0.01)
    go.touch()
    refused = 0
    for writer, proc in enumerate(procs):
        out, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, f"writer {writer} failed:\n{err[-5000:]}"
        refused += int(out.split()[-2])  # "w0: 150 commits, 12 refused"
    lines: Counter[str] = Counter()
    files = [f for f in log.glob("*.json") if f.stem.isdigit()]
    for file in files:
        lines.update(file.read_text(encoding="utf-8").splitlines())
    return RaceResult(
        expected=writers * commits,
        found=len(lines),
        duplicated=sum(1 for count in lines.values() if count > 1),
        refused=refused,
        versions=len(files),
    )
