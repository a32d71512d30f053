"""The headline command, as the README writes it, from the command line of a fresh process:
`rufus-eval suite smollm3 --ckpt smollm2-135m`, bounded only by --limit/--repeats/--max-tokens,
offline with RUFUS_DATA_ROOT. It runs what it can, skips the rest with reasons, and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rufus_data.benchmarks.suite import load_suite

# the SmolLM3 validation tasks whose data the shared data root holds (or the bfcl-eval wheel ships)
RUN_OFFLINE = {"aime25", "ifeval", "bfcl_simple_python", "bfcl_multiple", "gsm_plus"}


@pytest.mark.spawn
def test_smollm3_suite_headline_command_offline(tmp_path, data_root, builtin_model):
    cli = Path(sys.executable).with_name("rufus-eval")
    env = {**os.environ, "RUFUS_DATA_ROOT": str(data_root), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(cli), "suite", "smollm3", "--ckpt", "smollm2-135m", "--limit", "1", "--repeats", "1",
                           "--max-tokens", "16"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not a git repository" not in proc.stderr  # lm-eval asks git about the working folder, quietly
    (run,) = (tmp_path / "outputs" / "eval").glob("smollm3-smollm2-135m-*")
    assert f"run folder: outputs/eval/{run.name}" in proc.stderr
    record = json.loads((run / "results.json").read_text())
    validation = [t.name for t in load_suite("smollm3").tasks if t.role == "validation"]
    assert list(record["tasks"]) == validation  # test-role tasks only with --final
    for name in RUN_OFFLINE:
        task = record["tasks"][name]
        assert task["status"] == "ran" and task["k"] == 1 and task["docs"] == 1 and task["value"] is not None, name
    lcb = record["tasks"]["livecodebench"]
    assert lcb["status"] == "skipped" and lcb["value"] is None
    assert lcb["fetch"] == "rufus-eval data pull smollm3 --tasks livecodebench --to $RUFUS_DATA_ROOT"
    assert "skipped" in proc.stdout and f"to get it: {lcb['fetch']}" in proc.stderr
    assert record["step"] == 0 and record["backend"] == "hf" and "backend: hf (auto: no GPU" in proc.stderr
    found = subprocess.run([str(cli), "results", "SELECT task, status FROM results", "--format", "json"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300, check=True)
    assert {row["task"]: row["status"] for row in json.loads(found.stdout)} == {
            name: "skipped" if name == "livecodebench" else "ran" for name in validation}
