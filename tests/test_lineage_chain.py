"""The lineage on a real chain, every step a CLI as a user types it (tiny-random, one step):

    rufus-data mix -> decontam --against quick (one planted GSM8K test question removed)
    -> filter (a few prompts) -> rufus-train stage reasoning_rl on a bucket, evaluating its
    checkpoint and its base -> rufus-eval compare

The run's run.json holds the chain with fingerprints; the checkpoint's evaluation says per task
what the training data was checked against: GSM8K checked with 1 row removed, AIME 2024 (not in
`quick`) NOT CHECKED, flagged in the table; the base model has no training data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_lineage import toy_catalog

from rufus_data.folders.shards import file_sha256, read_manifest, shard_files

pytestmark = pytest.mark.spawn  # every step is a CLI in a subprocess
BIN = Path(sys.executable).parent
SUITE = {
    "name": "lineage", "repeats": 1, "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 8}, "tasks": [
        {"name": "gsm8k", "kind": "rufus", "role": "validation", "benchmark": "gsm8k", "prompt": "{question}",
         "gold_fields": ["answer"], "scorer": {"name": "string_match", "extractor": "last_number",
                                               "gold_extractor": "gsm8k", "answer_column": "answer"}},
        {"name": "aime24", "kind": "rufus", "role": "validation", "benchmark": "aime24", "prompt": "{problem}",
         "gold_fields": ["answer"], "scorer": {"name": "string_match", "extractor": "boxed", "compare": "integer",
                                               "answer_column": "answer"}},
    ]}


def run(root: Path, log: list[str], *argv: str) -> subprocess.CompletedProcess:
    """One command in `root`, its output kept in `log` (the chain's transcript)."""
    done = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=root, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=1200, check=False)
    log.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def chain(tmp_path_factory, data_root, tiny_model) -> dict:
    root = tmp_path_factory.mktemp("chain")
    catalog = toy_catalog(root / "catalog", data_root, tiny_model)
    suite = root / "lineage_suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE, sort_keys=False))
    log: list[str] = []
    run(root, log, "rufus-data", "mix", str(catalog), "--out", "mix")
    run(root, log, "rufus-data", "decontam", "mix", "--against", "quick", "--out", "clean", "--workers", "1")
    run(root, log, "rufus-data", "filter", "clean", "--policy", tiny_model, "--backend", "hf", "--k", "2",
        "--max-tokens", "8", "--limit", "4", "--out", "filtered")
    bucket = max(("all_pass", "learnable", "all_fail", "unscored"),
                 key=lambda b: read_manifest(root / "filtered" / b)["counts"]["rows"])
    stage = run(root, log, "rufus-train", "stage", "reasoning_rl", "--model", tiny_model, "--data", f"filtered/{bucket}",
                "--output_dir", "run", "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
                "--max_completion_length", "8", "--save_steps", "1", "--logging_steps", "1", "--stop_after_dead_steps", "0",
                "--gradient_checkpointing", "false", "--eval.eval_on_checkpoint", "true", "--eval.suite", str(suite),
                "--eval.backend", "hf", "--eval.limit", "1", "--eval.repeats", "1", "--eval.max_tokens", "8")
    compare = run(root, log, "rufus-eval", "compare", "run/eval_logs/step-0", "run/eval_logs/step-1")
    transcript = "\n".join(log + [(root / "run" / "eval_logs" / f"step-{n}" / "eval.log").read_text() for n in (0, 1)])
    (root / "transcript.txt").write_text(transcript)
    print(f"chain transcript: {root / 'transcript.txt'}")
    return {"root": root, "catalog": catalog, "bucket": bucket, "stage": stage, "compare": compare}


def test_run_json_holds_the_chain_with_fingerprints(chain):
    root = chain["root"]
    summary = json.loads((root / "run" / "run.json").read_text())
    lineage = summary["lineage"]
    assert lineage["base"]["run"] is None
    (entry,) = lineage["data"]
    bucket = root / "filtered" / chain["bucket"]
    filtered = entry["folder"]
    assert filtered["command"] == "rufus-data filter" and filtered["path"] == str(bucket.resolve())
    assert filtered["fingerprint"] == {p.name: file_sha256(p) for p in shard_files(bucket)}
    clean = filtered["inputs"][0]
    assert clean["command"] == "rufus-data decontam" and clean["on_disk"] == "same"
    assert clean["fingerprint"] == read_manifest(bucket)["inputs"][0]["files"]
    assert clean["checked"]["benchmarks"]["gsm8k"] == 1 and clean["checked"]["against"] == ["quick"]
    mixed = clean["inputs"][0]
    assert mixed["command"] == "rufus-data mix" and mixed["catalog"]["path"] == str(chain["catalog"])
    assert mixed["fingerprint"] == read_manifest(root / "clean")["inputs"][0]["files"]
    said = " ".join((chain["stage"].stdout + chain["stage"].stderr).split())
    assert f"data {chain['bucket']}: {bucket.resolve()} (filter <- decontam (against quick) <- mix" in said
    assert "checked against gsm8k (1 row removed), humaneval (clean), ifeval (clean), math500 (clean)" in said


def test_the_checkpoint_evaluation_says_per_task_what_was_checked(chain):
    logs = chain["root"] / "run" / "eval_logs"
    trained = json.loads((logs / "step-1" / "results.json").read_text())
    assert trained["training_run"] == str((chain["root"] / "run").resolve())
    gsm8k, aime = trained["tasks"]["gsm8k"]["data_check"], trained["tasks"]["aime24"]["data_check"]
    assert (gsm8k["status"], gsm8k["rows_removed"]) == ("removed", 1)
    assert aime["status"] == "not_checked" and "without a decontam step that checked aime24" in aime["why"]
    table = (logs / "step-1" / "eval.log").read_text()
    assert "checked: 1 row removed" in table and "NOT CHECKED" in table
    assert "NOT CHECKED aime24: data" in " ".join(table.split())
    report = (logs / "step-1" / "report.md").read_text()
    assert "| **NOT CHECKED** |" in report and "- gsm8k: checked: 1 row removed" in report
    base = json.loads((logs / "step-0" / "results.json").read_text())
    assert base["training_run"] is None
    assert {t["data_check"]["status"] for t in base["tasks"].values()} == {"no_training_data"}


def test_compare_flags_the_unchecked_number(chain):
    out = chain["compare"].stdout
    assert out.count("NOT CHECKED") == 1  # aime24 at step 1; the base model has no training data
    assert "model-checkpoint-1: NOT CHECKED aime24" in " ".join(chain["compare"].stderr.split())
