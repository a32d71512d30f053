"""Tulu 3 mini's data: each stage's catalog (catalogs/data/tulu3_mini_*.yaml), mixed by rufus-data
from a data root holding the first GSM8K train rows, gives the rows the notebook
(shared/seeds/003_d17be3c0c87e36f6.txt) builds, cut as it cuts them: one system prompt; SFT = rows
0-191 (`train_rows[: cfg.n_sft]`), targets without the <<...>> calculator notes ending "The answer is
N."; DPO = rows 192-287 (`train_rows[cfg.n_sft:]`), pairs made as its `make_pair` makes them; RLVR =
the prompts of rows 0-191 with their gold answers."""

from __future__ import annotations

import json
import random
import re

import pyarrow.parquet as pq
import pytest
from conftest import REPO, read_jsonl

from rufus_data.mix import mix
from rufus_data.rewards.registry import build_reward

SYSTEM = "You are a careful math assistant. Reason step by step, then finish with 'The answer is N.'"
N_SFT, N_DPO = 192, 96  # CFG.n_sft, CFG.n_dpo
ROWS = N_SFT + N_DPO  # the notebook's train_rows: range(cfg.n_sft + cfg.n_dpo)
STAGE_ROWS = {"sft": slice(0, N_SFT), "dpo": slice(N_SFT, ROWS), "rl": slice(0, N_SFT)}

# The notebook's construction, written out for the first GSM8K train rows (what the builders must give).
FIRST_TARGETS = [
    ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n"
     "The answer is 72."),
    "Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\nThe answer is 10.",
]


def notebook_target(answer: str) -> str:
    """The reasoning before ####, calculator notes removed, then 'The answer is N.'"""
    steps, final = answer.split("####")
    return re.sub(r"<<.*?>>", "", steps).strip() + f"\nThe answer is {final.strip().replace(',', '')}."


@pytest.fixture(scope="module")
def gsm8k_rows(data_root) -> list[dict]:
    return read_jsonl(data_root / "gsm8k" / "train.jsonl", ROWS)


@pytest.fixture(scope="module")
def stage_rows(gsm8k_rows, tmp_path_factory) -> dict[str, dict[str, dict]]:
    """stage -> {question: the mixed row}: each shipped catalog mixed from a root of ROWS GSM8K rows."""
    root = tmp_path_factory.mktemp("root")
    (root / "gsm8k").mkdir()
    (root / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUFUS_DATA_ROOT", str(root))
        patch.setenv("HF_HUB_OFFLINE", "1")
        out = {}
        for stage in ("sft", "dpo", "rl"):
            result = mix(REPO / "catalogs" / "data" / f"tulu3_mini_{stage}.yaml", tmp_path_factory.mktemp(stage) / "out", overwrite=True)
            rows = [r for f in sorted((result.out / "data").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
            assert result.manifest["sources"][0]["fingerprint"]["from"] == str(root / "gsm8k" / "train.jsonl"), stage
            out[stage] = {_user(r["messages"] if stage == "sft" else r["prompt"]): r for r in rows}
    return out


def _user(messages: list[dict]) -> str:
    assert [m["role"] for m in messages][:2] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM  # the one system prompt, in every stage's rows
    return messages[1]["content"]


def notebook_pairs(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """question -> (chosen, rejected) as the notebook's make_pair writes them, after random.seed(CFG.seed)."""
    rng = random.Random(42)
    pairs = {}
    for row in rows:
        gold = row["answer"].split("####")[-1].strip().replace(",", "")
        bad = (str(int(float(gold)) + rng.choice([-10, -3, -1, 1, 2, 7]))
               if gold.replace(".", "", 1).lstrip("-").isdigit() else gold + "0")
        good = notebook_target(row["answer"])
        pairs[row["question"]] = (good, good.rsplit("The answer is", 1)[0] + f"The answer is {bad}.")
    return pairs


def test_each_stage_has_the_notebooks_slice_of_gsm8k_train(gsm8k_rows, stage_rows):
    for stage, cut in STAGE_ROWS.items():
        assert sorted(stage_rows[stage]) == sorted(g["question"] for g in gsm8k_rows[cut]), stage
    assert not set(stage_rows["sft"]) & set(stage_rows["dpo"])  # disjoint


def test_sft_rows_are_the_notebook_targets(gsm8k_rows, stage_rows):
    rows = stage_rows["sft"]
    for gold in gsm8k_rows[STAGE_ROWS["sft"]]:
        messages = rows[gold["question"]]["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant"]
        target = messages[2]["content"]
        assert target == notebook_target(gold["answer"])
        assert "<<" not in target and "####" not in target and target.endswith(f"The answer is {target.split()[-1]}")
    assert [rows[g["question"]]["messages"][2]["content"] for g in gsm8k_rows[:2]] == FIRST_TARGETS


def test_dpo_pairs_are_the_notebooks_make_pair(gsm8k_rows, stage_rows):
    """Every pair as make_pair writes it: N moved by -10, -3, -1, 1, 2 or 7, drawn in row order from
    the notebook's seed."""
    expected = notebook_pairs(gsm8k_rows[STAGE_ROWS["dpo"]])
    got = {q: (r["chosen"][0]["content"], r["rejected"][0]["content"]) for q, r in stage_rows["dpo"].items()}
    assert got == expected


def test_dpo_pairs_change_only_the_final_number(gsm8k_rows, stage_rows):
    rows = stage_rows["dpo"]
    for gold in gsm8k_rows[STAGE_ROWS["dpo"]]:
        row = rows[gold["question"]]
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        assert [row["chosen"][0]["role"], row["rejected"][0]["role"]] == ["assistant", "assistant"]
        assert chosen == notebook_target(gold["answer"])
        stem = "\nThe answer is "
        assert chosen.rsplit(stem, 1)[0] == rejected.rsplit(stem, 1)[0]  # the reasoning, word for word
        n_chosen, n_rejected = (re.fullmatch(r"(-?[\d.]+)\.", t.rsplit(stem, 1)[1]).group(1) for t in (chosen, rejected))
        assert int(n_rejected) - int(n_chosen) in (-10, -3, -1, 1, 2, 7)


def test_rlvr_prompts_carry_the_gold_the_verifier_reads(gsm8k_rows, stage_rows):
    rows = stage_rows["rl"]
    gsm8k_rows = gsm8k_rows[STAGE_ROWS["rl"]][:6]
    verifier = build_reward({"name": "string_match", "extractor": "last_number", "gold_extractor": "gsm8k",
                             "answer_column": "expected_output"})
    for gold in gsm8k_rows:
        row = rows[gold["question"]]
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["expected_output"] == gold["answer"]
        right, wrong = notebook_target(gold["answer"]), "The answer is 123456789."
        scores = verifier.score_rows([row["prompt"]] * 2, [right, wrong], [True, True], [row, row], None)
        assert scores == [1.0, 0.0]  # the SFT target earns the reward, another number does not
