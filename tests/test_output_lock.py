"""One writer per output (rufus_data/folders/output_lock.py): every command that writes an output folder
or a run folder stops at once, told who writes it, when another live process holds the output's
lock; --overwrite does not get past it; a killed holder's lock and leftovers are taken over, so
its re-run is not blocked; no temporary folder remains.

"Another live process" is a small process holding the lock through the real helper (HOLDER); the
commands run in this process (CliRunner), on tiny data and the tiny-random model. Two real `mix`
processes race for one output, and a real `mix` is SIGKILLed mid-write and run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import example_shards
import pytest
import yaml
from conftest import REPO
from rl_prompts import NUMBER_REWARD, arithmetic_rows, gsm8k_rows, write_rl_shards
from test_filter import RUFUS_DATA
from test_pairs import GSM8K_REWARD
from test_train_export_mask import adapter_run
from train_helpers import one_torch_thread
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app as data_app
from rufus_data.folders.output_lock import (
    OutputLock,
    check_unlocked,
    holder_path,
    lock_path,
    remove_stale_temporaries,
)
from rufus_data.folders.shards import atomic_output_dir
from rufus_eval.cli import app as eval_app
from rufus_train.cli import app as train_app
from rufus_train.launch import LAUNCHED_ENV, takes_output_lock

_ = one_torch_thread, adapter_run
CATALOG = str(REPO / "catalogs" / "sft.yaml")
SFT_TRAIN_ROWS = 919  # catalogs/sft.yaml mixed whole (the samples of scripts/make_samples.py)
HOLDER = """
import os, sys
from pathlib import Path
from rufus_data.folders.output_lock import OutputLock
out = Path(sys.argv[1])
held = OutputLock(out, "the test's holder").acquire()  # kept: a dropped lock is released
(out.parent / f".{out.name}.tmp-{os.getpid()}").mkdir()  # what a writer killed mid-write leaves
print("held", flush=True)
sys.stdin.read()
"""


def hold(out: Path) -> subprocess.Popen:
    """Another live process holding the lock of `out` (until it is killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def temporaries(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.tmp-*")) + sorted(
        p.name for p in out.parent.glob(f".{out.name}.old-*"))


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_root, tiny_model, adapter_run) -> dict:
    root = tmp_path_factory.mktemp("lock-inputs")
    sft = root / "sft"
    example_shards.gsm8k_sft(data_root, sft, limit=8, max_chars=350)
    return {"sft": str(sft), "rl": str(write_rl_shards(root / "rl", arithmetic_rows(4))),
            "gsm8k": str(write_rl_shards(root / "gsm8k", gsm8k_rows(data_root, 4))), "run": str(adapter_run[0])}


TINY = {"max_steps": 1, "per_device_train_batch_size": 2, "max_length": 160, "save_steps": 1, "logging_steps": 1}
TINY_STAGE = ["--model", "tiny-random", *(f for k, v in TINY.items() for f in (f"--{k}", str(v))), "--no-gradient_checkpointing"]


def command(kind: str, inputs: dict, out: Path) -> tuple:
    """(app, argv, a file a whole output holds, whether argv replaces an existing output)."""
    o = str(out)
    if kind == "mix":
        return data_app, ["mix", CATALOG, "--out", o, "--overwrite"], "manifest.json", True
    if kind == "decontam":
        return data_app, ["decontam", inputs["sft"], "--against", "gsm8k", "--out", o, "--overwrite"], "contaminated.parquet", True
    if kind == "dedup":
        return data_app, ["dedup", inputs["sft"], "--out", o, "--overwrite"], "clusters.parquet", True
    if kind == "filter":
        return data_app, ["filter", inputs["rl"], "--out", o, "--policy", "tiny-random", "--reward", json.dumps(NUMBER_REWARD),
                          "--k", "2", "--max-tokens", "4", "--backend", "hf", "--overwrite"], "rollouts.parquet", True
    if kind == "pairs":
        return data_app, ["pairs", inputs["gsm8k"], "--out", o, "--perturb-answer", "--require-verified",
                          "--reward", json.dumps(GSM8K_REWARD), "--overwrite"], "manifest.json", True
    if kind == "stage":
        return train_app, ["stage", "sft", "--data", inputs["sft"], "--output_dir", o, *TINY_STAGE, "--overwrite"], "run.json", True
    if kind == "pipeline":
        spec = {"name": "p", "model": "tiny-random", "output_dir": o,
                "stages": [{"stage": "sft", "data": [inputs["sft"]], **TINY, "gradient_checkpointing": False}]}
        path = out.parent / "p.yaml"
        path.write_text(yaml.safe_dump(spec))
        return train_app, ["pipeline", str(path)], "pipeline.json", False
    if kind == "export":
        return train_app, ["export", inputs["run"], "--merge", "--out", o, "--overwrite"], "config.json", True
    if kind == "eval suite":
        return eval_app, ["suite", "quick", "--ckpt", "tiny-random", "--task", "gsm8k", "--limit", "1", "--repeats", "1",
                          "--max-tokens", "4", "--backend", "hf", "--out", o, "--overwrite"], \
            "results.json", True
    raise ValueError(kind)


KINDS = ["mix", "decontam", "dedup", "filter", "pairs", "stage", "pipeline", "export", "eval suite"]


@pytest.mark.spawn
@pytest.mark.parametrize("kind", KINDS)
def test_a_second_command_on_a_held_output_stops_at_once_and_a_killed_holder_never_blocks(kind, inputs, tmp_path):
    out = tmp_path / "out"
    app, argv, whole_file, replaces = command(kind, inputs, out)
    if replaces:  # an earlier output: --overwrite must not replace it while another process writes
        out.mkdir()
        (out / "earlier.txt").write_text("earlier run")
        (out / "run.json" if kind in ("stage", "export") else out / "manifest.json").write_text("{}")  # Rufus wrote it
    holder = hold(out)
    try:
        started = time.monotonic()
        refused = CliRunner().invoke(app, argv)
        seconds = time.monotonic() - started
        said = flat(refused.output)
        assert refused.exit_code == 2, refused.output
        assert isinstance(refused.exception, SystemExit) and "Traceback" not in refused.output  # one paragraph
        assert f"output {out} is being written by another process: pid {holder.pid}" in said, said
        assert f"(`-c {out}`, since" in said and f"kill {holder.pid}" in said  # its command line, since when
        print(f"{kind}: refused after {seconds:.1f} s")
        assert (out / "earlier.txt").exists() if replaces else not (out / whole_file).exists()
        assert temporaries(out) == [f".out.tmp-{holder.pid}"]  # the live holder's folder is left alone
        assert json.loads(holder_path(out).read_text())["pid"] == holder.pid
        assert lock_path(out) == out.parent / ".out.lock"  # beside the output, never inside the folder renamed into place
    finally:
        holder.kill()
        holder.wait()
    done = CliRunner().invoke(app, argv)  # the holder was killed: its lock and its leftovers are taken over
    assert done.exit_code == 0, done.output
    said = flat(done.output)
    assert f"taking over the lock of {out} from pid {holder.pid}" in said, said
    assert f"removing {out.parent / f'.out.tmp-{holder.pid}'}" in said
    assert (out / whole_file).exists() and not (out / "earlier.txt").exists()
    assert temporaries(out) == [] and not holder_path(out).exists() and not lock_path(out).exists()  # nothing left


def mix_process(out: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([RUFUS_DATA, "mix", CATALOG, "--out", str(out)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.spawn
def test_two_mix_processes_started_together_one_writes_the_other_is_told(tmp_path):
    first, second = mix_process(tmp_path / "o", tmp_path), mix_process(tmp_path / "o", tmp_path)
    results = [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in (first, second)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    winner = next(r for r in results if r[0] == 0)
    loser = next(r for r in results if r[0] == 2)
    winner_pid = (first if winner is results[0] else second).pid
    message = flat(loser[1] + loser[2])
    print("the loser said:", message)
    assert f"output {tmp_path / 'o'} is being written by another process: pid {winner_pid}" in message
    assert "rufus-data mix" in message and "Traceback" not in message
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["rows"]["train"] == SFT_TRAIN_ROWS  # whole: the winner's output
    assert temporaries(tmp_path / "o") == [] and not holder_path(tmp_path / "o").exists()
    assert not lock_path(tmp_path / "o").exists()


@pytest.mark.spawn
def test_a_sigkilled_mix_does_not_block_its_rerun(tmp_path):
    out = tmp_path / "o"
    killed = mix_process(out, tmp_path)
    deadline = time.monotonic() + 300
    while not temporaries(out):  # killed mid-write: its temporary folder exists
        assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    assert temporaries(out) == [f".o.tmp-{killed.pid}"] and not out.exists()
    again = subprocess.run([RUFUS_DATA, "mix", CATALOG, "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    said = flat(again.stdout + again.stderr)
    assert f"taking over the lock of {out} from pid {killed.pid}" in said
    assert f"removing {tmp_path / f'.o.tmp-{killed.pid}'}" in said
    assert json.loads((out / "manifest.json").read_text())["rows"]["train"] == SFT_TRAIN_ROWS
    assert temporaries(out) == []


# --- the helper itself (no processes started) -----------------------------------------------------
def test_the_lock_is_reentrant_in_one_process_and_records_its_holder(tmp_path):
    out = tmp_path / "o"
    with OutputLock(out, "rufus-data mix") as held:
        record = json.loads(holder_path(out).read_text())
        assert record["pid"] == os.getpid() and record["step"] == "rufus-data mix" and record["command"]
        with OutputLock(out, "rufus-data mix"):  # a library caller's second step in this process
            pass
        assert holder_path(out).exists()  # still held by the outer hold
        assert held.out == out
    assert not holder_path(out).exists() and not lock_path(out).exists() and not out.exists()
    check_unlocked(out)  # a probe writes nothing
    assert not lock_path(out).exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_dead_writers_go_and_a_replaced_output_caught_between_renames_comes_back(tmp_path):
    out, dead = tmp_path / "o", dead_pid()
    (tmp_path / f".o.tmp-{dead}").mkdir()
    (tmp_path / f".o.old-{dead}").mkdir()
    (tmp_path / f".o.old-{dead}" / "shard").write_text("the earlier output")
    (tmp_path / ".o.tmp-1").mkdir()  # pid 1 runs: not a dead writer's
    remove_stale_temporaries(out)
    assert (out / "shard").read_text() == "the earlier output"
    assert temporaries(out) == [".o.tmp-1"]


def test_an_output_that_appears_during_the_write_is_a_clear_error_and_no_temporary_stays(tmp_path):
    out = tmp_path / "o"
    appeared = r"appeared while this run wrote it .* another process wrote the same output"
    with pytest.raises(RufusError, match=appeared), atomic_output_dir(out) as tmp:
        (tmp / "mine").write_text("x")
        out.mkdir()
        (out / "theirs").write_text("y")  # a writer that took no lock finished first
    assert (out / "theirs").exists() and not (out / "mine").exists() and temporaries(out) == []


def test_only_the_launching_process_or_rank_0_takes_a_run_folder_lock(monkeypatch):
    monkeypatch.delenv(LAUNCHED_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert takes_output_lock()
    monkeypatch.setenv("RANK", "0")
    assert takes_output_lock()
    monkeypatch.setenv("RANK", "1")  # torchrun / accelerate started by the user: rank 0 holds it
    assert not takes_output_lock()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(LAUNCHED_ENV, "1")  # `rufus-train stage` launched this process and holds the lock
    assert not takes_output_lock()
