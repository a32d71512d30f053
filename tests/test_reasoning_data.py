"""Hybrid reasoning data: the IFThink-style builder (multi-turn, every turn reasoned, each follow-up's
instruction verified by IFEval), the three baby-baseline mixtures (no reasoning, reasoning,
hybrid), and `rufus-data inspect`'s reasoning-mode check, on real rows mixed offline."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice

import pytest
import yaml
from conftest import REPO

from rufus_data.mix import mix
from rufus_data.rewards.ifeval import IFEvalReward
from rufus_data.shard_inspect import inspect_shards
from rufus_data.sources.builders import IFTHINK_REWRITES, build_rows
from rufus_data.sources.catalog import SourceRows
from rufus_data.sources.dataset_source import load_rows

ROWS = 24
SOURCES = ("gsm8k/train.jsonl", "code_alpaca_2k/code_alpaca_2k.jsonl", "alpaca_seed_tasks/seed_tasks.jsonl")


@pytest.fixture(scope="module")
def small_root(data_root, tmp_path_factory):
    """A data root with the first ROWS rows of each source the catalogs below read offline."""
    root = tmp_path_factory.mktemp("root")
    for name in SOURCES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with open(data_root / name) as src, open(root / name, "w") as dst:
            dst.writelines(islice(src, ROWS))
    return root


def mixed(catalog, root, out, monkeypatch):
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return mix(catalog, out, overwrite=True).out


def test_ifthink_rows_reason_every_turn_and_follow_each_instruction(small_root):
    rows = list(build_rows("ifthink_conversations", load_rows(SourceRows(path=str(small_root / SOURCES[0])), "g").rows,
                           "gsm8k", Counter()))
    assert len(rows) == ROWS
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * 3
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert all(r.startswith("<think>\n") and "\n</think>\n\n" in r for r in replies)  # every turn reasons
        assert replies[0].endswith(".") and "The answer is" in replies[0]
        ids, kwargs = row["instruction_id_list"], json.loads(row["kwargs"])
        assert len(set(ids)) == 2 and set(ids) <= set(IFTHINK_REWRITES)
        for turn, (instruction, kw) in enumerate(zip(ids, kwargs, strict=True), start=1):
            answer = replies[turn].split("\n</think>\n\n", 1)[1]
            one = {"instruction_id_list": [instruction], "kwargs": json.dumps([kw])}
            prompt = [{"role": "user", "content": row["messages"][2 * turn]["content"]}]
            assert IFEvalReward().score_rows([prompt], [answer], [True], [one], None) == [1.0], (instruction, answer)
    assert len({i for r in rows for i in r["instruction_id_list"]}) >= 5  # drawn across the menu


def test_baby_baselines_train_in_their_modes(small_root, tmp_path, monkeypatch):
    expected = {"no_reasoning": {"/no_think"}, "reasoning": {"/think"}, "hybrid": {"/think", "/no_think"}}
    for name, modes in expected.items():
        found = inspect_shards(mixed(REPO / "catalogs" / "baby_baselines" / f"{name}.yaml", small_root,
                                     tmp_path / name, monkeypatch))
        by_mode = {m["mode"]: m for m in found.modes}
        assert set(by_mode) == modes, name
        assert found.warnings == [], name
        if "/no_think" in by_mode:
            assert by_mode["/no_think"]["reasoned_every_turn"] == 0
        if "/think" in by_mode:  # every /think row reasons in every reply, the IFThink rows across 3 turns
            think = by_mode["/think"]
            assert think["reasoned_every_turn"] == think["rows"] and think["multi_turn"] > 0, name
    # they are the data of the full fine-tuning baseline stage (sft_full) as typed
    assert all(yaml.safe_load((REPO / "catalogs" / "baby_baselines" / f"{n}.yaml").read_text())["kind"] == "sft"
               for n in expected)


def test_inspect_reports_reasoning_missing_from_some_turns(small_root, tmp_path, monkeypatch):
    """The playbook's bug in data: IFThink rows whose earlier turns lost their reasoning (the mix's
    default strips past turns' <think> blocks) train /think turns without it: counted and warned."""
    catalog = yaml.safe_load((REPO / "catalogs" / "data" / "ifthink_conversations.yaml").read_text())
    good = inspect_shards(mixed(REPO / "catalogs" / "data" / "ifthink_conversations.yaml", small_root, tmp_path / "ok",
                                monkeypatch))
    assert good.modes == [{"mode": "/think", "rows": ROWS, "multi_turn": ROWS, "reasoned_every_turn": ROWS}]
    assert good.warnings == []
    del catalog["sources"][0]["strip_past_reasoning"]  # the default: earlier turns' reasoning removed
    stripped = tmp_path / "stripped.yaml"
    stripped.write_text(yaml.safe_dump(catalog))
    bad = inspect_shards(mixed(stripped, small_root, tmp_path / "bad", monkeypatch))
    assert bad.modes == [{"mode": "/think", "rows": ROWS, "multi_turn": ROWS, "reasoned_every_turn": 0}]
    assert any(w.startswith(f"{ROWS} multi-turn /think rows reason (<think>) in some replies but not in all")
               for w in bad.warnings), bad.warnings
