"""The ``dcp-cdc`` command: Spark-free verbs import no Spark, every verb finds its
configuration by the same rule, and the configuration used without ``--config`` works
outside a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_cdc.config import CONFIG_ENV, AppConfig, load_config
from tests.support.sample_session import write_sample_capture

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pyspark", "py4j", "delta", "great_expectations", "airflow", "pandas")

# Runs the command in a fresh interpreter, then prints which heavy modules it imported.
PROBE = """
import json, sys
from pipelines.app.cli import main
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
        ["run", "--help"],  # a job's verb: its help comes from its command module
        ["check", "--help"],
        ["status", "--help"],
    ],
    ids=["help", "decode", "simulate", "run-help", "check-help", "status-help"],
)
def test_spark_free_verbs_import_no_spark(args: list[str], tmp_path: Path) -> None:
    write_sample_capture(tmp_path / "captures")
    args = [a.replace("CAPTURES", str(tmp_path / "captures")) for a in args]
    args = [a.replace("SIM", str(tmp_path / "sim")) for a in args]
    found, output = _probe(args, tmp_path)
    assert found == {"status": 0, "heavy": []}
    assert output  # it did its work: usage, JSON lines, a simulation summary


def test_a_job_verb_imports_its_module_only_when_it_runs() -> None:
    """The job's flags come from its command module (:mod:`pipelines.app.commands`): present
    when the verb is the one parsed, absent (and the module not needed) otherwise."""
    from pipelines.app.cli import build_parser

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


def test_builtin_configuration_is_conf_local_toml(
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
    assert load_config(None) == expected
    assert load_config(None, warehouse="/w").warehouse == "/w"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_default_configuration_prefers_the_working_directory_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.toml").write_text(
        'landing = "../data/landing"\nwarehouse = "../data/wh"\n[[buckets]]\nname = "orders"\n'
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(None)
    assert config.warehouse == str(tmp_path.resolve() / "data" / "wh")
    assert [b.name for b in config.buckets] == ["orders"]
    monkeypatch.chdir(REPO)
    assert load_config(None) == load_config(REPO / "conf" / "local.toml")


JOB_VERBS = {  # verb -> the module whose run(config, bucket, ...) it calls
    "ingest": "pipelines.bronze.job",
    "apply": "pipelines.silver.job",
    "check": "pipelines.quality.job",
    "maintain": "pipelines.maintenance.job",
}
CATALOG_VERBS = ("sql", "tables", "spark-conf", "thrift-server", "status")


def _config_each_verb_uses(monkeypatch: pytest.MonkeyPatch) -> dict[str, AppConfig]:
    """The configuration each verb given no ``--config`` works with: what a job verb hands to
    its job's ``run`` (replaced, so no Spark starts), what a catalog verb loads."""
    import importlib

    from pipelines.app import cli
    from pipelines.app.commands.shared import catalog_config

    seen: dict[str, AppConfig] = {}
    for verb, module in JOB_VERBS.items():

        def fake_run(
            config: AppConfig, *args: object, _verb: str = verb, **kw: object
        ) -> list[object]:
            seen[_verb] = config
            return []

        monkeypatch.setattr(importlib.import_module(module), "run", fake_run)
        assert cli.main([verb]) == 0
    for verb in CATALOG_VERBS:
        extra = ["SELECT 1"] if verb == "sql" else []
        args = cli.build_parser(verb).parse_args([verb, *extra])
        assert args.config is None
        seen[verb] = catalog_config(args)
    return seen


def test_every_verb_finds_its_configuration_by_one_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No verb requires ``--config``: each takes ``$DCP_CDC_CONFIG``, else
    ``./conf/local.toml``, else the built-in settings, the same for all of them."""
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    (tmp_path / "conf").mkdir()
    local = tmp_path / "conf" / "local.toml"
    local.write_text('landing = "../in"\nwarehouse = "../wh"\n[[buckets]]\nname = "orders"\n')
    other = tmp_path / "other.toml"
    other.write_text('landing = "in2"\nwarehouse = "wh2"\n[[buckets]]\nname = "users"\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    verbs = [*JOB_VERBS, *CATALOG_VERBS]

    monkeypatch.chdir(tmp_path)  # a checkout: its conf/local.toml
    assert _config_each_verb_uses(monkeypatch) == dict.fromkeys(verbs, load_config(local))
    monkeypatch.setenv(CONFIG_ENV, str(other))  # the environment names one
    assert _config_each_verb_uses(monkeypatch) == dict.fromkeys(verbs, load_config(other))
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.chdir(empty)  # neither: the built-in settings, data under ./work/
    builtin = _config_each_verb_uses(monkeypatch)
    assert builtin == dict.fromkeys(verbs, load_config(None))
    assert builtin["ingest"].warehouse == str(empty.resolve() / "work" / "warehouse")
    assert list(empty.iterdir()) == []


def test_help_states_the_configuration_rule() -> None:
    from pipelines.app.cli import build_parser

    assert "$DCP_CDC_CONFIG, else ./conf/local.toml" in " ".join(
        build_parser("decode").format_help().split()
    )
    for verb in [*JOB_VERBS, *CATALOG_VERBS]:
        parser = build_parser(verb)
        (sub,) = [a for a in parser._actions if a.dest == "command"]
        text = " ".join(sub.choices[verb].format_help().split())  # type: ignore[attr-defined]
        assert "--config FILE a TOML file (default: $DCP_CDC_CONFIG, else" in text, verb


def test_landing_skip_needs_the_session_and_sequence_and_one_bucket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.app import cli

    parser = cli.build_parser("landing")
    args = parser.parse_args(["landing", "skip", "--session", "s1", "--sequence", "2"])
    assert (args.action, args.session, args.sequence, args.bucket) == ("skip", "s1", 2, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["landing", "skip", "--session", "s1"])
    capsys.readouterr()
    config = tmp_path / "two.toml"
    config.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "a"\n[[buckets]]\nname = "b"\n'
    )
    argv = ["landing", "skip", "--config", str(config), "--session", "s1", "--sequence", "2"]
    assert cli.main(argv) == 2  # before any Spark starts
    assert "landing skip: name the bucket (--bucket)" in capsys.readouterr().err
