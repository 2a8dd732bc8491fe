"""A Spark standalone master and workers on 127.0.0.1 for tests, started and stopped by
``build-support/local_stack.py``'s own code (what ``make airflow-up`` runs), so the tests and
the user's stack start a cluster the same way."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "build-support" / "local_stack.py"


def local_stack_module() -> ModuleType:
    """``build-support/local_stack.py`` as a module (it is a script, not in a package)."""
    name = "dcp_cdc_local_stack"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None, SCRIPT
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextmanager
def standalone_cluster(
    folder: Path, *, env: Mapping[str, str], workers: int = 1, cores: int = 1, memory: str = "1g"
) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master and ``workers`` workers whose processes get
    ``env`` (without ``PYTHONPATH``); logs in ``folder/logs``, work dirs in ``folder/spark``.
    Everything is stopped on exit, also when the body fails."""
    local_stack = local_stack_module()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    stack = local_stack.Stack(folder, folder, folder, env=dict(env))
    try:
        yield str(stack.start_spark(workers, cores, memory))
    finally:
        stack.stop()
