"""A judged task end to end: the built-in model answers GSM8K test questions on the hf backend and
the real vLLM CPU server (the shared `vllm_server`) judges each answer against the row's reference
solution. The judge is pinned (model id and the server's own /version in results.json), samples
the judge cannot score are excluded and counted (never 0.0), and a judge that is not there is a
clear error before anything is generated."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import read_jsonl

from rufus_data.base.errors import RufusError
from rufus_eval.metrics import rufus_avg
from rufus_eval.request import EvalRequest
from rufus_eval.results import query_results
from rufus_eval.runner import run_suite

DOCS, K = 2, 2


def judged_suite(folder: Path, base_url: str, judge_model: str = "smollm2-135m", judge_tokens: int = 1) -> Path:
    """One judged task over GSM8K test (the registry benchmark); the judge compares each answer with
    the row's worked `answer`. The end-to-end run lets the judge write 1 token, which can never hold
    a parsable "Score: N": every sample is unscorable, deterministically (the 135M judge rarely
    writes a score even with room for one; `test_real_judge_scores_...` gives it that room)."""
    suite = folder / "judged.yaml"
    suite.write_text(f"""name: judged
repeats: {K}
sampling: {{temperature: 1.0, top_p: 1.0, max_tokens: 32}}
tasks:
  - name: judged
    kind: rufus
    role: validation
    benchmark: gsm8k
    prompt: "{{question}}"
    gold_fields: [answer]
    scorer: {{name: llm_judge, model: {judge_model}, base_url: "{base_url}", max_tokens: {judge_tokens}}}
    metric: avg@k
""")
    return suite


@pytest.fixture(scope="module")
def judged_run(vllm_server, data_root, builtin_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("judged")
    env_before = {k: v for k, v in os.environ.items() if k.startswith("JUDGE_")}
    record = run_suite(EvalRequest(
        suite=str(judged_suite(work, vllm_server.base_url)), checkpoint=builtin_model,
        backend="hf", limit=DOCS, out=work / "run", run_name="judged-hf", step=5,
    ))
    env_after = {k: v for k, v in os.environ.items() if k.startswith("JUDGE_")}
    return record, work, env_before, env_after


@pytest.mark.vllm
def test_judge_is_pinned_in_results_and_store(judged_run, vllm_server):
    _, work, env_before, env_after = judged_run
    reported = httpx.get(f"{vllm_server.base_url}/version", timeout=10).json()["version"]
    on_disk = json.loads((work / "run" / "results.json").read_text())
    assert on_disk["judges"] == {"judged": {
        "model": "smollm2-135m", "base_url": f"{vllm_server.base_url}/v1", "server_version": reported,
        "threshold": 7, "max_tokens": 1,
    }} and reported and vllm_server.model == "smollm2-135m"
    # the lm-eval config the metric reads names the same judge, explicitly
    config = yaml.safe_load((work / "run" / "tasks" / "judged.yaml").read_text())
    scorer = config["metric_list"][0]["scorer"]
    assert (scorer["base_url"], scorer["model"], scorer["reference_column"]) == (
        f"{vllm_server.base_url}/v1", "smollm2-135m", "answer")
    assert env_after == env_before  # the connection went through arguments, not the process environment
    _, rows = query_results("select task, metric, value, k, docs from results where run = 'judged-hf'", [work])
    assert rows == [("judged", "avg@2", None, K, DOCS)]


@pytest.mark.vllm
def test_unscorable_samples_are_excluded_and_counted_never_zero(judged_run, data_root):
    """No sample scored: the task has no number (null), not 0.0, and every sample is counted."""
    record, work, _, _ = judged_run
    rows = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=DOCS)
    task = record["tasks"]["judged"]
    assert task["value"] is None and task["stderr"] is None
    assert task["unscored"] == 1.0 and task["scored_docs"] == 0 and task["docs"] == DOCS
    samples = [json.loads(line) for line in Path(task["samples_file"]).read_text().splitlines()]
    assert len(samples) == DOCS
    for sample in samples:
        assert len(sample["resps"][0]) == K and "avg@2" not in sample and sample["unscored"] == 1.0
        # the judge's reference is the data row's own worked answer
        assert json.loads(sample["doc"]["gold"])["answer"] == rows[sample["doc_id"]]["answer"]
    assert json.loads((work / "run" / "results.json").read_text())["tasks"]["judged"]["value"] is None


@pytest.mark.vllm
def test_real_judge_scores_are_in_range_or_excluded(judged_run):
    """The same metric with the judge given 64 tokens, on the run's first document (its k answers and
    its reference): avg@2 is the mean of the scored samples only, in [0, 1], or absent when none scored
    (what the 135M judge does in practice: it rarely ends with "Score: N")."""
    record, work, _, _ = judged_run
    config = yaml.safe_load((work / "run" / "tasks" / "judged.yaml").read_text())
    scorer = {**config["metric_list"][0]["scorer"], "max_tokens": 64}
    sample = json.loads(Path(record["tasks"]["judged"]["samples_file"]).read_text().splitlines()[0])
    result = rufus_avg([sample["doc"]["gold"]], [sample["resps"][0]], scorer=scorer, k=K)
    assert result["unscored"] in (0.0, 0.5, 1.0)
    if result["unscored"] == 1.0:
        assert "avg@2" not in result
    elif result["unscored"] == 0.5:  # one sample scored: its own 0.0 or 1.0, not halved by the other
        assert result["avg@2"] in (0.0, 1.0)
    else:
        assert result["avg@2"] in (0.0, 0.5, 1.0)
    print(f"\n135M judge with 64 tokens: {result}")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_judge_is_a_clear_error_before_generation(tmp_path, data_root, tiny_model):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    out = tmp_path / "run"
    with pytest.raises(RufusError) as err:
        run_suite(EvalRequest(suite=str(judged_suite(tmp_path, url)), checkpoint=tiny_model, limit=DOCS, out=out))
    message = str(err.value)
    assert "suite judged, task judged" in message and f"{url} is not reachable" in message
    assert "start the judge server" in message and "scorer's base_url" in message
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written


@pytest.mark.vllm
def test_judge_model_not_served_is_a_clear_error(tmp_path, vllm_server, data_root, builtin_model):
    with pytest.raises(RufusError, match=r"serves \['smollm2-135m'\], not the scorer's model 'Qwen/Qwen3-32B'"):
        run_suite(EvalRequest(suite=str(judged_suite(tmp_path, vllm_server.base_url, "Qwen/Qwen3-32B")),
                              checkpoint=builtin_model, limit=DOCS, out=tmp_path / "run"))
