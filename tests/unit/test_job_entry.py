"""The entry point of the jobs' ``python -m`` and ``spark-submit`` runs (what the DAG's tasks
run), ``pipelines.app.cli.job_main``: a bad configuration is a one-line error and exit status 2,
before any Spark session. (``tests/e2e/test_installed_package.py`` runs one by ``python -m``.)"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.app.cli import job_main

JOBS = [
    ("pipelines.bronze.job", "ingest"),
    ("pipelines.silver.job", "apply"),
    ("pipelines.quality.job", "check"),
    ("pipelines.maintenance.job", "maintain"),
]


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """``job_main`` sets up logging on the stderr of its process, here pytest's capture: put the
    root logger back, so that no later log line (py4j's at exit) goes to a closed stream."""
    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.mark.parametrize(("module", "verb"), JOBS)
def test_bad_configuration_exits_2_naming_the_job_and_the_field(
    module: str, verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[ingest]\nchunk_bytes = -1\n'
    )
    # the module run as a script is this verb
    assert f'job_main("{verb}")' in inspect.getsource(importlib.import_module(module))
    assert job_main(verb, ["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dcp-cdc {verb}: error: ConfigError: ")
    assert "chunk_bytes" in err
    assert not (tmp_path / "w").exists()  # no Spark session was started on the warehouse


@pytest.mark.parametrize(("module", "verb"), JOBS)
def test_unknown_bucket_exits_2(
    module: str, verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n')
    assert job_main(verb, ["--config", str(path), "--bucket", "other"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dcp-cdc {verb}: error: ConfigError: ") and "other" in err
    assert not (tmp_path / "w").exists()


def test_a_job_prints_every_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.bronze import job

    class Done:
        def __init__(self, name: str) -> None:
            self.name = name

        def render(self) -> str:
            return f"done {self.name}"

    path = tmp_path / "two.toml"
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "a"\n[[buckets]]\nname = "b"\n'
    )
    monkeypatch.setattr(
        job,
        "run",
        lambda config, bucket=None, **_: [Done(b.name) for b in config.bucket(bucket)],
    )
    assert job_main("ingest", ["--config", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == ["done a", "done b"]


def test_check_exits_1_naming_every_failed_error_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's exit logic is written once: ``dcp-cdc check`` and ``python -m`` share it."""
    from types import SimpleNamespace

    from pipelines.app import cli
    from pipelines.quality import job

    path = tmp_path / "ok.toml"
    path.write_text('landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n')
    report = SimpleNamespace(
        bucket="b", failed_errors=["suite.one", "suite.two"], render=lambda: "report of b"
    )
    monkeypatch.setattr(job, "run", lambda config, bucket=None, **_: [report])
    for main in (lambda argv: job_main("check", argv), lambda argv: cli.main(["check", *argv])):
        assert main(["--config", str(path)]) == 1
        captured = capsys.readouterr()
        assert captured.out.splitlines() == ["report of b"]
        assert captured.err.splitlines()[-1] == (
            "dcp-cdc check: failed error expectations: b: suite.one; b: suite.two"
        )


@pytest.mark.parametrize("verb", ["ingest", "run"])
def test_a_landing_folder_that_is_not_there_exits_2_before_spark(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spark(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr("pipelines.lake.spark_session.session_for", no_spark)
    path = tmp_path / "ok.toml"
    path.write_text('landing = "missing"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n')
    assert job_main(verb, ["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"dcp-cdc {verb}: error: ConfigError: {path}: landing: the landing location "
    )
    assert err.rstrip().endswith(f"{str(tmp_path / 'missing')!r} of bucket 'b' does not exist")
