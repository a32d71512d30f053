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

import duckdb
import httpx
import pytest

from rufus_data.errors import RufusError
from rufus_eval.backends import BackendConfig
from rufus_eval.runner import RunRequest, run_suite

DOCS, K = 2, 2


def judged_suite(folder: Path, base_url: str, judge_model: str = "smollm2-135m") -> Path:
    """Two judged tasks over GSM8K test (from $RUFUS_DATA_ROOT), the reference being the row's worked
    answer: `judged` lets the judge write 96 tokens; `judged_mute` only 1, which can never hold a
    parsable "Score: N", so every one of its samples is unscorable."""
    suite = folder / "judged.yaml"
    task = """  - name: {name}
    kind: rufus
    role: validation
    data: {{path: gsm8k/test.jsonl}}
    prompt: "{{question}}"
    gold_fields: [answer]
    scorer: {{name: judge, judge_model: {model}, judge_base_url: "{url}", judge_max_tokens: {tokens}}}
    metric: avg@k
"""
    suite.write_text(
        f"name: judged\nsamples: {K}\nsampling: {{temperature: 1.0, top_p: 1.0, max_tokens: 32}}\ntasks:\n"
        + task.format(name="judged", model=judge_model, url=base_url, tokens=96)
        + task.format(name="judged_mute", model=judge_model, url=base_url, tokens=1)
    )
    return suite


@pytest.fixture(scope="module")
def judged_run(vllm_server, data_root, builtin_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("judged")
    env_before = {k: v for k, v in os.environ.items() if k.startswith("JUDGE_")}
    record = run_suite(RunRequest(
        suite=str(judged_suite(work, vllm_server.base_url)), checkpoint=builtin_model,
        backend=BackendConfig(kind="hf"), limit=DOCS, out=work / "run", run_name="judged-hf", step=5,
        db_path=work / "runs.duckdb",
    ))
    env_after = {k: v for k, v in os.environ.items() if k.startswith("JUDGE_")}
    return record, work, env_before, env_after


@pytest.mark.vllm
def test_judge_is_pinned_in_results_and_store(judged_run, vllm_server):
    record, work, env_before, env_after = judged_run
    reported = httpx.get(f"{vllm_server.base_url}/version", timeout=10).json()["version"]
    on_disk = json.loads((work / "run" / "results.json").read_text())
    for name in ("judged", "judged_mute"):
        judge = on_disk["judges"][name]
        assert judge["model"] == vllm_server.model == "smollm2-135m"
        assert judge["base_url"] == f"{vllm_server.base_url}/v1"
        assert judge["server_version"] == reported and reported
        config = (work / "run" / "tasks" / f"{name}.yaml").read_text()
        assert f"judge_base_url: {vllm_server.base_url}/v1" in config and "judge_model: smollm2-135m" in config
    assert on_disk["judges"]["judged"]["max_tokens"] == 96 and on_disk["judges"]["judged_mute"]["max_tokens"] == 1
    # the judge's connection went through arguments, not the process environment
    assert env_after == env_before
    with duckdb.connect(str(work / "runs.duckdb"), read_only=True) as con:
        rows = con.execute("select task, metric, value, k, docs from results where run = 'judged-hf' order by task").fetchall()
    assert [r[0] for r in rows] == ["judged", "judged_mute"]
    assert rows[0][1:] == ("avg@2", record["tasks"]["judged"]["value"], K, DOCS)


@pytest.mark.vllm
def test_unscorable_samples_are_excluded_and_counted_never_zero(judged_run):
    record, work, _, _ = judged_run
    # a 1-token judge never writes a score: no number at all (null), every sample counted unscored
    mute = record["tasks"]["judged_mute"]
    assert mute["value"] is None and mute["stderr"] is None
    assert mute["unscored"] == 1.0 and mute["scored_docs"] == 0 and mute["docs"] == DOCS
    for line in Path(mute["samples_file"]).read_text().splitlines():
        sample = json.loads(line)
        assert "avg@2" not in sample and sample["unscored"] == 1.0
        assert len(sample["resps"][0]) == K
    with duckdb.connect(str(work / "runs.duckdb"), read_only=True) as con:
        assert con.execute("select value from results where task = 'judged_mute'").fetchone() == (None,)

    # the 96-token judge: whatever it scored is in range, and the task's number is the mean over the
    # documents that have one; unscored samples only lower the count, never the score
    judged = record["tasks"]["judged"]
    samples = [json.loads(line) for line in Path(judged["samples_file"]).read_text().splitlines()]
    assert len(samples) == DOCS and all(len(s["resps"][0]) == K for s in samples)
    per_doc = [s["avg@2"] for s in samples if "avg@2" in s]
    assert judged["scored_docs"] == len(per_doc)
    assert judged["unscored"] == pytest.approx(sum(s["unscored"] for s in samples) / DOCS)
    for s in samples:
        assert ("avg@2" in s) == (s["unscored"] < 1.0)
        if s["unscored"] == 0.5:  # one sample scored: its own 0.0 or 1.0, not halved by the unscored one
            assert s["avg@2"] in (0.0, 1.0)
    if per_doc:
        assert all(0.0 <= v <= 1.0 for v in per_doc)
        assert judged["value"] == pytest.approx(sum(per_doc) / len(per_doc))
    else:
        assert judged["value"] is None
    print(f"\njudge 135M: unscored {judged['unscored']:.2f}, avg@2 {judged['value']}, docs scored {len(per_doc)}/{DOCS}")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_judge_is_a_clear_error_before_generation(tmp_path, data_root, builtin_model):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    out = tmp_path / "run"
    with pytest.raises(RufusError) as err:
        run_suite(RunRequest(suite=str(judged_suite(tmp_path, url)), checkpoint=builtin_model, limit=DOCS, out=out,
                             db_path=tmp_path / "runs.duckdb"))
    message = str(err.value)
    assert "suite judged, task judged" in message and f"{url} is not reachable" in message
    assert "start the judge server" in message and "judge_base_url" in message
    assert not out.exists() and not (tmp_path / "runs.duckdb").exists()  # nothing half-written


@pytest.mark.vllm
def test_judge_model_not_served_is_a_clear_error(tmp_path, vllm_server, data_root, builtin_model):
    with pytest.raises(RufusError, match=r"serves \['smollm2-135m'\], not judge_model 'Qwen/Qwen3-32B'"):
        run_suite(RunRequest(suite=str(judged_suite(tmp_path, vllm_server.base_url, "Qwen/Qwen3-32B")),
                             checkpoint=builtin_model, limit=DOCS, out=tmp_path / "run"))
