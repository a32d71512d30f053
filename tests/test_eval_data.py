"""Benchmark data for the suites: the conversions Rufus applies to hub rows and `rufus-eval data pull`,
on small local folders shaped like the hub repos (nothing downloads): LiveCodeBench's encoded test
cases, GPQA's gated CSV config, MixEval's free-form rows, BFCL's wheel, RULER's haystacks."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import pickle
import threading
import zlib
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import read_jsonl
from rufus_data.benchmarks import load_benchmarks
from rufus_data.benchmarks import registry as benchmark_registry
from rufus_data.benchmarks.convert import LCB_PRELUDE, convert_rows, decode_test_cases
from rufus_data.benchmarks.pull import PULL_MANIFEST, pull_suite
from rufus_data.benchmarks.suite import load_suite
from rufus_data.folders.shards import file_sha256
from rufus_eval.cli import app
from rufus_eval.metrics import score_answers
from rufus_eval.task_data import TaskDataMissing, check_native_ready
from rufus_eval.tasks import task_rows


def lcb_private(cases: list[dict]) -> str:
    """The lite release's private tests: base64 of zlib of a pickle of the JSON text."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


STDIN_ROW = {
    "question_title": "Triangle sum", "question_content": "Read n and print 1 + 2 + ... + n.", "platform": "atcoder",
    "question_id": "abc999_a", "contest_id": "abc999", "contest_date": "2024-09-01T00:00:00", "starter_code": "",
    "difficulty": "easy", "metadata": "{}",
    "public_test_cases": json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}]),
    "private_test_cases": lcb_private([{"input": "10\n", "output": "55\n", "testtype": "stdin"},
                                       {"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
}
FUNCTIONAL_ROW = {
    "question_title": "Sum of a list", "question_content": "Return the sum of nums.", "platform": "leetcode",
    "question_id": "9001", "contest_id": "weekly-999", "contest_date": "2024-10-01T00:00:00",
    "starter_code": "class Solution:\n    def listSum(self, nums: List[int], bonus: int) -> int:\n        ",
    "difficulty": "easy", "metadata": json.dumps({"func_name": "listSum"}),
    "public_test_cases": json.dumps([{"input": "[1, 2, 3]\n0", "output": "6", "testtype": "functional"}]),
    "private_test_cases": lcb_private([{"input": "[]\n5", "output": "5", "testtype": "functional"}]),
}
GPQA_CSV = (
    '"Record ID","Question","Correct Answer","Incorrect Answer 1","Incorrect Answer 2","Incorrect Answer 3"\n'
    '"recA","Which gas makes up most of the air?","Nitrogen","Oxygen","Argon","Carbon dioxide"\n'
    '"recB","What is 2 + 2?","4","3","5","22"\n'
)
MIXEVAL_ROWS = [
    {"id": "7", "problem_type": "free-form", "context": None, "prompt": "when was the last time ku won the championship",
     "target": ["2022"], "benchmark_name": "NaturalQuestions"},
    {"id": "8", "problem_type": "free-form", "context": "Paris is the capital of France.", "prompt": "What is the capital?",
     "target": ["Paris", "paris, France"], "benchmark_name": "MATH"},
]


def hub_folder(root: Path, name: str, files: dict[str, str], configs: list[dict] | None = None) -> Path:
    """A folder laid out like a hub dataset repo (data files, and a README whose front matter names the configs)."""
    folder = root / name
    folder.mkdir(parents=True)
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    if configs:
        (folder / "README.md").write_text("---\n" + yaml.safe_dump({"configs": configs}) + "---\n")
    return folder


@pytest.fixture
def hub_registry(tmp_path, monkeypatch):
    """The real registry with livecodebench, gpqa_diamond and mixeval_hard pointed at local hub-shaped folders."""
    hubs = tmp_path / "hub"
    lcb = hub_folder(hubs, "code_generation_lite", {
        "test4.jsonl": json.dumps(STDIN_ROW) + "\n", "test5.jsonl": json.dumps(FUNCTIONAL_ROW) + "\n",
        "test.jsonl": json.dumps({**STDIN_ROW, "question_id": "old_v1"}) + "\n",  # outside the v4_v5 window
        "code_generation_lite.py": "# the repo's loader script, which `datasets` refuses to run\n"})
    gpqa = hub_folder(hubs, "gpqa", {"gpqa_diamond.csv": GPQA_CSV},
                      [{"config_name": "gpqa_diamond", "data_files": [{"split": "train", "path": "gpqa_diamond.csv"}]}])
    mixeval = hub_folder(hubs, "MixEval", {"hard/free-form.jsonl": "".join(json.dumps(r) + "\n" for r in MIXEVAL_ROWS)},
                         [{"config_name": "MixEval_Hard", "data_files": [{"split": "free_form", "path": "hard/free-form.jsonl"}]}])
    raw = yaml.safe_load(benchmark_registry.default_registry().read_text())
    raw["benchmarks"]["livecodebench"]["hub"]["id"] = str(lcb)
    raw["benchmarks"]["gpqa_diamond"]["hub"]["id"] = str(gpqa)
    raw["benchmarks"]["mixeval_hard"]["hub"]["id"] = str(mixeval)
    registry = tmp_path / "benchmarks.yaml"
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setattr(benchmark_registry, "default_registry", lambda: registry)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return registry


def test_livecodebench_test_cases_decode_like_its_own_loader():
    cases = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    assert decode_test_cases(json.dumps(cases), "row") == cases
    assert decode_test_cases(lcb_private(cases), "row") == cases
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()  # a pickle that builds an object
    with pytest.raises(RufusError, match="neither JSON nor base64\\+zlib\\+pickle.*refusing to load"):
        decode_test_cases(evil, "row 3")
    stdin, functional = convert_rows("livecodebench", [STDIN_ROW, FUNCTIONAL_ROW])
    assert [c["output"] for c in json.loads(stdin["test_cases"])] == ["6\n", "55\n", "1\n"]  # public, then private
    assert stdin["test"] is None and stdin["code_prelude"] == LCB_PRELUDE and "stdin" in stdin["format_instructions"]
    assert "private_test_cases" not in stdin and stdin["question_content"] == STDIN_ROW["question_content"]
    assert functional["entry_point"] == "Solution" and functional["test_cases"] is None
    assert FUNCTIONAL_ROW["starter_code"] in functional["format_instructions"]
    assert list(convert_rows("livecodebench", [stdin])) == [stdin]  # a converted copy passes through


def test_pull_converts_hub_shaped_data_and_the_suite_reads_it_offline(hub_registry, tmp_path, monkeypatch, data_root):
    pulled = tmp_path / "pulled"
    manifest = pull_suite("smollm3", pulled, ["livecodebench", "gpqa_diamond", "mixeval_hard"])
    # the v4_v5 window: test4 + test5, never release_v1's test.jsonl
    lcb_file = pulled / "livecodebench" / "test_v4_v5.jsonl"
    assert [r["question_id"] for r in read_jsonl(lcb_file)] == ["abc999_a", "9001"]
    for name, rel, rows in (("livecodebench", "livecodebench/test_v4_v5.jsonl", 2),
                            ("gpqa_diamond", "gpqa/gpqa_diamond.jsonl", 2), ("mixeval_hard", "mixeval/mixeval_hard_free_form.jsonl", 2)):
        (entry,) = manifest["benchmarks"][name]["files"]
        assert entry["file"] == rel and entry["rows"] == rows and entry["sha256"] == file_sha256(pulled / rel)
        assert entry["source"]["origin"] == "hub" and entry["source"]["hub"].endswith(("code_generation_lite", "gpqa", "MixEval"))
        assert entry["source"]["converted"] == {"livecodebench": "livecodebench", "gpqa_diamond": "gpqa",
                                                "mixeval_hard": "mixeval"}[name]
    assert json.loads((pulled / PULL_MANIFEST).read_text()) == manifest
    assert not list(pulled.rglob(".*tmp*"))  # every file written under a temporary name and renamed

    # the pulled folder is a data root: the suite's tasks read the converted rows from it
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(pulled))
    tasks = {t.name: t for t in load_suite("smollm3").tasks}
    stdin, functional = task_rows(tasks["livecodebench"], "smollm3")
    assert stdin["prompt"].startswith("### Question:\nRead n and print") and "```python\nclass Solution:" in functional["prompt"]
    scorer = tasks["livecodebench"].scorer.spec
    right = "```python\nn = int(input())\nprint(n * (n + 1) // 2)\n```"
    wrong = "```python\nn = int(input())\nprint(n * n)\n```"
    assert score_answers(scorer, [right, wrong], json.loads(stdin["gold"])) == [1.0, 0.0]
    # a LeetCode-style answer that uses `List` without importing it passes: LiveCodeBench's import header goes first
    method = "```python\nclass Solution:\n    def listSum(self, nums: List[int], bonus: int) -> int:\n        return {}\n```"
    assert score_answers(scorer, [method.format("sum(nums) + bonus"), method.format("sum(nums)")],
                         json.loads(functional["gold"])) == [1.0, 0.0]

    gpqa = task_rows(tasks["gpqa_diamond"], "smollm3")
    first = json.loads(gpqa[0]["gold"])["answer"]
    assert f"({first}) Nitrogen" in gpqa[0]["prompt"] and "Which gas" in gpqa[0]["prompt"]
    again = list(convert_rows("gpqa", [dict(zip(["Record ID", "Question", "Correct Answer", "Incorrect Answer 1",
                                                 "Incorrect Answer 2", "Incorrect Answer 3"],
                                                ["recA", "Which gas makes up most of the air?", "Nitrogen", "Oxygen",
                                                 "Argon", "Carbon dioxide"]))]))
    assert again[0]["answer"] == first  # the shuffle is seeded by the Record ID: the same order everywhere
    assert score_answers(tasks["gpqa_diamond"].scorer.spec,
                         [f"<think>maybe (Z)</think>The answer is ({first})", "The answer is (Q)"],
                         json.loads(gpqa[0]["gold"])) == [1.0, 0.0]

    mix = task_rows(tasks["mixeval_hard"], "smollm3")
    assert mix[0]["prompt"] == "Question: when was the last time ku won the championship\nAnswer the question shortly."
    assert mix[1]["prompt"].startswith("Question: Paris is the capital of France.\nWhat is the capital?\nAnswer the question. ")
    assert json.loads(mix[1]["gold"])["reference"] == "<answer 1> Paris <answer 2> paris, France"


def test_eval_and_decontam_read_the_same_rows(hub_registry, data_root):
    """Decontam checks the rows eval scores: for every task whose data is here (hub rows converted,
    BFCL's from its wheel, local copies) decontam's items carry the ids of eval's samples, and each
    item's problem text is in the prompt eval sends."""
    checked = set()
    for suite_name in ("quick", "smollm3"):
        loaded = load_benchmarks([suite_name], skip_missing=True)
        items: dict[str, dict] = defaultdict(dict)
        for item in loaded.items:
            items[item.benchmark][item.item_id] = item
        for task in load_suite(suite_name).tasks:
            if task.kind != "rufus" or task.benchmark in loaded.missing:
                continue
            rows = task_rows(task, suite_name)
            ids = {row["rufus_id"] for row in rows}
            assert ids <= set(items[task.benchmark]), task.name
            assert task.skip_rows or ids == set(items[task.benchmark]), task.name  # skip_rows: GSM-Plus
            for row in rows:
                problems = items[task.benchmark][row["rufus_id"]].problems
                assert problems and all(text in row["prompt"] for text in problems), (task.name, row["rufus_id"])
            checked.add(task.name)
    assert checked == {"gsm8k", "math500", "ifeval", "humaneval", "aime25", "livecodebench", "gpqa_diamond",
                       "mixeval_hard", "bfcl_simple_python", "bfcl_multiple", "gsm_plus"}  # global_mmlu: hub only


def test_pull_cli_reports_what_it_could_not_fetch(hub_registry, tmp_path, data_root):
    """A set that cannot be fetched (offline, no copy) fails the command after the others are written."""
    res = CliRunner().invoke(app, ["data", "pull", "smollm3", "--task", "ifeval", "--task", "global_mmlu",
                                   "--to", str(tmp_path / "p")])
    assert res.exit_code == 2, res.output
    assert "pulled 1 of 2 benchmarks" in res.output and "global_mmlu" in res.output
    assert (tmp_path / "p" / "ifeval" / "input_data.jsonl").exists()
    assert set(json.loads((tmp_path / "p" / PULL_MANIFEST).read_text())["benchmarks"]) == {"ifeval"}


def test_pull_copies_the_bfcl_wheel_and_fetches_ruler_haystacks(tmp_path, monkeypatch, data_root):
    """BFCL's wheel lands in DIR/wheels (where the BFCL reward looks first); RULER's haystacks come from
    a hub dataset and from URLs (here a local HTTP server) into their registry paths."""
    essays = hub_folder(tmp_path / "hub", "paul_graham_essays", {"train.jsonl": '{"text": "How to do great work."}\n'})
    files = tmp_path / "web"
    files.mkdir()
    (files / "squad.json").write_text(json.dumps({"version": "v2.0", "data": []}))
    (files / "hotpot.json").write_text(json.dumps([]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(files))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        raw = yaml.safe_load(benchmark_registry.default_registry().read_text())
        hay = raw["benchmarks"]["ruler"]["haystacks"]
        hay["essays"]["hub"] = {"id": str(essays), "split": "train"}
        hay["squad"]["url"], hay["hotpotqa"]["url"] = f"{base}/squad.json", f"{base}/hotpot.json"
        registry = tmp_path / "benchmarks.yaml"
        registry.write_text(yaml.safe_dump(raw, sort_keys=False))
        monkeypatch.setattr(benchmark_registry, "default_registry", lambda: registry)
        manifest = pull_suite("smollm3", tmp_path / "p", ["bfcl_simple_python", "bfcl_multiple", "ruler"])
    finally:
        server.shutdown()
    (wheel,) = manifest["benchmarks"]["bfcl_simple_python"]["files"]
    assert wheel["file"].startswith("wheels/bfcl_eval-2026.3.23") and (tmp_path / "p" / wheel["file"]).is_file()
    got = {e["file"]: e for e in manifest["benchmarks"]["ruler"]["files"]}
    assert set(got) == {"ruler/paul_graham_essays.jsonl", "ruler/squad_dev_v2.0.json", "ruler/hotpot_dev_distractor_v1.json"}
    assert got["ruler/squad_dev_v2.0.json"]["source"] == {"origin": "url", "from": f"{base}/squad.json"}
    assert list(read_jsonl(tmp_path / "p" / "ruler" / "paul_graham_essays.jsonl")) == [{"text": "How to do great work."}]
    # with the wheel under the data root, the BFCL reward finds it there
    from rufus_data.rewards.bfcl import wheel_path

    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path / "p"))
    assert wheel_path("bfcl-eval==2026.3.23") == tmp_path / "p" / wheel["file"]


def test_a_native_task_that_cannot_run_here_says_why(data_root, monkeypatch):
    """RULER needs lm-eval's `ruler` extra and its haystacks; without them the task is skipped with the fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ruler = {t.name: t for t in load_suite("smollm3").tasks}["ruler"]
    with pytest.raises(TaskDataMissing) as err:
        check_native_ready(ruler, "smollm3")
    assert ("wonderwords" in err.value.reason and err.value.fetch == "pip install 'lm_eval[ruler]'") or \
        ("haystacks" in err.value.reason and err.value.fetch.startswith("rufus-eval data pull smollm3 --tasks ruler"))


def test_a_task_names_its_data_once_and_from_the_registry(tmp_path):
    task = """name: s
tasks:
  - name: t
    kind: rufus
    role: validation
    {data}
    prompt: "{{question}}"
    gold_fields: [answer]
    scorer: string_match:gsm8k
"""
    path = tmp_path / "s.yaml"
    path.write_text(task.format(data="benchmark: gsm8kk"))
    with pytest.raises(RufusError, match="task t names unknown benchmark 'gsm8kk' \\(did you mean 'gsm8k'\\?\\)"):
        load_suite(str(path))
    path.write_text(task.format(data="benchmark: gsm8k\n    data: {path: x.jsonl}"))
    with pytest.raises(RufusError, match="names its data once"):
        load_suite(str(path))
    path.write_text(task.format(data="data: {path: x.jsonl}"))
    assert load_suite(str(path)).tasks[0].data.path == str(tmp_path / "x.jsonl")  # relative to the suite file
