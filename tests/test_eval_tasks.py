"""Task preparation and scorers of the suites, without a model: the SmolLM3 suite's local tasks
(AIME integers, GSM-Plus without critical thinking, BFCL from the bfcl-eval wheel's AST checker)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from rufus_data.errors import RufusError
from rufus_eval.bfcl import bfcl_rows, parse_calls, score_bfcl
from rufus_eval.metrics import rufus_maj, score_answers
from rufus_eval.suite import load_suite
from rufus_eval.tasks import task_rows, write_task


def test_aime_answers_compare_as_integers():
    scores = score_answers({"name": "boxed", "compare": "integer"},
                           ["so \\boxed{25}", "\\boxed{025}", "\\boxed{24}", "no box", "\\boxed{25.0}"], {"answer": "025"})
    assert scores == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_smollm3_local_tasks_prepare(tmp_path, data_root):
    suite = load_suite("smollm3")
    tasks = {t.name: t for t in suite.tasks}
    assert suite.k(tasks["aime25"]) == 64 and suite.metric_at(tasks["livecodebench"]) == ("pass", 1)
    assert suite.k(tasks["livecodebench"]) == 16
    assert [t.name for t in suite.selected(final=False)] == [t.name for t in suite.tasks if t.role == "validation"]
    gsm_plus = task_rows(tasks["gsm_plus"])
    assert len(gsm_plus) == 2100  # 2,400 minus the 300 critical-thinking rows whose gold is "None"
    assert all(json.loads(r["gold"])["answer"] != "None" for r in gsm_plus)
    config = write_task(suite, tasks["aime25"], tmp_path)
    assert config["repeats"] == 64 and config["dataset_path"] == "json"
    assert config["generation_kwargs"]["temperature"] == 0.6 and config["generation_kwargs"]["top_p"] == 0.95
    assert yaml.safe_load((tmp_path / "aime25.yaml").read_text())["metric_list"][0]["metric"] == "rufus_avg"
    rows = [json.loads(line) for line in (tmp_path / "aime25.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and json.loads(rows[0]["gold"])["answer"] == "70"


def test_hub_and_missing_local_tasks_say_what_to_do(data_root):
    tasks = {t.name: t for t in load_suite("smollm3").tasks}
    with pytest.raises(RufusError, match="livecodebench/test_v4_v5.jsonl does not exist.*needs the hub"):
        task_rows(tasks["livecodebench"])
    with pytest.raises(RufusError, match="needs the hub dataset MixEval/MixEval.*set data.local_path"), \
            pytest.warns(UserWarning, match="revision 'main' of MixEval/MixEval is a branch or tag, not a commit"):
        task_rows(tasks["mixeval_hard"])


def test_bfcl_ast_checker_from_the_wheel_only():
    rows = bfcl_rows("bfcl-eval==2026.3.23", "simple_python")
    assert len(rows) == 400 and "calculate_triangle_area" in rows[0]["question_text"]
    gold = {k: rows[0][k] for k in ("function", "ground_truth", "category")}
    assert parse_calls("[calculate_triangle_area(base=10, height=5)]") == [{"calculate_triangle_area": {"base": 10, "height": 5}}]
    assert score_bfcl("```python\n[calculate_triangle_area(base=10, height=5, unit='units')]\n```", gold) == 1.0
    assert score_bfcl("[calculate_triangle_area(base=10, height=6)]", gold) == 0.0
    assert score_bfcl("The area is 25.", gold) == 0.0
    # only the checker was loaded: the wheel's model SDK imports (openai handlers, anthropic, ...) were not
    assert type(sys.modules["bfcl_eval.constants.model_config"].MODEL_CONFIG_MAPPING).__name__ == "_NoRenames"
    assert not any(m.startswith(("bfcl_eval.model_handler", "anthropic", "cohere", "mistralai")) for m in sys.modules)


def test_majority_vote_scores_the_most_frequent_answer():
    gold = json.dumps({"answer": "12", "rufus_prompt": "q"})
    answers = ["\\boxed{12}", "\\boxed{7}", "\\boxed{7}", "\\boxed{12}", "\\boxed{7}"]
    assert rufus_maj([gold], [answers], scorer={"name": "boxed"}, k=5, at=5)["maj@5"] == 0.0
    assert rufus_maj([gold], [answers], scorer={"name": "boxed"}, k=5, at=1)["maj@1"] == 1.0


def test_vibe_answers_side_by_side(tmp_path, builtin_model):
    from rufus_eval.vibe import run_vibe

    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("- What is 12 * 3?\n- {system: You are a pirate., user: Say hello.}\n")
    answers = run_vibe(prompts, ["smollm2-135m", builtin_model], max_tokens=8, out=tmp_path / "vibe.md")
    assert [len(a) for a in answers.values()] == [2, 2]
    assert answers["smollm2-135m"] == answers[builtin_model]  # greedy: the same model answers the same
    assert "You are a pirate" not in (tmp_path / "vibe.md").read_text() and "Say hello." in (tmp_path / "vibe.md").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {usr: hi}\n")
    with pytest.raises(RufusError, match="prompt 0"):
        run_vibe(bad, [builtin_model])


def test_livecodebench_from_a_local_jsonl_runs_stdin_stdout_cases(tmp_path, monkeypatch):
    """LiveCodeBench is Rufus-defined: a pinned local JSONL whose `test_cases` ([{input, output}])
    reach the code scorer, one sandboxed stdin/stdout run per case."""
    cases = [{"input": "3\n", "output": "6\n", "testtype": "stdin"}, {"input": "10\n", "output": "55\n", "testtype": "stdin"}]
    folder = tmp_path / "livecodebench"
    folder.mkdir()
    row = {"question_id": "lcb-sum", "question_content": "Read n and print 1 + 2 + ... + n.", "test_cases": json.dumps(cases)}
    (folder / "test_v4_v5.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))
    task = {t.name: t for t in load_suite("smollm3").tasks}["livecodebench"]
    rows = task_rows(task)
    assert len(rows) == 1 and rows[0]["prompt"].startswith("Read n and print")
    gold = json.loads(rows[0]["gold"])
    right = "```python\nn = int(input())\nprint(n * (n + 1) // 2)\n```"
    off_by_one = "```python\nn = int(input())\nprint(n * (n - 1) // 2)\n```"
    crashes = "```python\nprint(undefined_name)\n```"
    assert score_answers(task.scorer.model_dump(), [right, off_by_one, crashes], gold) == [1.0, 0.0, 0.0]
