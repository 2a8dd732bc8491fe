"""The ``dcp-cdc`` command: Spark-free verbs import no Spark, and the configuration used
without ``--config`` works outside a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_cdc.config import load_config
from pipelines.run import local_config
from tests.unit.sample_session import write_sample_capture

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "py4j", "delta", "great_expectations", "airflow", "pandas")

# Runs the command in a fresh interpreter, then prints which heavy modules it imported.
PROBE = """
import json, sys
from pipelines.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:  # --help
    status = exc.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(sys.stdin.read())))
print(json.dumps({"status": status, "heavy": heavy}))
"""


def _probe(args: list[str], cwd: Path) -> tuple[dict[str, object], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        input=json.dumps(HEAVY),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *output, last = done.stdout.splitlines()
    return json.loads(last), "\n".join(output)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["decode", "CAPTURES"],
        ["simulate", "--out", "SIM", "--docs", "20", "--ops", "40", "--vbuckets", "2"],
    ],
    ids=["help", "decode", "simulate"],
)
def test_spark_free_verbs_import_no_spark(args: list[str], tmp_path: Path) -> None:
    write_sample_capture(tmp_path / "captures")
    args = [a.replace("CAPTURES", str(tmp_path / "captures")) for a in args]
    args = [a.replace("SIM", str(tmp_path / "sim")) for a in args]
    found, output = _probe(args, tmp_path)
    assert found == {"status": 0, "heavy": []}
    assert output  # it did its work: usage, JSON lines, a simulation summary


def test_a_job_verb_imports_its_module_only_when_it_runs() -> None:
    """The job's flags come from its module (which imports pyspark): present when the verb
    is the one parsed, absent (and the module not needed) otherwise."""
    from pipelines.cli import build_parser

    args = build_parser("apply").parse_args(
        ["apply", "--config", "c.toml", "--collection", "s.c", "--rebuild"]
    )
    assert (args.config, args.bucket, args.collection, args.rebuild) == (
        "c.toml",
        None,
        "s.c",
        True,
    )
    with pytest.raises(SystemExit):
        build_parser("decode").parse_args(["apply", "--config", "c.toml", "--rebuild"])


def test_builtin_local_config_is_conf_local_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a checkout the built-in settings stand in for ``conf/local.toml``, with the
    data under ``./work/`` as the checkout's file puts them beside ``conf/``."""
    monkeypatch.chdir(tmp_path)
    work = tmp_path.resolve() / "work"
    checkout = load_config(REPO / "conf" / "local.toml")
    assert checkout.landing == str(REPO / "work" / "landing")  # what the built-in mirrors
    expected = checkout.model_copy(
        update={"landing": str(work / "landing"), "warehouse": str(work / "warehouse")}
    )
    assert local_config() == expected
    assert local_config(warehouse="/w").warehouse == "/w"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_local_config_prefers_the_working_directory_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.toml").write_text(
        'landing = "../data/landing"\nwarehouse = "../data/wh"\n[[buckets]]\nname = "orders"\n'
    )
    monkeypatch.chdir(tmp_path)
    config = local_config()
    assert config.warehouse == str(tmp_path.resolve() / "data" / "wh")
    assert [b.name for b in config.buckets] == ["orders"]
    monkeypatch.chdir(REPO)
    assert local_config() == load_config(REPO / "conf" / "local.toml")
