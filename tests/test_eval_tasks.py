"""Task preparation and scorers of the suites, without a model: the SmolLM3 suite's local tasks
(AIME integers, GSM-Plus without critical thinking, BFCL from the bfcl-eval wheel's AST checker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.bfcl import bfcl_rows
from rufus_data.benchmarks.convert import convert_rows
from rufus_data.benchmarks.suite import load_suite
from rufus_data.rewards import build_reward
from rufus_data.rewards.bfcl import parse_calls, score_bfcl
from rufus_eval.metrics import rufus_maj, score_answers
from rufus_eval.task_data import TaskDataMissing
from rufus_eval.tasks import task_rows, write_task

REPO = Path(__file__).resolve().parents[1]


def test_aime_answers_compare_as_integers():
    scores = score_answers({"name": "string_match", "extractor": "boxed", "compare": "integer", "answer_column": "answer"},
                           ["so \\boxed{25}", "\\boxed{025}", "\\boxed{24}", "no box", "\\boxed{25.0}"], {"answer": "025"})
    assert scores == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_smollm3_local_tasks_prepare(tmp_path, data_root):
    suite = load_suite("smollm3")
    tasks = {t.name: t for t in suite.tasks}
    assert suite.k(tasks["aime25"]) == 64 and suite.metric_at(tasks["livecodebench"]) == ("pass", 1)
    assert suite.k(tasks["livecodebench"]) == 16
    assert [t.name for t in suite.selected(final=False)] == [t.name for t in suite.tasks if t.role == "validation"]
    gsm_plus = task_rows(tasks["gsm_plus"])
    # all 2,400, the 300 critical-thinking rows (gold "None") scored as GSM-Plus defines them
    assert len(gsm_plus) == 2400 and sum(json.loads(r["gold"])["answer"] == "None" for r in gsm_plus) == 300
    config = write_task(suite, tasks["aime25"], tmp_path)
    assert config["repeats"] == 64 and config["dataset_path"] == "json"
    assert config["generation_kwargs"]["temperature"] == 0.6 and config["generation_kwargs"]["top_p"] == 0.95
    assert yaml.safe_load((tmp_path / "aime25.yaml").read_text())["metric_list"][0]["metric"] == "rufus_avg"
    rows = [json.loads(line) for line in (tmp_path / "aime25.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and json.loads(rows[0]["gold"])["answer"] == "70"


# items per smollm3 benchmark whose data is not under the shared data root (hub-only or gated)
HUB_ONLY_SIZES = {"livecodebench": 268, "gpqa_diamond": 198, "mixeval_hard": 1000, "global_mmlu": 14042}


def test_small_benchmarks_are_averaged_over_several_samples(data_root):
    """The playbook's rule: a set under about 2,000 items is averaged over k > 1 samples (one sample
    of a few hundred items is too noisy to compare checkpoints); larger sets take one. --repeats
    still sets every task's k."""
    from rufus_eval.request import EvalRequest, apply_sampling_overrides

    suite = load_suite("smollm3")
    for task in (t for t in suite.tasks if t.kind == "rufus"):
        size = HUB_ONLY_SIZES.get(task.name) or len(task_rows(task, "smollm3"))
        assert (suite.k(task) > 1) == (size < 2000), (task.name, size, suite.k(task))
    apply_sampling_overrides(suite, EvalRequest(suite="smollm3", checkpoint="m", repeats=1))
    assert {suite.k(t) for t in suite.tasks} == {1}
    assert all(suite.metric_at(t) == (t.metric.split("@")[0], 1) for t in suite.tasks if t.kind == "rufus")


def test_tasks_whose_data_is_not_here_say_how_to_fetch_it(data_root, monkeypatch, caplog, recwarn):
    """Offline, a registry benchmark with neither a local copy nor a reachable hub raises TaskDataMissing:
    every place tried, and the `data pull` command that fetches it (the runner skips the task with both)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = {t.name: t for t in load_suite("smollm3").tasks}
    with pytest.raises(TaskDataMissing, match=r"livecodebench/test_v4_v5.jsonl.*livecodebench/code_generation_lite") as err:
        task_rows(tasks["livecodebench"], "smollm3")
    assert err.value.fetch == "rufus-eval data pull smollm3 --tasks livecodebench --to $RUFUS_DATA_ROOT"
    with pytest.raises(TaskDataMissing, match=r"Idavidrein/gpqa is gated: accept its terms.*HF_TOKEN"), \
            caplog.at_level("INFO", logger="rufus_data"):
        task_rows(tasks["gpqa_diamond"], "smollm3")
    # the shipped registry's unpinned revision is for Rufus's maintainers: logged, not warned
    assert "revision 'main' of Idavidrein/gpqa is a branch or tag, not a commit" in caplog.text
    assert not [w for w in recwarn if "Idavidrein/gpqa" in str(w.message)]


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


def test_bfcl_ast_reward_through_the_registry():
    """The BFCL checker is a registry reward (`bfcl_ast`): the row's function, ground_truth and category
    are its dataset columns; reasoning is stripped first; a row without them is unscored (None)."""
    rows = bfcl_rows("bfcl-eval==2026.3.23", "multiple")[:2]
    reward = build_reward({"name": "bfcl_ast", "wheel": "bfcl-eval==2026.3.23"})
    right = [first_accepted_call(row["ground_truth"][0]) for row in rows]
    columns = {c: [row[c] for row in rows] for c in ("function", "ground_truth", "category")}
    assert reward(completions=[f"<think>which one?</think>{right[0]}", right[1]], **columns) == [1.0, 1.0]
    assert reward(completions=[right[1], "I cannot call anything."], **columns) == [0.0, 0.0]
    assert reward(completions=[right[0]], function=[rows[0]["function"]], ground_truth=[None],
                  category=["multiple"]) == [None]
    gold = {c: rows[0][c] for c in ("function", "ground_truth", "category")}
    assert score_answers("bfcl_ast", [right[0], right[1]], gold) == [1.0, 0.0]


def first_accepted_call(ground_truth: dict) -> str:
    """One call that BFCL's possible answers accept: the first allowed value of each argument."""
    (name, arguments), = ground_truth.items()
    values = {key: allowed[0] for key, allowed in arguments.items() if allowed and allowed[0] != ""}
    return f"[{name}({', '.join(f'{key}={value!r}' for key, value in values.items())})]"


def test_scorer_is_a_registry_reward_spec(tmp_path):
    """A suite's scorer is the spec train and filter write; the old eval names, weights and maj@ on a
    reward that extracts no answer are refused at load, before any model or data."""
    task = """name: s
tasks:
  - name: t
    kind: rufus
    role: validation
    data: {{path: x.jsonl}}
    prompt: "{{q}}"
    gold_fields: [answer]
    scorer: {scorer}
    metric: {metric}
"""
    for scorer, metric, message in [
        ("{name: boxed}", "avg@k", "unknown reward 'boxed'.*use one of string_match"),
        ("string_match:nope", "avg@k", "unknown extractor 'nope'"),
        ("{name: string_match, weight: 2}", "avg@k", "a scorer has no weight"),
        ("ifeval", "maj@k", "maj@ needs an answer to vote on; reward ifeval extracts none"),
        ("{name: llm_judge, reference_column: target}", "avg@k", "reference_column 'target' must be one of gold_fields"),
    ]:
        path = tmp_path / "s.yaml"
        path.write_text(task.format(scorer=scorer, metric=metric))
        with pytest.raises(RufusError, match=message):
            load_suite(str(path))
    path.write_text(task.format(scorer="{name: llm_judge, model: m}", metric="avg@k"))
    judged = load_suite(str(path)).tasks[0]
    assert judged.scorer.spec == {"name": "llm_judge", "model": "m", "reference_column": "answer"}  # first gold field
    path.write_text(task.format(scorer="string_match:boxed", metric="maj@k"))
    assert load_suite(str(path)).tasks[0].scorer.model_dump() == {"name": "string_match", "extractor": "boxed"}


def test_gsm8k_gold_is_read_by_the_reward_and_votes_on_its_extractor(data_root):
    """The quick suite's GSM8K gold is the row's worked answer, unchanged: the reward reads it after `####`;
    maj@ votes on the reward's own extractor (last_number)."""
    task = {t.name: t for t in load_suite("quick").tasks}["gsm8k"]
    assert task.benchmark == "gsm8k"  # its data: the registry's GSM8K test (local copy under the data root)
    row = task_rows(task)[0]
    gold = json.loads(row["gold"])
    assert gold["answer"].endswith("#### 18")
    answers = ["She makes 18 dollars.", "It is 17", "<think>9 + 9</think>18", "so 17"]
    assert score_answers(task.scorer.spec, answers, gold) == [1.0, 0.0, 1.0, 0.0]
    votes = ["17", "18", "18", "17", "18"]
    assert rufus_maj([row["gold"]], [votes], scorer=task.scorer.spec, k=5, at=5)["maj@5"] == 1.0
    assert rufus_maj([row["gold"]], [votes], scorer=task.scorer.spec, k=5, at=1)["maj@1"] == 0.0


def test_majority_vote_scores_the_most_frequent_answer():
    gold = json.dumps({"answer": "12", "rufus_prompt": "q"})
    answers = ["\\boxed{12}", "\\boxed{7}", "\\boxed{7}", "\\boxed{12}", "\\boxed{7}"]
    scorer = {"name": "string_match", "extractor": "boxed", "answer_column": "answer"}
    assert rufus_maj([gold], [answers], scorer=scorer, k=5, at=5)["maj@5"] == 0.0
    assert rufus_maj([gold], [answers], scorer=scorer, k=5, at=1)["maj@1"] == 1.0


def test_the_shipped_vibe_prompts_load():
    from rufus_eval.vibe import load_prompts

    prompts = load_prompts(REPO / "catalogs" / "vibe_prompts.yaml")
    assert len(prompts) >= 3 and any(p.system for p in prompts) and any(p.system is None for p in prompts)


def test_vibe_answers_side_by_side(tmp_path, tiny_model):
    from rufus_eval.vibe import run_vibe

    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("- What is 12 * 3?\n- {system: You are a pirate., user: Say hello.}\n")
    answers = run_vibe(prompts, ["tiny-random", tiny_model], max_tokens=8, out=tmp_path / "vibe.md")
    assert [len(a) for a in answers.values()] == [2, 2]
    assert answers["tiny-random"] == answers[tiny_model]  # greedy: the same model answers the same
    markdown = (tmp_path / "vibe.md").read_text()
    assert "## conversation 2 (system: You are a pirate.)" in markdown and "### turn 1 (-): Say hello." in markdown
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {usr: hi}\n")
    with pytest.raises(RufusError, match="prompt 0"):
        run_vibe(bad, [tiny_model])


def test_livecodebench_from_a_local_jsonl_runs_stdin_stdout_cases(tmp_path, monkeypatch):
    """LiveCodeBench is Rufus-defined: a local JSONL of converted rows (what `data pull` writes) whose
    `test_cases` ([{input, output}]) reach the code scorer, one sandboxed stdin/stdout run per case."""
    cases = [{"input": "3\n", "output": "6\n", "testtype": "stdin"}, {"input": "10\n", "output": "55\n", "testtype": "stdin"}]
    folder = tmp_path / "livecodebench"
    folder.mkdir()
    hub_row = {"question_id": "lcb-sum", "question_content": "Read n and print 1 + 2 + ... + n.",
               "public_test_cases": json.dumps(cases[:1]), "private_test_cases": json.dumps(cases[1:]), "metadata": "{}"}
    row = convert_rows("livecodebench", [hub_row]).__next__()
    (folder / "test_v4_v5.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))
    task = {t.name: t for t in load_suite("smollm3").tasks}["livecodebench"]
    rows = task_rows(task)
    assert len(rows) == 1 and rows[0]["prompt"].startswith("### Question:\nRead n and print")
    gold = json.loads(rows[0]["gold"])
    right = "```python\nn = int(input())\nprint(n * (n + 1) // 2)\n```"
    off_by_one = "```python\nn = int(input())\nprint(n * (n - 1) // 2)\n```"
    crashes = "```python\nprint(undefined_name)\n```"
    assert score_answers(task.scorer.model_dump(), [right, off_by_one, crashes], gold) == [1.0, 0.0, 0.0]


def test_a_suite_that_says_samples_reads_as_repeats_with_a_warning_naming_it(tmp_path, capsys):
    """Suites written when k was `samples` (lm-eval's name for picking documents) still load: one
    warning naming the file and where; both names in one place are refused."""
    spec = yaml.safe_load((REPO / "catalogs" / "suites" / "quick.yaml").read_text())
    spec["samples"] = spec.pop("repeats")
    spec["tasks"][1]["samples"] = 2
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(spec, sort_keys=False))
    suite = load_suite(str(old))
    assert suite.repeats == 4 and [suite.k(t) for t in suite.tasks[:2]] == [4, 2]
    said = " ".join(capsys.readouterr().err.split())
    assert said.count("warning:") == 1
    assert f"warning: {old}: `samples` is now `repeats`" in said and "(top level, task math500)" in said
    spec["repeats"] = 4
    old.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(RufusError, match="`samples` is the old name of `repeats`: give only `repeats`"):
        load_suite(str(old))
