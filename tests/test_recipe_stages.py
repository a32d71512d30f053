"""Recipe configs beside the stages (catalogs/stages/*.yaml naming their stage with `stage:`),
as their seeds write them: the playbook's Big-Math `/no_think` GRPO with DAPO's overlong penalty
(001). Each file opens with the command lines that run it; the tests run those lines (dry runs),
so the header cannot drift from the file."""

from __future__ import annotations

import shlex

import pytest
from conftest import REPO
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.sources.canonical import Canonicaliser, open_source
from rufus_data.sources.catalog import load_catalog
from rufus_data.sources.source_formats import detect_format, resolve_columns
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config
from rufus_train.stages import get_stage

BIG_MATH = "catalogs/stages/big_math_no_think.yaml"


def header_commands(path: str) -> dict[str, list[str]]:
    """The `rufus-train ...` lines of a file's opening comment, by subcommand: their arguments."""
    commands = {}
    for line in (REPO / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("# ").removeprefix("Run: ")
        if text.startswith("rufus-train "):
            words = shlex.split(text.split(" [")[0])
            commands[words[1]] = words[2:]
    return commands


def recipe(path: str, **overrides):
    return load_stage_config("reasoning_rl", get_stage("reasoning_rl").config_class, REPO / path, overrides)


# ------------------------------------------------------------------ Big-Math /no_think (playbook)


def test_big_math_stage_penalises_overlong_answers_as_the_playbook_sets_it():
    """math_equivalence on the verified answer plus DAPO's soft penalty over the last 512 of 3072
    tokens: 0 up to 2560, -1 at 3072 (the playbook's 2.5-3k threshold)."""
    assert header_commands(BIG_MATH)["stage"] == ["reasoning_rl", "--config", BIG_MATH]
    config = recipe(BIG_MATH)
    assert config.data == ["catalogs/data/big_math_no_think.yaml"] and config.max_completion_length == 3072
    assert {"name": "math_equivalence", "answer_column": "expected_output"} in config.rewards
    penalty = [r for r in config.rewards if r["name"] == "overlong_penalty"]
    assert [(p["max_length"], p["cache"]) for p in penalty] == [(3072, 512)]
    result = CliRunner().invoke(app, ["stage", *header_commands(BIG_MATH)["stage"], "--dry_run"])
    assert result.exit_code == 0, result.output
    assert "overlong_cache: 512" in result.output and "config valid" in result.output


def test_big_math_prompts_carry_no_think_and_say_when_gsm8k_train_stands_in(hub_offline, data_root):
    catalog = load_catalog(REPO / "catalogs/data/big_math_no_think.yaml")
    (source,) = catalog.sources
    assert (source.hub.id, source.hub.split, source.system) == ("SynthLabsAI/Big-Math-RL-Verified", "train", "/no_think")
    with pytest.warns(UserWarning, match="revision 'main' of SynthLabsAI/Big-Math-RL-Verified is a branch"):
        opened = open_source(source)
    first = next(opened.rows)
    fmt = detect_format(opened.spec, first, catalog.kind)
    row = Canonicaliser(opened.spec, catalog.kind, fmt, resolve_columns(opened.spec, fmt, first))(first, 0)
    assert opened.provenance["fallback"]["used"] and "Big-Math-RL-Verified" in opened.provenance["fallback"]["instead_of"]
    assert opened.provenance["from"].endswith("gsm8k/train.jsonl")  # GSM8K train, never an eval split
    assert row["prompt"][0] == {"role": "system", "content": "/no_think"}
    assert row["prompt"][1]["role"] == "user" and row["expected_output"].rstrip().split("#### ")[-1].isdigit()


def test_big_math_without_its_data_is_refused_naming_both_places(hub_offline, monkeypatch, tmp_path):
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))
    (source,) = load_catalog(REPO / "catalogs/data/big_math_no_think.yaml").sources
    with pytest.warns(UserWarning), pytest.raises(
            RufusError, match=r"source 'big_math': hub SynthLabsAI/Big-Math-RL-Verified .* is not available here, and "
                              r"source 'big_math' \(fallback\) could not be loaded; tried: \$RUFUS_DATA_ROOT/gsm8k/train"):
        open_source(source)
