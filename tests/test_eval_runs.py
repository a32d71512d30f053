"""What a run folder says and how runs are compared: tasks whose data is not here are skipped (and
--strict refuses), output is atomic, the training step is read from the run folder, compare plots
what it is given, the results table goes to stdout, `--backend auto` picks by GPU and vLLM, and a
native lm-eval task scores the answer after the reasoning."""

from __future__ import annotations

import json
from pathlib import Path

import lm_eval
import pytest
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import load_suite
from rufus_data.generate import backend_config
from rufus_data.models import devices
from rufus_eval.cli import app
from rufus_eval.compare import load_runs, plot_metric_vs_step
from rufus_eval.native import write_native
from rufus_eval.plan import checkpoint_step
from rufus_eval.request import EvalRequest
from rufus_eval.results import SUMMARY_FIELDS, print_summary
from rufus_eval.runner import unclosed_fraction

ROWS = [{"key": 1, "prompt": "Say yes.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
        {"key": 2, "prompt": "Say no.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}]
MIXED = """name: mixed
repeats: 1
sampling: {temperature: 0.0, top_p: 1.0, max_tokens: 4}
tasks:
  - name: follow
    kind: rufus
    role: validation
    data: {path: rows.jsonl}
    prompt: "{prompt}"
    gold_fields: [instruction_id_list, kwargs]
    scorer: {name: ifeval}
  - name: livecodebench
    kind: rufus
    role: validation
    benchmark: livecodebench
    prompt: "{question_content}"
    gold_fields: [test_cases]
    scorer: {name: code_execution}
    metric: pass@1
"""


def write_suite(folder: Path, text: str = MIXED) -> Path:
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    suite = folder / "mixed.yaml"
    suite.write_text(text)
    return suite


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, data_root, tiny_model):
    """One real run (hf, the built-in tiny-random) of a suite whose second task's data is not here (offline)."""
    work = tmp_path_factory.mktemp("runs")
    suite = write_suite(work)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        res = CliRunner().invoke(app, ["suite", str(suite), "--ckpt", "tiny-random", "--out", str(work / "base")])
    return work, res


def test_a_task_whose_data_is_absent_is_skipped_with_its_fetch_command(mixed_run):
    work, res = mixed_run
    assert res.exit_code == 0, res.output
    record = json.loads((work / "base" / "results.json").read_text())
    follow, lcb = record["tasks"]["follow"], record["tasks"]["livecodebench"]
    assert follow["status"] == "ran" and follow["docs"] == 2 and 0.0 <= follow["value"] <= 1.0
    assert lcb["status"] == "skipped" and lcb["value"] is None and lcb["docs"] == 0
    assert "livecodebench/test_v4_v5.jsonl" in lcb["reason"]
    assert lcb["fetch"] == "rufus-eval data pull mixed --tasks livecodebench --to $RUFUS_DATA_ROOT"
    # the table (a result) on stdout, skipped as skipped; why and how to fetch on stderr
    assert "livecodebench" in res.stdout and "skipped" in res.stdout and "to get it" not in res.stdout
    assert f"to get it: {lcb['fetch']}" in res.stderr
    assert f"run folder: {work / 'base'}" in res.stderr and "backend: hf (auto: no GPU" in res.stderr
    assert record["step"] == 0 and record["step_from"] == "base model (no run.json)"
    found = CliRunner().invoke(app, ["results", "SELECT task, status, value FROM results ORDER BY task", "--runs",
                                     str(work), "--format", "json"])
    assert found.exit_code == 0, found.output
    rows = [(r["task"], r["status"], r["value"]) for r in json.loads(found.stdout)]
    assert rows == [("follow", "ran", follow["value"]), ("livecodebench", "skipped", None)]
    # the task configs name their data in the final folder, not the temporary one the run wrote
    config = (work / "base" / "tasks" / "follow.yaml").read_text()
    assert str((work / "base" / "tasks" / "follow.jsonl").resolve()) in config
    assert not [p for p in work.iterdir() if p.name.startswith(".base")]


def test_the_suite_summary_as_json_is_the_run_s_rows(mixed_run, tmp_path, monkeypatch):
    """`--format json`: stdout is one JSON document (progress, notes, the run folder on stderr), the
    summary's rows with every value whole, as results.json holds them."""
    work, _ = mixed_run
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(app, ["suite", str(work / "mixed.yaml"), "--ckpt", "tiny-random", "--out",
                                   str(tmp_path / "run"), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {row["task"]: row for row in json.loads(res.stdout)}
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(rows) == set(record["tasks"]) == {"follow", "livecodebench"}
    assert rows["follow"]["value"] == record["tasks"]["follow"]["value"] and rows["follow"]["status"] == "ran"
    assert rows["livecodebench"]["value"] is None and rows["livecodebench"]["fetch"] == record["tasks"]["livecodebench"]["fetch"]
    assert "run folder:" in res.stderr
    refused = CliRunner().invoke(app, ["suite", str(work / "mixed.yaml"), "--ckpt", "tiny-random", "--format", "xml"])
    assert refused.exit_code == 2 and "'xml' is not one of" in refused.output


def test_strict_refuses_before_the_model_loads(mixed_run, monkeypatch):
    work, _ = mixed_run
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(app, ["suite", str(work / "mixed.yaml"), "--ckpt", "smollm2-135m", "--strict",
                                   "--out", str(work / "strict")])
    assert res.exit_code == 2
    assert "--strict: livecodebench:" in res.output and "rufus-eval data pull mixed --tasks livecodebench" in res.output
    assert not (work / "strict").exists() and not list(work.glob(".eval-work-*"))


def test_compare_shows_skipped_as_skipped_and_plots_base_and_trained(mixed_run, tmp_path):
    work, _ = mixed_run
    base = json.loads((work / "base" / "results.json").read_text())
    trained = {**base, "run": "mixed-trained-run-with-a-long-name-" + "x" * 60, "checkpoint": "runs/reasoning_rl",
               "step": 2, "tasks": {**base["tasks"], "follow": {
                   **base["tasks"]["follow"], "value": 0.75,
                   "data_check": {"status": "not_checked", "rows_removed": 0, "why": "mixed at the start"}}}}
    (tmp_path / "trained" / "lm_eval").mkdir(parents=True)
    (tmp_path / "trained" / "results.json").write_text(json.dumps(trained))
    # its own samples: the same documents, scored 1.0 and 0.5 (mean 0.75)
    lines = [json.loads(line) for line in (work / "base" / "lm_eval" / "samples_follow.jsonl").read_text().splitlines()]
    base_scores = [line["avg@1"] for line in lines]
    (tmp_path / "trained" / "lm_eval" / "samples_follow.jsonl").write_text(
        "".join(json.dumps({**line, "avg@1": score}) + "\n" for line, score in zip(lines, [1.0, 0.5])))
    res = CliRunner().invoke(app, ["compare", str(work / "base"), str(tmp_path / "trained"), "--png", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    assert trained["run"] in res.stdout  # not cut at 80 columns when stdout is no terminal
    assert res.stdout.count("skipped") == 2 and "0.7500" in res.stdout
    delta = (1.0 - base_scores[0] + 0.5 - base_scores[1]) / 2
    assert f"{delta:+.4f} ±" in res.stdout and "pass@1=" in res.stdout
    assert res.stdout.count("NOT CHECKED") == 1  # under the trained run's score only
    assert f"wrote {tmp_path / 'c.png'}" in res.stderr and "wrote" not in res.stdout
    res = CliRunner().invoke(app, ["compare", str(work / "base"), str(tmp_path / "trained"), "--format", "json",
                                   "--png", str(tmp_path / "c.png")])
    rows = {r["task"]: r for r in json.loads(res.stdout)}
    assert rows["follow"]["delta"] == pytest.approx(delta) and rows["follow"]["b_value"] == pytest.approx(0.75)
    assert (rows["follow"]["a_not_checked"], rows["follow"]["b_not_checked"]) == (False, True)
    assert rows["follow"]["paired_docs"] == 2 and set(rows["follow"]["a_pass_at_k"]) == {"pass@1"}
    assert rows["livecodebench"]["verdict"].startswith("no comparison: skipped in")
    csv = CliRunner().invoke(app, ["compare", str(work / "base"), str(tmp_path / "trained"), "--format", "csv",
                                   "--png", str(tmp_path / "c.png")]).stdout.splitlines()
    assert csv[0].startswith("task,metric,docs,paired_docs,a_run,a_value,a_se,a_not_checked,b_run") and csv[0].endswith("b_pass@1")
    refused = CliRunner().invoke(app, ["compare", str(work / "base"), "--format", "xml"])
    assert refused.exit_code == 2 and "'xml' is not one of" in refused.output  # the shared --format, checked
    # one document fewer in the trained run: no pairs to form, and it says how many are shared
    (tmp_path / "trained" / "lm_eval" / "samples_follow.jsonl").write_text(json.dumps({**lines[0], "avg@1": 0.75}) + "\n")
    res = CliRunner().invoke(app, ["compare", str(work / "base"), str(tmp_path / "trained")])
    assert res.exit_code == 2 and "not scored on the same documents" in res.output
    assert f"follow: {base['run']} has 2 documents, {trained['run']} has 1, 1 shared" in res.output
    plot = plot_metric_vs_step(load_runs([work / "base", tmp_path / "trained"]), tmp_path / "c2.png")
    assert plot.by_step and plot.drawn == ["follow"] and plot.png.stat().st_size > 1000
    assert plot.notes == ["livecodebench has no number in any run (skipped, not run, or none scored): not plotted"]
    # two runs at the same step (two base models): one point per run, and it says so
    same = {**trained, "step": 0}
    (tmp_path / "trained" / "results.json").write_text(json.dumps(same))
    plot = plot_metric_vs_step(load_runs([work / "base", tmp_path / "trained"]), tmp_path / "c3.png")
    assert not plot.by_step and plot.drawn == ["follow"] and "do not each have their own training step" in plot.notes[0]


def test_the_step_comes_from_the_run_folder(tmp_path):
    run = tmp_path / "runs" / "reasoning_rl"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"stage": "reasoning_rl", "global_step": 2}))
    assert checkpoint_step(str(run)) == (2, "run.json global_step")
    assert checkpoint_step(str(run / "checkpoint-7")) == (7, "checkpoint folder name")
    assert checkpoint_step("smollm2-135m") == (0, "base model (no run.json)")
    (run / "run.json").write_text("{")
    with pytest.raises(RufusError, match="run.json is not valid JSON.*--step"):
        checkpoint_step(str(run))


def test_failed_runs_leave_no_folder(tmp_path, monkeypatch, data_root):
    """A model that exists nowhere is refused before anything is written; a failure after the task files
    were written (an unreachable judge) removes them with the temporary folder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runner = CliRunner()
    res = runner.invoke(app, ["suite", "quick", "--ckpt", "MISSING", "--out", str(tmp_path / "DIR")])
    assert res.exit_code == 2 and "model 'MISSING' cannot be loaded: HF_HUB_OFFLINE" in res.output
    judged = write_suite(tmp_path, MIXED.replace("scorer: {name: ifeval}",
                                                 "scorer: {name: llm_judge, model: m, base_url: 'http://127.0.0.1:9/v1'}")
                         .replace("gold_fields: [instruction_id_list, kwargs]", "gold_fields: [prompt]"))
    res = runner.invoke(app, ["suite", str(judged), "--ckpt", "smollm2-135m", "--out", str(tmp_path / "judged")])
    assert res.exit_code == 2 and "the judge at http://127.0.0.1:9/v1 is not reachable" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.yaml", "rows.jsonl"]


def test_auto_backend_is_vllm_only_with_a_gpu_and_vllm(monkeypatch):
    """`auto` is the one policy of ModelAccess (rufus_data/generate/backend_config.py), decided where the run is."""
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setattr(backend_config, "vllm_available", lambda: True)
    assert backend_config.choose_backend() == ("vllm", "auto: 2 GPU(s) and vLLM found")
    monkeypatch.setattr(backend_config, "vllm_available", lambda: False)
    assert backend_config.choose_backend()[0] == "hf" and "vLLM is not installed" in backend_config.choose_backend()[1]
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    monkeypatch.setattr(backend_config, "vllm_available", lambda: True)
    assert backend_config.choose_backend() == ("hf", "auto: no GPU, so transformers in-process")
    served = EvalRequest(suite="quick", checkpoint="m", base_urls=["http://127.0.0.1:9/v1"])
    assert (served.resolved(say=False).backend, EvalRequest(suite="quick", checkpoint="m").resolved(say=False).backend) == (
        "server", "hf")


class ScriptedLM(LM):
    """Answers each question with the text given for it (what a reasoning model would write)."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers = answers

    def generate_until(self, requests, disable_tqdm: bool = False):
        return [self.answers[r.args[0].strip()] for r in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


def test_a_native_task_scores_the_answer_after_the_reasoning(tmp_path, data_root):
    """A native lm-eval task (its own regex filter, first "(X)" of the response) run through the config
    Rufus writes: the reasoning is stripped before the regex, and an unclosed <think> leaves no answer."""
    answers = {
        "q1": "<think>Is it (B)? No.</think>The answer is (A)",  # raw: (B) first; answer: (A)
        "q2": "<think>(C) looks right, but let me keep checking",  # unclosed: raw finds (C); no answer
        "q3": "<think>(D)?</think>So (B).",  # raw: (D); answer: (B)
    }
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in zip(answers, "ACB")))
    native = tmp_path / "native" / "mini_choice.yaml"
    native.parent.mkdir()
    native.write_text(f"""task: mini_choice
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "({{{{answer}}}})"
generation_kwargs: {{until: [], max_gen_toks: 8}}
filter_list:
  - name: first-letter
    filter:
      - {{function: regex, regex_pattern: "(\\\\([A-D]\\\\))", group_select: 0}}
      - {{function: take_first}}
metric_list:
  - {{metric: exact_match, aggregation: mean, higher_is_better: true}}
""")
    suite_file = tmp_path / "s.yaml"
    suite_file.write_text(f"""name: nat
tasks:
  - name: mini
    kind: lm_eval
    role: validation
    lm_eval_task: {native}
    metric_key: "exact_match,first-letter"
""")
    suite = load_suite(str(suite_file))
    folder = tmp_path / "tasks"
    name = write_native(suite, suite.tasks[0], folder)
    assert name == "rufus_nat_mini_choice"
    manager = TaskManager(include_path=str(folder), include_defaults=False)

    def run(task_name, mgr):
        out = lm_eval.simple_evaluate(model=ScriptedLM(answers), tasks=[task_name], task_manager=mgr, log_samples=True)
        return out["results"][task_name]["exact_match,first-letter"], out["samples"][task_name]

    stripped, samples = run(name, manager)
    raw, _ = run("mini_choice", TaskManager(include_path=str(native.parent), include_defaults=False))
    assert stripped == pytest.approx(2 / 3) and raw == pytest.approx(1 / 3)
    by_doc = {s["doc"]["question"]: s["filtered_resps"] for s in samples}
    assert by_doc == {"q1": ["(A)"], "q2": ["[invalid]"], "q3": ["(B)"]}
    assert unclosed_fraction(samples, "</think>") == pytest.approx(1 / 3)


def test_the_summary_prints_reasons_and_commands_verbatim(capsys):
    """Skip reasons and commands hold brackets (`lm_eval[ruler]`) and long paths: printed as they are."""
    record = {"suite": "s", "checkpoint": "m", "step": 0, "tasks": {"ruler": {
        "status": "skipped", "metric": "4096", "value": None, "stderr": None, "k": 1, "docs": 0,
        "reason": "task ruler: lm-eval's RULER needs the packages wonderwords", "fetch": "pip install 'lm_eval[ruler]'"}}}
    print_summary(record)
    out, err = capsys.readouterr()
    assert "skipped" in out and "to get it" not in out
    assert "to get it: pip install 'lm_eval[ruler]'" in err
    print_summary(record, "csv")
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == ",".join(SUMMARY_FIELDS) and "pip install 'lm_eval[ruler]'" in out.splitlines()[1]
    assert "to get it: pip install 'lm_eval[ruler]'" in err  # why, for people, stays on stderr
