"""A ``java`` that records each call and fails, to show that a command starts no JVM.

:func:`jvm_trap` makes ``<folder>/bin/java``; :meth:`JvmTrap.env` puts it first on ``PATH``
and makes ``<folder>`` the ``JAVA_HOME`` (pyspark's ``spark-submit`` runs
``$JAVA_HOME/bin/java``, else the first ``java`` on ``PATH``), without the variables that
would let pyspark join a JVM already running (``PYSPARK_GATEWAY_PORT``) or use another Spark
(``SPARK_HOME``). A process that tries to start a JVM fails at once and leaves a line in
:attr:`JvmTrap.calls`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_JAVA = """#!/bin/sh
echo "java $*" >> '{calls}'
echo "jvm_trap: no JVM may start here" >&2
exit 1
"""


@dataclass(frozen=True)
class JvmTrap:
    home: Path
    calls: Path

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the trap in the way."""
        env = dict(os.environ if base is None else base)
        for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_HOME"):
            env.pop(name, None)
        path = env.get("PATH", "")
        return env | {"JAVA_HOME": str(self.home), "PATH": f"{self.home / 'bin'}:{path}"}

    @property
    def called(self) -> list[str]:
        """The trapped calls, one per attempt to run ``java``."""
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def jvm_trap(folder: Path) -> JvmTrap:
    """A trap in ``folder`` (made if missing)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = folder / "java-calls.txt"
    java = bin_dir / "java"
    java.write_text(_JAVA.format(calls=calls))
    java.chmod(0o755)
    return JvmTrap(folder, calls)
