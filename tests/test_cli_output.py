"""What the three CLIs print and where: results on stdout (so `> file` and pipes capture them,
whole), diagnostics and errors on stderr; --help shows boolean flags bare and marks what is
required; a typo on the command line is named as the command line's. The real entry points run
in subprocesses, with stdout and stderr as pipes, the way a shell script would use them."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from rufus_data.cli import app as data_app
from rufus_data.folders.shards import write_manifest, write_shards
from rufus_eval.cli import app as eval_app
from rufus_train.cli import app as train_app

BIN = Path(sys.executable).parent
APPS = {"rufus-data": data_app, "rufus-train": train_app, "rufus-eval": eval_app}
LONG = "a long value that a table must not cut at eighty columns, " * 4


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=600, cwd=cwd,
                          check=False)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    rows = [{"id": f"s-{i}", "source": "s", "label": "s", "num_tokens": 10 + i,
             "messages": [{"role": "user", "content": f"q{i} {LONG}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(3)]
    folder = tmp_path_factory.mktemp("cli_out") / "shards"
    write_shards(pa.Table.from_pylist(rows), folder)
    write_manifest(folder, {"sources": [{"name": "s", "system": None}]})
    return folder


@pytest.mark.spawn
def test_sql_writes_csv_and_json_rows_to_stdout(shards):
    query = "SELECT id, num_tokens, messages[1].content AS question, messages FROM shards ORDER BY id"
    as_csv = run("rufus-data", "sql", str(shards), query, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["id", "num_tokens", "question", "messages"] and len(rows) == 4
    assert rows[1][:3] == ["s-0", "10", f"q0 {LONG}"]  # the whole value, not cut at the terminal width
    assert json.loads(rows[1][3])[1] == {"role": "assistant", "content": "a0"}  # nested values as JSON
    assert as_csv.stderr == ""
    as_json = run("rufus-data", "sql", str(shards), query, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    records = json.loads(as_json.stdout)
    assert [r["id"] for r in records] == ["s-0", "s-1", "s-2"] and records[2]["num_tokens"] == 12
    assert records[0]["question"] == f"q0 {LONG}" and records[0]["messages"][0]["role"] == "user"


@pytest.mark.spawn
def test_sql_table_into_a_pipe_keeps_every_value_whole(shards):
    table = run("rufus-data", "sql", str(shards), "SELECT id, messages[1].content AS q FROM shards ORDER BY id")
    assert table.returncode == 0 and table.stderr == "", table.stderr
    assert f"q0 {LONG}".strip() in table.stdout and "…" not in table.stdout
    bad = run("rufus-data", "sql", str(shards), "SELECT 1", "--format", "xml")
    said = " ".join(bad.stderr.replace("│", " ").split())
    assert bad.returncode == 2 and bad.stdout == "" and "'xml' is not one of 'table', 'csv', 'json'" in said


@pytest.mark.spawn
def test_inspect_results_on_stdout_errors_on_stderr(shards, tmp_path):
    found = run("rufus-data", "inspect", str(shards))
    assert found.returncode == 0, found.stderr
    assert "rows and tokens" in found.stdout and "token length histogram" in found.stdout
    assert "no data-bug warnings" in found.stdout and found.stderr == ""
    missing = run("rufus-data", "inspect", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stdout == "" and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.spawn
def test_plan_and_stages_tables_are_results(tmp_path):
    planned = run("rufus-train", "plan", "--params", "3e9", "--tokens", "1.1e13", "--days", "24")
    assert planned.returncode == 0, planned.stderr
    assert "same run on other GPUs" in planned.stdout and "h100" in planned.stdout and planned.stderr == ""


def all_options(app):
    """(command path, click parameter) for every option of every command of a CLI."""
    def walk(command, path):
        for param in command.params:
            yield path, param
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    yield from walk(get_command(app), "")


@pytest.mark.parametrize("cli", APPS)
def test_boolean_options_are_bare_flags_everywhere(cli):
    """One spelling in all three CLIs: a boolean option is `--flag` (or `--flag/--no-flag`), never
    `--flag true`; --help shows it without a value."""
    booleans = [(path, p) for path, p in all_options(APPS[cli]) if getattr(p, "is_bool_flag", False)
                or getattr(getattr(p, "type", None), "name", "") == "boolean"]
    assert booleans
    for path, param in booleans:
        assert param.is_flag, f"{cli}{path} {param.opts} takes a value: make it a flag"
    commands = {path.strip() for path, _ in all_options(APPS[cli]) if path.strip()} | {""}
    for command in commands:
        result = CliRunner().invoke(APPS[cli], [*command.split(), "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output, f"{cli} {command} --help shows a flag with a value"


def test_help_marks_required_options_and_points_stage_to_its_keys():
    def help_of(app, *argv):
        result = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        return result.output

    export = help_of(train_app, "export")
    assert "*    RUN" in export and "--merge" not in export  # exporting is merging: no required flag
    assert "required unless --report-only" in " ".join(help_of(data_app, "decontam").split())
    stage = " ".join(help_of(train_app, "stage").split())
    for words in ("--data", "--dry_run", "catalogs/stages/NAME.yaml", "--no_packing", "rufus-train stage NAME --help"):
        assert words in stage, words
    missing = CliRunner().invoke(train_app, ["export"])
    assert missing.exit_code == 2 and "Missing argument 'RUN'" in missing.output


def test_a_command_line_typo_is_named_as_the_command_lines(tmp_path):
    result = CliRunner().invoke(train_app, ["stage", "sft", "--max_step", "2", "--dry-run"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "command line --max_step: unknown key 'max_step'; did you mean 'max_steps'?" in said
    assert "sft.yaml" not in said  # the file did not have the typo


@pytest.mark.spawn
def test_decontam_without_out_says_it_is_required(shards, tmp_path):
    result = run("rufus-data", "decontam", str(shards), "--against", "gsm8k")
    assert result.returncode == 2 and result.stdout == ""
    assert "--out" in result.stderr and "--report-only" in result.stderr
