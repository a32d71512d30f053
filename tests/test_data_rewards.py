"""Rewards travel with the data: an rl catalog source's `reward:` is checked when the catalog
loads, written into each of its rows by mix, turned into label-scoped rewards by filter, pairs
and the RL stages when they are given none, and an explicit reward overrides it. Also: the
commands' option models load nothing heavy (`rufus-data --help` stays fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import read_shards
from rufus_data.mix import mix
from rufus_data.rewards.data_rewards import (
    REWARD_COLUMN,
    data_reward_specs,
    label_scoped_specs,
    scoring_specs,
    specs_by_label,
)
from rufus_data.rollouts.scoring import Scorer
from rufus_data.sources.catalog import load_catalog

REPO = Path(__file__).resolve().parents[1]
NUMBER = {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}
WORKED = {**NUMBER, "gold_extractor": "gsm8k"}


def rl_catalog(tmp_path: Path, arithmetic_reward, words_reward, *, label: str | None = None) -> Path:
    """catalogs/rl.yaml's two sample sources, with the given rewards (None: no `reward:`) and label."""
    sources = []
    for name, path, fmt, share, reward in (
        ("arithmetic", "rl_arithmetic.jsonl", "question_answer", 0.7, arithmetic_reward),
        ("word_problems", "arithmetic_sft.jsonl", "messages", 0.3, words_reward),
    ):
        source = {"name": name, "path": str(REPO / "catalogs" / "samples" / path), "format": fmt, "share": share}
        if reward is not None:
            source["reward"] = reward
        if label is not None:
            source["label"] = label
        sources.append(source)
    path = tmp_path / "rl.yaml"
    path.write_text(json.dumps({"kind": "rl", "name": "rl", "tokenizer": "smollm2-135m", "seed": 0, "holdout": 4,
                                "sources": sources}))
    return path


def test_a_bad_reward_is_refused_when_the_catalog_loads(tmp_path):
    with pytest.raises(RufusError, match=r"rl\.yaml.*unknown reward 'no_such_reward'"):
        load_catalog(rl_catalog(tmp_path, "no_such_reward", None))
    with pytest.raises(RufusError, match=r"reward 'string_match' has no parameter\(s\) \['colum'\]"):
        load_catalog(rl_catalog(tmp_path, {"name": "string_match", "colum": "x"}, None))
    sft = tmp_path / "sft.yaml"
    sft.write_text(json.dumps({"kind": "sft", "name": "s", "sources": [
        {"name": "a", "path": str(REPO / "catalogs" / "samples" / "arithmetic_sft.jsonl"), "share": 1.0,
         "reward": "string_match:gsm8k"}]}))
    with pytest.raises(RufusError, match="`reward:` is for sources of an rl catalog.*drop it from a"):
        load_catalog(sft)
    # two sources sharing a label must share a reward: a row's reward is looked up by its label
    with pytest.raises(RufusError, match="share the label 'same' but declare different rewards"):
        mix(rl_catalog(tmp_path, NUMBER, WORKED, label="same"), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_mix_writes_each_sources_reward_into_its_rows(tmp_path):
    """The default RL catalog declares a reward per source: every row carries its own."""
    result = mix(REPO / "catalogs" / "rl.yaml", tmp_path / "rl")
    rows = read_shards(tmp_path / "rl").to_pylist() + read_shards(tmp_path / "rl", "holdout").to_pylist()
    by_source = {r["source"]: json.loads(r[REWARD_COLUMN]) for r in rows}
    assert by_source == {"arithmetic": [NUMBER], "word_problems": [WORKED]}
    labels = {s["name"]: s["label"] for s in result.manifest["sources"]}
    assert result.manifest["rewards"] == {labels["arithmetic"]: [NUMBER], labels["word_problems"]: [WORKED]}
    assert {s["name"]: s["reward"] for s in result.manifest["sources"]} == {"arithmetic": [NUMBER], "word_problems": [WORKED]}


def test_rows_are_scored_by_their_own_sources_reward():
    rows = [
        {"id": "a", "label": "bare", "expected_output": "13", REWARD_COLUMN: json.dumps([NUMBER])},
        {"id": "w", "label": "worked", "expected_output": "2 + 11 = 13\n#### 13", REWARD_COLUMN: json.dumps([WORKED])},
    ]
    specs = data_reward_specs(rows)
    assert specs == [{**NUMBER, "only_label": "bare", "weight": 1.0}, {**WORKED, "only_label": "worked", "weight": 1.0}]
    scorer = Scorer.from_specs(specs)
    assert scorer.names == ["string_match_last_number@bare", "string_match_last_number@worked"]
    for row in rows:
        combined, per_function = scorer.score(row, [{"role": "user", "content": "?"}], ["it is 13", "it is 12"])
        assert combined == [1.0, 0.0]  # the other label's reward leaves the row alone (None, excluded)
        own = f"string_match_last_number@{row['label']}"
        assert per_function[own] == [1.0, 0.0]
        assert all(scores == [None, None] for name, scores in per_function.items() if name != own)
    assert scoring_specs([NUMBER], rows) == ([NUMBER], "--reward")  # an explicit reward overrides the data's


def test_rows_without_a_reward_or_with_two_are_refused():
    with pytest.raises(RufusError, match="no reward given and the rows declare none: pass --reward"):
        data_reward_specs([{"label": "a"}])
    with pytest.raises(RufusError, match=r"rows of label\(s\) b declare no reward"):
        specs_by_label(["a", "b"], [json.dumps([NUMBER]), None])
    with pytest.raises(RufusError, match="rows of label 'a' declare two different rewards"):
        specs_by_label(["a", "a"], [json.dumps([NUMBER]), json.dumps([WORKED])])
    with pytest.raises(RufusError, match="sets only_label='other'"):
        label_scoped_specs({"a": [{**NUMBER, "only_label": "other"}]})


def test_rl_stages_take_the_datas_rewards_when_they_name_none(tmp_path):
    """`rewards: []` (reasoning_rl keeps its automatic overlong penalty): the stage's check passes
    only when the data declares rewards, and the dataset step puts them in front."""
    import pyarrow as pa
    from test_train_grpo_guards import grpo_config

    from rufus_train.stages import get_stage

    declared = str(rl_catalog(tmp_path, NUMBER, WORKED))
    config = grpo_config(rewards=[], data=[declared], max_completion_length=64)
    assert [spec["name"] for spec in config.rewards] == ["overlong_penalty"]
    stage = get_stage("reasoning_rl")
    stage.check(config)
    undeclared = tmp_path / "partial"
    undeclared.mkdir()
    with pytest.raises(RufusError, match="has no rewards: name at least one.*catalog sources declare `reward:`"):
        stage.check(grpo_config(rewards=[], data=[str(rl_catalog(undeclared, NUMBER, None))]))
    stage.check(grpo_config(data=[str(rl_catalog(undeclared, NUMBER, None))]))  # its own rewards: no need

    class Tokenizer:
        def apply_chat_template(self, prompt, **kwargs):
            return [0] * 8

    rows = pa.Table.from_pylist([
        {"id": "1", "label": "l1", "prompt": [{"role": "user", "content": "1+1?"}], "expected_output": "2",
         REWARD_COLUMN: json.dumps([NUMBER])},
    ])
    stage.build_dataset(config, rows, Tokenizer())
    assert config.rewards[0] == {**NUMBER, "only_label": "l1", "weight": 1.0}
    assert config.rewards[1]["name"] == "overlong_penalty" and config.reward_weights() == [1.0, 1.0]


@pytest.mark.spawn
def test_the_cli_loads_nothing_heavy_at_start():
    """`rufus-data --help` and the light commands build the filter/pairs options from their config
    models without arrow, an HTTP client or a model library."""
    code = ("import sys, rufus_data.cli; "
            "print(sorted(m for m in ('pyarrow', 'httpx', 'torch', 'transformers', 'datasets', 'duckdb') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
