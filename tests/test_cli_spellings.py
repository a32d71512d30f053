"""TRL's and lm-eval's spellings (rufus_data/base/borrowed_options.py): every entry of both tables is
fed through its CLI in-process (a dry run) and shows what it maps to, or its refusal, exit 2;
docs/spellings.md is the tables rendered; `--limit` on sampled tasks says N x k up front."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_data.base.borrowed_options import translate_borrowed
from rufus_data.base.errors import RufusError
from rufus_eval.cli import app as eval_app
from rufus_eval.lm_eval_spellings import LM_EVAL_SPELLINGS
from rufus_train.cli import app as train_app
from rufus_train.config_loading import load_stage_config, parse_cli_overrides
from rufus_train.stages import get_stage
from rufus_train.trl_spellings import TRL_SPELLINGS

REPO = Path(__file__).resolve().parents[1]


def fed(entry) -> list[str]:
    return [entry.name, *(entry.example.split() if entry.example else [])]


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("entry", TRL_SPELLINGS, ids=lambda e: e.name)
def test_each_trl_spelling_through_rufus_train_stage(entry, tmp_path, no_model_loads):
    result = CliRunner().invoke(train_app, ["stage", "sft", "--dry_run", "--model", "tiny-random",
                                            "--output_dir", str(tmp_path / "run"), *fed(entry)], env={"COLUMNS": "200"})
    taken_or_refused(result, entry, "TRL's")


def taken_or_refused(result, entry, whose: str) -> None:
    """A borrowed spelling is either taken, with its note and its Rufus value in the plan, or
    refused (exit 2) with the line that says where Rufus keeps the setting; never a traceback."""
    assert "Traceback" not in result.output and "No such option" not in result.output
    if result.exit_code == 2:
        assert entry.shows in said(result), result.output
        return
    assert result.exit_code == 0, result.output
    assert f"note: {entry.name}" in said(result) and f"is {whose} spelling" in said(result)
    assert entry.shows in result.stdout, result.stdout


@pytest.mark.parametrize("entry", LM_EVAL_SPELLINGS, ids=lambda e: e.name)
def test_each_lm_eval_spelling_through_rufus_eval_suite(entry, no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run", *fed(entry)],
                                env={"COLUMNS": "200"})
    taken_or_refused(result, entry, "lm-eval's")


def test_model_args_key_without_a_rufus_setting_says_where_it_lives(no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run",
                                           "--model_args", "pretrained=tiny-random,trust_remote_code=True"])
    assert result.exit_code == 2 and "--model_args trust_remote_code=True: Rufus keeps no such setting" in said(result)
    assert "--vllm-command" in said(result)


def test_limit_on_sampled_tasks_says_questions_times_samples(no_model_loads):
    result = CliRunner().invoke(eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--dry-run", "--limit", "4",
                                           "--tasks", "gsm8k"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "note: --limit 4 picks 4 questions per task, each answered k times: gsm8k 4 x 4 = 16" in said(result)


def test_the_docs_table_is_the_code_s():
    spec = importlib.util.spec_from_file_location("spellings_doc", REPO / "scripts" / "spellings_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (REPO / "docs" / "spellings.md").read_text() == module.rendered(), "run scripts/spellings_doc.py"


def yaml_value(entry) -> str:
    """The entry's example as a YAML value (`q_proj v_proj` is a list; a bare flag is true)."""
    if entry.example is None:
        return "true"
    return "[" + ", ".join(entry.example.split()) + "]" if entry.takes == "values" else entry.example


@pytest.mark.parametrize("entry", TRL_SPELLINGS, ids=lambda e: e.name)
def test_each_trl_spelling_in_a_stage_yaml_reads_as_on_the_command_line(entry, tmp_path):
    """`model_name_or_path:` in a stage YAML is taken with the command line's table and note, and
    resolves to the config the command line gives; a refused one names the file and line."""
    sft = get_stage("sft").config_class
    mine = tmp_path / "sft.yaml"
    mine.write_text(f"max_steps: 2\n{entry.name[2:]}: {yaml_value(entry)}\n")
    base = ["--output_dir", str(tmp_path / "run")]
    notes: list[str] = []
    try:
        command_line = translate_borrowed([*fed(entry), *base], {entry.name: entry}, print)
    except RufusError as err:
        with pytest.raises(RufusError) as from_yaml:
            load_stage_config("sft", sft, mine, parse_cli_overrides(base), notes=notes)
        assert f"{mine}:2: {err}" in str(from_yaml.value)
        return
    from_yaml = load_stage_config("sft", sft, mine, parse_cli_overrides(base), notes=notes)
    plain = tmp_path / "plain.yaml"
    plain.write_text("max_steps: 2\n")
    assert from_yaml == load_stage_config("sft", sft, plain, parse_cli_overrides(command_line), notes=[])
    assert any(n.startswith(f"note: {mine}:2: {entry.name[2:]} is TRL's spelling") for n in notes), notes


def test_trl_spellings_in_a_pipeline_stage_entry(tmp_path, capsys):
    from rufus_train.pipeline import load_pipeline, stage_configs

    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: p\nmodel: tiny-random\nstages:\n  - {stage: sft, max_seq_length: 128, lora_r: 4}\n")
    config = stage_configs(load_pipeline(pipeline), notes=[])[0]
    assert config.max_length == 128 and config.lora.r == 4
    assert (f"note: {pipeline} stages[0] (sft) key max_seq_length is TRL's spelling: taken as --max_length 128"
            in " ".join(capsys.readouterr().err.split()))


def test_a_trl_spelling_beside_its_rufus_key_is_refused(tmp_path):
    mine = tmp_path / "sft.yaml"
    mine.write_text("max_length: 256\nmax_seq_length: 512\n")
    with pytest.raises(RufusError, match=r"sft.yaml:2: max_seq_length is TRL's spelling of max_length, which is "
                                         r"written too: keep one"):
        load_stage_config("sft", get_stage("sft").config_class, mine, notes=[])
