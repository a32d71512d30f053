"""rufus-eval suites end to end: the quick suite on the hf backend (tiny-random: the runner's
mechanics) and against the real vLLM CPU server, avg@k recomputed from lm-eval's own samples file
(the built-in model, which follows the instructions some of the time), k distinct samples,
reasoning stripping, the results store and compare."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ifeval_suites import ifeval_task, write_rows, write_suite

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import load_suite
from rufus_data.rewards.extract import strip_reasoning
from rufus_data.rewards.ifeval import IFEvalReward
from rufus_eval.compare import compare_runs, comparison_rows, load_runs
from rufus_eval.metrics import Answer, answer_of, rufus_avg
from rufus_eval.request import EvalRequest
from rufus_eval.results import query_runs
from rufus_eval.runner import run_suite

QUICK_TASKS = {"gsm8k", "math500", "ifeval", "humaneval"}
# Instructions the tiny model follows about half the time in 12 tokens: the k samples of one
# document then score differently, so "mean of k" and "first sample" give different numbers.
VARY_ROWS = [
    {"key": 1, "prompt": "Write one short sentence about the sea.", "instruction_id_list": ["punctuation:no_comma"],
     "kwargs": [{}]},
    {"key": 2, "prompt": "List three fruits.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": 3, "prompt": "Describe a cat.", "instruction_id_list": ["length_constraints:number_words"],
     "kwargs": [{"relation": "less than", "num_words": 8}]},
]


def vary_suite(tmp: Path) -> Path:
    data = write_rows(tmp / "vary.jsonl", VARY_ROWS)
    return write_suite(tmp / "vary.yaml", [ifeval_task("follow", data, metric="avg@k"),
                                            ifeval_task("held_out", data, role="test")], repeats=6, max_tokens=12)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("eval")


@pytest.fixture(scope="module")
def quick_hf(work, data_root, tiny_model):
    req = EvalRequest(suite="quick", checkpoint=tiny_model, backend="hf", limit=1,
                      repeats=2, max_tokens=16, out=work / "quick-hf", step=10, run_name="quick-hf")
    return run_suite(req)


@pytest.fixture(scope="module")
def vary_hf(work, data_root, builtin_model):
    req = EvalRequest(suite=str(vary_suite(work)), checkpoint=builtin_model, backend="hf",
                      out=work / "vary-hf", step=20, run_name="vary-hf")
    return run_suite(req)


def test_quick_suite_hf_end_to_end(quick_hf, work):
    assert set(quick_hf["tasks"]) == QUICK_TASKS
    for name, task in quick_hf["tasks"].items():
        assert task["docs"] == 1 and task["k"] == 2 and 0.0 <= task["value"] <= 1.0, name
        assert Path(task["samples_file"]).exists()
        assert (work / "quick-hf" / "lm_eval" / f"results_{name}.json").exists()
        config = (work / "quick-hf" / "tasks" / f"{name}.yaml").read_text()
        assert "dataset_path: json" in config and "repeats: 2" in config
    assert quick_hf["tasks"]["humaneval"]["metric"] == "pass@1"
    assert json.loads((work / "quick-hf" / "results.json").read_text())["step"] == 10


def test_avg_at_k_is_the_mean_of_every_sample(vary_hf, work):
    """Rescore lm-eval's samples file with the IFEval reward directly: the reported avg@6 of each
    document is the mean of its 6 sample scores, not the first sample's score."""
    reward = IFEvalReward(mode="strict", level="prompt")
    samples = [json.loads(line) for line in Path(vary_hf["tasks"]["follow"]["samples_file"]).read_text().splitlines()]
    assert len(samples) == len(VARY_ROWS)
    means, first_differs = [], False
    for sample in samples:
        raw = sample["resps"][0]
        assert len(raw) == 6
        assert len(set(raw)) > 1, f"the 6 samples at temperature 1 are identical: {raw}"
        doc = sample["doc"]
        gold = json.loads(doc["gold"])
        scores = reward(prompts=[doc["prompt"]] * 6, completions=raw,
                        instruction_id_list=[gold["instruction_id_list"]] * 6, kwargs=[json.dumps(gold["kwargs"])] * 6)
        mean = sum(scores) / 6
        assert sample["avg@6"] == pytest.approx(mean)
        first_differs |= scores[0] != mean
        means.append(mean)
    assert first_differs, "no document where the first sample's score differs from the mean: the test proves nothing"
    assert vary_hf["tasks"]["follow"]["value"] == pytest.approx(sum(means) / len(means))
    assert "held_out" not in vary_hf["tasks"]  # role: test runs only with --final


def test_results_store_and_compare(quick_hf, vary_hf, work):
    rows = query_runs([work], runs=["quick-hf", "vary-hf"])
    assert {(r["run"], r["task"]) for r in rows} == {("quick-hf", t) for t in QUICK_TASKS} | {("vary-hf", "follow")}
    assert [r["step"] for r in rows] == [10] * len(QUICK_TASKS) + [20]
    _, across = comparison_rows(load_runs([work / "vary-hf", work / "quick-hf"]))
    assert [r["step"] for r in across] == [10, 20]
    assert across[1]["follow"][1] == pytest.approx(vary_hf["tasks"]["follow"]["value"])
    # two runs of different suites: nothing to pair, and each task says why
    paired, png = compare_runs([work / "vary-hf", work / "quick-hf"], png=work / "cmp.png")
    assert {r["task"]: r["verdict"] for r in paired}["follow"] == "no comparison: not in quick-hf"
    assert png.stat().st_size > 1000


def test_a_run_paired_with_itself_and_its_pass_at_k_from_rescored_samples(vary_hf, work):
    """A run against itself: every difference is 0, so no difference is shown. pass@k re-scores
    each of the 6 samples with the task's scorer: with a pass/fail scorer, pass@1 is the run's
    own avg@6, and pass@k grows with k."""
    paired, _ = compare_runs([work / "vary-hf", work / "vary-hf"], png=work / "self.png")
    (row,) = paired
    assert (row["delta"], row["delta_se"], row["paired_docs"]) == (0.0, 0.0, len(VARY_ROWS))
    assert row["verdict"].startswith("no difference shown")
    passes = row["a_pass_at_k"]
    assert list(passes) == ["pass@1", "pass@2", "pass@4", "pass@6"] and passes == row["b_pass_at_k"]
    assert passes["pass@1"] == pytest.approx(vary_hf["tasks"]["follow"]["value"])
    assert list(passes.values()) == sorted(passes.values()) and passes["pass@6"] > passes["pass@1"]


def test_reasoning_is_stripped_and_unclosed_counted():
    assert answer_of("<think>2+2 is 5?</think>The answer is 4.") == "The answer is 4."
    unclosed = answer_of("<think>still thinking about it")
    assert unclosed == "" and unclosed.closed is False
    assert answer_of("plan<|end_think|> final", think_end_token="<|end_think|>") == "final"
    assert strip_reasoning("<think>a</think>b") == ("b", True)  # the one shared rule
    # a document with one answered and one unclosed sample: the unclosed one scores 0 and is counted,
    # even though an empty text would "follow" a no-comma instruction
    gold = json.dumps({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "rufus_prompt": "x"})
    answers = [Answer("no commas here"), answer_of("<think>never closed, ever")]
    result = rufus_avg([gold], [answers], scorer={"name": "ifeval", "mode": "strict"}, k=2)
    assert result == {"avg@2": 0.5, "unclosed_think": 0.5, "unscored": 0.0}


def test_suite_catalogs_load_and_bad_input(tmp_path, data_root):
    quick = load_suite("quick")
    assert {t.name for t in quick.tasks} == QUICK_TASKS
    smol = load_suite("smollm3")
    assert smol.sampling.temperature == 0.6 and smol.sampling.top_p == 0.95
    assert {t.role for t in smol.tasks} == {"validation", "test"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntasks:\n  - name: t\n    kind: rufus\n    role: validation\n    promt: x\n")
    with pytest.raises(RufusError, match="unknown key 'tasks.0.promt'; did you mean 'prompt'"):
        load_suite(str(bad))


@pytest.mark.vllm
def test_quick_suite_against_real_vllm_server(vllm_server, work, data_root, builtin_model):
    """The same suite through lm-eval's OpenAI-compatible backend against the shared vLLM CPU
    server; per-sample seeds make the k samples differ (a fixed seed would return k copies)."""
    backend = {"backend": "server", "base_url": vllm_server.base_url, "tokenizer": builtin_model}
    record = run_suite(EvalRequest(suite="quick", checkpoint=vllm_server.model, **backend, limit=1, repeats=2,
                                   max_tokens=16, out=work / "quick-vllm", run_name="quick-vllm"))
    assert set(record["tasks"]) == QUICK_TASKS and record["backend"] == "server"
    assert record["server_version"]
    vary = run_suite(EvalRequest(suite=str(vary_suite(work)), checkpoint=vllm_server.model,
                                 **backend, out=work / "vary-vllm", run_name="vary-vllm"))
    for line in Path(vary["tasks"]["follow"]["samples_file"]).read_text().splitlines():
        raw = json.loads(line)["resps"][0]
        assert len(raw) == 6 and len(set(raw)) > 1, raw


def test_missing_data_root_is_an_error(monkeypatch, tmp_path):
    monkeypatch.delenv("RUFUS_DATA_ROOT", raising=False)
    with pytest.raises(RufusError, match="RUFUS_DATA_ROOT is not set"):
        run_suite(EvalRequest(suite="quick", checkpoint="smollm2-135m", out=tmp_path / "x"))
    assert os.environ.get("RUFUS_DATA_ROOT") is None


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_backend_launches_and_stops_its_own_server(work, data_root, builtin_model):
    """`--backend vllm`: Rufus starts vLLM (CPU build here) with the launcher and stops its group."""
    from rufus_data.generate.launcher import group_members
    from rufus_data.generate.vllm_command import CPU_VENV

    if not (CPU_VENV / ".installed").exists():
        pytest.skip("vLLM CPU build not installed: run `make vllm-venv`")
    # the server Rufus starts carries the run's name (quick-launch)
    record = run_suite(EvalRequest(suite="quick", checkpoint=builtin_model, backend="vllm", max_model_len=2048, limit=1,
                                    repeats=2, max_tokens=16, out=work / "quick-launch", run_name="quick-launch"))
    assert record["backend"] == "vllm" and set(record["tasks"]) == QUICK_TASKS
    assert group_members(record["server_pgid"]) == []
