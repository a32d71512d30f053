"""What `rufus-data --help` and each command's --help say: the root names every command,
decontam's and dedup's settings are their config models' fields, their flags stay, and `models
list` prints a table a script can read (help, choices and spellings of every command:
tests/test_cli_surface.py). Starting the CLI loads nothing heavy (the options are built from
config modules that import no arrow, numpy or tokenizer)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
from cli_commands import leaf_commands
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.decontam.config import DecontamCommand, DecontamConfig
from rufus_data.dedup.config import DedupCommand, DedupConfig
from rufus_data.mix.config import MixCommand, MixConfig


def help_text(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_root_help_names_what_rufus_data_does():
    said = help_text()
    for command in ("mix", "decontam", "dedup", "filter", "pairs", "inspect", "sql", "push", "models", "catalogs", "cache"):
        assert command in said.split("Commands")[0], f"the root help's summary leaves out {command}"


@pytest.mark.parametrize(("command", "models"), [("mix", (MixCommand, MixConfig)), ("decontam", (DecontamCommand, DecontamConfig)),
                                                  ("dedup", (DedupCommand, DedupConfig))])
def test_decontam_dedup_and_mix_options_are_their_models_fields(command, models):
    """One option per field, its help the field's description: a setting added to the model is an option."""
    params = {p.name: p for p in dict(leaf_commands(app))[(command,)].params}
    fields = {name: info for model in models for name, info in model.model_fields.items()}
    assert set(params) == set(fields)
    for name, info in fields.items():
        assert params[name].help == info.description, name


def test_decontam_keeps_its_flags_and_lists_read_as_names():
    said = help_text("decontam")
    for flag in ("--against", "--against-suite", "--out", "--benchmarks", "--skip-missing", "--report-only", "--dry-run",
                 "--config", "--ngram", "--containment", "--min-answer-words", "--engine", "--workers", "--semantic",
                 "--semantic-model", "--judge-url", "--judge-model", "--overwrite"):
        assert f" {flag} " in f" {said} ", flag
    assert "NAME..." in said and "SUITE..." in said and "<local|ray>" in said


def test_models_list_as_a_script_reads_it():
    as_json = CliRunner().invoke(app, ["models", "list", "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    listed = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert {"smollm2-135m", "tiny-random"} <= set(listed) and isinstance(listed["smollm2-135m"]["cached"], bool)
    as_csv = CliRunner().invoke(app, ["models", "list", "--format", "csv"])
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["name", "cached", "path", "source", "description"] and len(rows) == len(listed) + 1
    bad = CliRunner().invoke(app, ["models", "list", "--format", "xml"])
    assert bad.exit_code == 2 and "table" in bad.output and "json" in bad.output


@pytest.mark.spawn
def test_the_cli_and_its_config_modules_load_nothing_heavy():
    code = ("import sys, rufus_data.cli; "
            "print(sorted(m for m in ('pyarrow', 'numpy', 'scipy', 'tokenizers', 'datasketch', 'torch', 'transformers', "
            "'duckdb', 'httpx') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
