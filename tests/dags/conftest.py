"""Airflow for tests/dags: a throw-away ``AIRFLOW_HOME`` with a migrated sqlite database.

Airflow reads its settings when first imported, so the tests here import it only inside
tests that use the ``airflow_env`` fixture, which sets the environment first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DAGS = REPO / "dags"
SPARK_CONN = "AIRFLOW_CONN_DCP_CDC_SPARK"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.dags)


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of every Airflow use here (set in this process too): its own home and
    database, this repository's DAGs, and a Spark connection to a local master."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        SPARK_CONN: json.dumps({"conn_type": "spark", "host": "local[2]"}),
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        done = subprocess.run(
            [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ.copy(),
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield env


@pytest.fixture
def config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> Path:
    """Where ``$DCP_CDC_CONFIG`` points; each test writes the configuration it needs."""
    path = tmp_path / "conf" / "dcp-cdc.toml"
    path.parent.mkdir()
    monkeypatch.setenv("DCP_CDC_CONFIG", str(path))
    return path
