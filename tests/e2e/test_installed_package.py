"""The package works installed, not only from a checkout: its wheel goes into a fresh venv,
and ``dcp-cdc`` runs there from a folder that is not the checkout, offline.

The fresh venv gets the dependencies (pyspark, pydantic, ...) from this venv's
``site-packages`` through a ``.pth`` line; ``.pth`` files inside that folder are not processed
then, so this checkout's editable install does not leak in: ``dcp_cdc`` and ``pipelines``
come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from dcp_cdc.capture import iter_capture
from dcp_cdc.simulator import SimConfig, simulate

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "dcp_cdc", "pipelines")


@dataclass(frozen=True)
class Installed:
    venv: Path
    cwd: Path  # an empty folder outside the checkout
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, cwd=self.cwd, env=self.env
        )


def _build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the sources (a build writes build/ and egg-info beside them)."""
    source = tmp / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name,
                source / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),  # built anew
            )
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("dcp_cdc-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("installed")
    wheel = _build_wheel(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    # this venv's packages, as a plain path: the dependencies, without the editable install
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return Installed(env_dir, cwd, env)


def test_the_code_comes_from_the_installed_wheel(installed: Installed) -> None:
    done = installed.run(
        str(installed.venv / "bin" / "python"),
        "-c",
        "import json, dcp_cdc, pipelines, pipelines.app.cli, pydantic, dcp_cdc._native\n"
        "print(json.dumps([dcp_cdc.__file__, pipelines.__file__,"
        " pipelines.app.cli.__file__, dcp_cdc._native.__file__, pydantic.__file__]))",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *ours, pydantic = map(Path, json.loads(done.stdout))  # the compiled pass came in the wheel
    for path in ours:
        assert path.is_relative_to(installed.venv), path
        assert not path.resolve().is_relative_to(REPO.resolve()), path
    assert not pydantic.is_relative_to(installed.venv)  # a dependency, from the .pth line


def test_help_lists_the_verbs(installed: Installed) -> None:
    done = installed.run(str(installed.venv / "bin" / "dcp-cdc"), "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: dcp-cdc ")
    for verb in (
        "decode",
        "simulate",
        "run",
        "ingest",
        "apply",
        "check",
        "sql",
        "tables",
        "maintain",
        "spark-conf",
        "thrift-server",
    ):
        assert verb in done.stdout


def test_decode_prints_every_frame_of_a_simulated_capture(
    installed: Installed, tmp_path: Path
) -> None:
    result = simulate(tmp_path, SimConfig(bucket="b", vbuckets=2, docs=20, ops=40))
    capture = result.files[0]
    expected = [item.op for item in iter_capture(capture)]  # type: ignore[union-attr]
    done = installed.run(str(installed.venv / "bin" / "dcp-cdc"), "decode", str(capture))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["op"] for r in records] == expected and len(records) > 10
    assert {r["file"] for r in records} == {str(capture)}


def test_a_job_entry_point_runs_installed(installed: Installed) -> None:
    """``python -m pipelines.silver.job`` (what spark-submit runs) finds its CLI installed."""
    bad = installed.cwd / "bad.toml"
    bad.write_text('landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n')
    done = installed.run(
        str(installed.venv / "bin" / "python"),
        "-m",
        "pipelines.silver.job",
        "--config",
        str(bad),
        "--bucket",
        "other",
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("dcp-cdc apply: error: ConfigError: bucket 'other'")
    )
    bad.unlink()
