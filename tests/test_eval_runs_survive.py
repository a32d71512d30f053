"""Suite runs that survive: a run killed mid-task (SIGKILL, nothing of it runs after) keeps the
tasks it finished, and the same command continues to the results an uninterrupted run gives; two
runs finishing at once both record, while a notebook holds a results connection open. Real
`rufus-eval suite` processes on the built-in tiny-random model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ifeval_suites import ifeval_task, no_comma_rows, write_rows, write_suite

from rufus_eval.results import connect_results

ROWS = no_comma_rows(["Say yes.", "Say no.", "Name a colour.", "Name a city.", "Count to three.", "Greet me."])
CLI = str(Path(sys.executable).with_name("rufus-eval"))


def write_survive_suite(folder: Path, max_tokens: int = 24) -> Path:
    """Two tasks: `first` over 2 rows, `second` over 6 (a run killed in it has finished `first`)."""
    short, long = write_rows(folder / "short.jsonl", ROWS[:2]), write_rows(folder / "long.jsonl", ROWS)
    return write_suite(folder / "survive.yaml", [ifeval_task("first", short), ifeval_task("second", long)],
                       repeats=2, max_tokens=max_tokens)


def suite_command(suite: Path, *options: str) -> list[str]:
    return [CLI, "suite", str(suite), "--ckpt", "tiny-random", "--backend", "hf", *options]


@pytest.fixture
def env(data_root):
    return {**os.environ, "RUFUS_DATA_ROOT": str(data_root), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run(command: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def task_results(out: Path) -> dict:
    """What a run found, per task: its record without the path of its samples file, and the samples."""
    record = json.loads((out / "results.json").read_text())
    return {name: ({k: v for k, v in task.items() if k != "samples_file"},
                   (out / "lm_eval" / f"samples_{name}.jsonl").read_text())
            for name, task in record["tasks"].items()}


@pytest.mark.spawn
def test_a_suite_killed_mid_task_resumes_to_the_uninterrupted_results(tmp_path, env, tiny_model):
    suite = write_survive_suite(tmp_path)
    killed = tmp_path / "killed"
    command = suite_command(suite, "--out", str(killed))
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    while not list(tmp_path.glob(".eval-work-*/done/first.json")):  # the first task is whole: kill the run in the second
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the first task never finished"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    (work,) = tmp_path.glob(".eval-work-*")
    assert not killed.exists()  # the run folder: whole or not at all
    assert sorted(p.name for p in (work / "done").iterdir()) == ["first.json"]  # killed inside the second task

    resumed = run(command, tmp_path, env)
    assert "resuming" in resumed.stderr and "1 of 2 task(s) done by an earlier attempt (first); running second" in \
        resumed.stderr
    assert not work.exists()  # removed once the run folder is in place
    whole = tmp_path / "whole"
    run(suite_command(suite, "--out", str(whole)), tmp_path, env)
    assert task_results(killed) == task_results(whole)
    record = json.loads((killed / "results.json").read_text())
    assert record["tasks"]["second"]["docs"] == len(ROWS) and record["tasks"]["first"]["docs"] == 2
    assert not list(tmp_path.glob(".*"))


@pytest.mark.spawn
def test_two_runs_finishing_together_both_record_beside_an_open_notebook(tmp_path, env, tiny_model):
    suite = write_survive_suite(tmp_path, max_tokens=4)
    root = tmp_path / "outputs" / "eval"
    root.mkdir(parents=True)
    notebook = connect_results([root])  # held open across both runs, as a notebook would
    assert notebook.execute("SELECT count(*) FROM results").fetchone() == (0,)
    procs = [subprocess.Popen(suite_command(suite, "--task", "first", "--name", name), cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for name in ("run-a", "run-b")]
    errors = [p.communicate(timeout=900)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
    found = run([CLI, "results", "SELECT run, task, docs FROM results ORDER BY run", "--format", "json"], tmp_path, env)
    assert json.loads(found.stdout) == [{"run": "run-a", "task": "first", "docs": 2},
                                        {"run": "run-b", "task": "first", "docs": 2}]
    assert notebook.execute("SELECT count(*) FROM results").fetchone() == (0,)  # its snapshot, still usable
    notebook.close()
    table = run([CLI, "results"], tmp_path, env).stdout
    assert "run-a" in table and "run-b" in table and "avg@2" in table
