"""The checkpoint_eval suite: the Rufus-Air checkpoint evaluation's metrics eval/mmlu_pro and
eval/gpqa_diamond (seed 000). Neither set is in the shared data root: where a set is here its task
runs, where it is not the task is listed as not run with its reason and fetch command, and a run
where neither is here is refused before the model loads. Real runs of the built-in tiny-random."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.convert import mmlu_pro_row
from rufus_data.benchmarks.suite import load_suite
from rufus_eval.checkpoint_eval.curve import EvalCurve
from rufus_eval.checkpoint_eval.trackers import Trackers
from rufus_eval.cli import app
from rufus_eval.metrics import score_answers

MMLU_PRO_ROWS = [  # hub-shaped (TIGER-Lab/MMLU-Pro test), written for this test
    {"question_id": 70, "question": "Which planet is known as the red planet?", "options":
        ["Venus", "Mars", "Jupiter", "Saturn", "Mercury", "Neptune", "Uranus", "Pluto", "Earth", "the Moon"],
     "answer": "B", "answer_index": 1, "cot_content": "", "category": "other", "src": "test"},
    {"question_id": 71, "question": "What is 2 + 2?", "options": ["3", "4", "5"], "answer": "B", "answer_index": 1,
     "cot_content": "", "category": "math", "src": "test"},
]


def test_the_suite_names_the_seeds_two_metrics():
    suite = load_suite("checkpoint_eval")
    assert [(t.name, t.benchmark, t.role) for t in suite.tasks] == [
        ("mmlu_pro", "mmlu_pro", "validation"), ("gpqa_diamond", "gpqa_diamond", "validation")]


def test_mmlu_pro_rows_get_lettered_options_and_the_letter_scores():
    row = mmlu_pro_row(MMLU_PRO_ROWS[0], 0)
    assert row["options_text"].splitlines()[1] == "B. Mars" and row["options_text"].splitlines()[9] == "J. the Moon"
    assert mmlu_pro_row(row, 0) is row  # a pulled (converted) copy passes through
    with pytest.raises(RufusError, match=r"MMLU-Pro row 3 has no \['options'\].*TIGER-Lab/MMLU-Pro"):
        mmlu_pro_row({"question": "q", "answer": "A"}, 3)
    (scorer,) = [t.scorer.spec for t in load_suite("checkpoint_eval").tasks if t.name == "mmlu_pro"]
    texts = ["Mars is red. The answer is (B)", "The answer is (J)"]
    assert score_answers(scorer, texts, {"answer": "B"}) == [1.0, 0.0]
    assert score_answers(scorer, ["The answer is (J)"], {"answer": "J"}) == [1.0]  # the tenth option


def test_a_run_with_neither_set_here_is_refused_naming_both_fetch_commands(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["suite", "checkpoint_eval", "--ckpt", "tiny-random", "--out", str(out)])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "no task of suite checkpoint_eval can run here" in text
    for task in ("mmlu_pro", "gpqa_diamond"):
        assert f"fetch it with `rufus-eval data pull checkpoint_eval --tasks {task} --to $RUFUS_DATA_ROOT`" in text
    assert "Idavidrein/gpqa is gated" in text and "Traceback" not in res.output and not out.exists()


def test_the_set_that_is_here_runs_and_the_other_is_listed_as_not_run(tmp_path, monkeypatch, tiny_model):
    root = tmp_path / "data"
    (root / "mmlu_pro").mkdir(parents=True)
    (root / "mmlu_pro" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MMLU_PRO_ROWS))
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["suite", "checkpoint_eval", "--ckpt", "tiny-random", "--out", str(out),
                                   "--max-tokens", "4"])
    assert res.exit_code == 0, res.output
    record = json.loads((out / "results.json").read_text())
    mmlu, gpqa = record["tasks"]["mmlu_pro"], record["tasks"]["gpqa_diamond"]
    assert mmlu["status"] == "ran" and mmlu["docs"] == 2 and 0.0 <= mmlu["value"] <= 1.0
    assert gpqa["status"] == "skipped" and gpqa["value"] is None
    assert gpqa["fetch"] == "rufus-eval data pull checkpoint_eval --tasks gpqa_diamond --to $RUFUS_DATA_ROOT"
    assert f"to get it: {gpqa['fetch']}" in res.stderr
    # as the checkpoint evaluation logs it: one eval/<task> per task that ran, none for the skipped one
    curve = EvalCurve(Trackers())
    curve.finished.put((5, record))
    state = SimpleNamespace(log_history=[], global_step=5)
    curve.drain(state)
    assert curve.logged == [{"eval/mmlu_pro": mmlu["value"], "eval/step": 5, "train/global_step": 5}]
