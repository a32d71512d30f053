"""`rufus-eval suite --report_to trackio --report_to wandb` on tiny-random: the results and
sample tables go through lm-eval's own loggers into project `rufus` under the run's name, read
back with the trackers' own readers (trackio's local SQLite store, W&B's offline transaction
log through `wandb leet inspect`). Each in its own process: trackio fixes its storage folder at
import, W&B keeps a service per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from eval_callback_run import tiny_suite
from test_trackers import REPO, tracker_env, wandb_records

from rufus_data.base.errors import RufusError
from rufus_eval.request import EvalRequest
from rufus_eval.suite_trackers import check_trackers

RUFUS_EVAL = str(Path(sys.executable).parent / "rufus-eval")


@pytest.mark.spawn
def test_suite_logs_results_and_samples_to_trackio_and_wandb(tmp_path, tiny_model):
    env = {k: v for k, v in tracker_env(tmp_path).items() if k != "WANDB_PROJECT"}  # the default: rufus
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}"  # this checkout's code in the child
    suite = tiny_suite(tmp_path / "suite")
    done = subprocess.run([RUFUS_EVAL, "suite", str(suite), "--ckpt", "tiny-random", "--backend", "hf", "--name",
                           "tiny-eval", "--out", str(tmp_path / "run"), "--report_to", "trackio", "--report_to", "wandb"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs('rufus', 'tiny-eval'), default=str))")
    logs = json.loads(subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True,
                                     check=True, timeout=120).stdout)
    results = json.loads((tmp_path / "run" / "results.json").read_text())["tasks"]["nocomma"]
    logged = next(entry for entry in logs if any(key.endswith("avg@1,rufus") for key in entry))
    assert logged["rufus_tiny_nocomma/avg@1,rufus"] == results["value"]
    records = wandb_records(tmp_path / "wandb")
    text = json.dumps(records)
    assert '"rufus"' in text and "tiny-eval" in text  # project and run name
    assert "rufus_tiny_nocomma/avg@1" in text and "evaluation/eval_results" in text  # lm-eval's results table
    assert "rufus_tiny_nocomma_eval_results" in text  # and its samples table


def test_unknown_or_missing_trackers_are_refused_before_a_model_loads(monkeypatch):
    with pytest.raises(ValueError, match="the suite logs to wandb or trackio"):
        EvalRequest(suite="quick", checkpoint="tiny-random", report_to=["tensorboard"])
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(RufusError, match="needs the `trackio` package"):
        check_trackers(["trackio"])
