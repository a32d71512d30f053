"""Restart-proof runs: `rufus-train stage sft ... --resume_from_checkpoint latest` killed with
SIGKILL after its second save, then started again as is, ends where an uninterrupted run of the
same seed ends: the same final step, the same rows in every step (no batch trained twice or
skipped), the same metrics.jsonl steps and learning rates, the same losses. In one process and in
two (DDP on gloo, launched by Rufus). One command line serves the first run and the restart.
Around it: a half-written checkpoint is skipped, a mirror (a file:// URL, a plain folder,
memory://) receives every complete checkpoint and restores a run into an empty output_dir.

The runs record the rows of each step and stop at a known step through tests/resume_hooks.py
(RUFUS_TEST_HOOKS): the test kills a run that waits after its second save, never one racing on.
Tiny settings: tiny-random, 12 GSM8K rows, batches of 2, 8 steps, a checkpoint every 2."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import example_shards
import fsspec
import pytest
from resume_hooks import HOLD_AT, RECORD
from train_helpers import one_torch_thread, tiny_config

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import COMPLETE_MARKER
from rufus_train import guards
from rufus_train.checkpoints import (
    LATEST,
    checkpoint_problem,
    local_storage,
    mark_complete,
)
from rufus_train.grpo.rollout_state import read_rollout_state
from rufus_train.mirror import Mirror
from rufus_train.resume import resume_checkpoint
from rufus_train.runner import run_stage

_ = one_torch_thread
REPO = Path(__file__).resolve().parents[1]
STEPS, SAVE_STEPS, HOLD = 8, 2, 4  # killed after its second save, at step 4 of 8
KEEP = 2  # save_total_limit, in output_dir and in the mirror


@pytest.fixture(scope="module")
def shards(data_root, tmp_path_factory) -> Path:
    return example_shards.gsm8k_sft(data_root, tmp_path_factory.mktemp("sft"), limit=12, max_chars=200)


def stage_args(shards: Path, out: Path, mirror: str | None, processes: int) -> list[str]:
    args = ["--data", str(shards), "--output_dir", str(out), "--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS),
            "--logging_steps", "1", "--per_device_train_batch_size", "2", "--max_length", "96",
            "--no-gradient_checkpointing", "--trainer.save_total_limit", str(KEEP), "--resume_from_checkpoint", LATEST]
    if mirror:
        args += ["--checkpoint_mirror", mirror]
    if processes > 1:
        args += ["--num_processes", str(processes), "--accelerate_config", "ddp"]
    return args


def command(model: str, shards: Path, out: Path, mirror: str | None = None, processes: int = 1) -> list[str]:
    return [sys.executable, "-m", "rufus_train.cli", "stage", "sft", "--model", model,
            *stage_args(shards, out, mirror, processes)]


def hooks_env(record: Path, hold: int | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUFUS_TEST_HOOKS": "resume_hooks", RECORD: str(record),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}
    env.pop(HOLD_AT, None)
    if hold is not None:
        env[HOLD_AT] = str(hold)
    return env


def run_to_end(argv: list[str], record: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO, env=hooks_env(record), check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (torchrun starts its workers in new sessions,
    so killing the launcher's process group would not reach them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_and_kill_when_held(argv: list[str], record: Path, processes: int, ready) -> None:
    """Start the run, wait until every process holds after the save of step HOLD and `ready()`
    (the checkpoint is complete, locally and in the mirror), then SIGKILL every process of it."""
    record.mkdir(parents=True)
    log = record / "killed.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=hooks_env(record, HOLD),
                                start_new_session=True)
    deadline = time.monotonic() + 900
    while not (len(list(record.glob("held-rank*"))) == processes and ready()):
        assert proc.poll() is None, f"the run ended before step {HOLD} was held:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"step {HOLD} not held in 900 s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
    pids = [*descendants(proc.pid), proc.pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(map(alive, pids)):
        assert time.monotonic() < deadline, f"still alive after SIGKILL: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def complete(location: str | Path, step: int) -> bool:
    fs, root = fsspec.core.url_to_fs(str(location))
    return checkpoint_problem(fs, f"{root}/checkpoint-{step}") is None


def steps_rows(record: Path) -> dict[int, list[tuple[int, list[str]]]]:
    """Per rank: (step, rows) of every micro-batch trained, in order."""
    found = {}
    for path in sorted(record.glob("rows-rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        found[int(path.stem.removeprefix("rows-rank"))] = [(line["step"], line["rows"]) for line in lines]
    return found


def logged(out: Path) -> list[dict]:
    """metrics.jsonl's per-step lines (the end-of-training summary left out)."""
    return [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


def rows_trained(per_rank: dict) -> int:
    return sum(len(rows) for batches in per_rank.values() for _, rows in batches)


def comparison(name: str, reference: Path, resumed: Path, ref_record: Path, resumed_rows: dict) -> dict:
    """What the lead's note shows: final step, rows trained, metric steps, final loss."""
    ref_run, run = (json.loads((folder / "run.json").read_text()) for folder in (reference, resumed))
    row = {
        "run": name,
        "final step": (ref_run["global_step"], run["global_step"]),
        "rows trained": (rows_trained(steps_rows(ref_record)), rows_trained(resumed_rows)),
        "metric steps": ([m["step"] for m in logged(reference)], [m["step"] for m in logged(resumed)]),
        "final loss": (logged(reference)[-1]["loss"], logged(resumed)[-1]["loss"]),
    }
    print(f"\nresume comparison (uninterrupted, killed at step {HOLD} and resumed): {json.dumps(row)}")
    return row


def assert_resumed_exactly(reference: Path, ref_record: Path, out: Path, record: Path, resumed_record: Path,
                           name: str, processes: int) -> None:
    """The killed run trained steps 1..HOLD, the resumed one HOLD+1..STEPS, each batch the
    uninterrupted run's; metrics.jsonl has every step once, with its learning rate and loss."""
    killed, resumed, straight = steps_rows(record), steps_rows(resumed_record), steps_rows(ref_record)
    assert sorted(straight) == sorted(killed) == sorted(resumed) == list(range(processes))
    for rank in straight:
        assert [s for s, _ in killed[rank]] == list(range(1, HOLD + 1))
        assert [s for s, _ in resumed[rank]] == list(range(HOLD + 1, STEPS + 1))
        assert killed[rank] + resumed[rank] == straight[rank]  # no batch twice, none skipped, same order
    run = json.loads((out / "run.json").read_text())
    assert run["global_step"] == STEPS and Path(run["resumed_from"]).name == f"checkpoint-{HOLD}"
    expected, found = logged(reference), logged(out)
    assert [m["step"] for m in found] == [m["step"] for m in expected] == list(range(1, STEPS + 1))
    assert [m["learning_rate"] for m in found] == [m["learning_rate"] for m in expected]  # the schedule continues
    assert [m["loss"] for m in found] == [m["loss"] for m in expected]  # bit for bit: the same weights, step by step
    merged = {rank: killed[rank] + resumed[rank] for rank in killed}
    row = comparison(name, reference, out, ref_record, merged)
    assert row["final step"][0] == row["final step"][1] and row["rows trained"][0] == row["rows trained"][1]


# ------------------------------------------------------------------ one process


@pytest.fixture(scope="module")
def reference_single(tiny_model, shards, tmp_path_factory) -> tuple[Path, Path]:
    """The uninterrupted run (same command line, same seed), shared by the module's tests."""
    root = tmp_path_factory.mktemp("reference")
    run_to_end(command(tiny_model, shards, root / "run"), root / "record")
    return root / "run", root / "record"


@pytest.fixture(scope="module")
def killed_single(tiny_model, shards, tmp_path_factory) -> dict:
    """A run mirrored to a file:// URL, killed once checkpoint-4 is complete locally and in the
    mirror; `mirror_at_kill` is a copy of the mirror as the kill left it."""
    root = tmp_path_factory.mktemp("killed")
    out, record, mirror = root / "run", root / "record", root / "mirror"
    argv = command(tiny_model, shards, out, f"file://{mirror}")
    run_and_kill_when_held(argv, record, 1, lambda: complete(out, HOLD) and complete(mirror, HOLD))
    shutil.copytree(mirror, root / "mirror_at_kill")
    return {"argv": argv, "out": out, "record": record, "mirror": mirror, "mirror_at_kill": root / "mirror_at_kill"}


def half_written_copy(checkpoint: Path, step: int) -> Path:
    """checkpoint-N as a job killed while saving it leaves it: weights and trainer state written,
    no optimizer state, no completeness marker."""
    partial = checkpoint.parent / f"checkpoint-{step}"
    shutil.copytree(checkpoint, partial)
    (partial / "optimizer.pt").unlink()
    (partial / COMPLETE_MARKER).unlink()
    return partial


@pytest.mark.spawn
def test_single_process_killed_after_its_second_save_resumes_exactly(reference_single, killed_single, tmp_path):
    out, record = killed_single["out"], killed_single["record"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    half_written_copy(out / f"checkpoint-{HOLD}", HOLD + 2)  # died while writing checkpoint-6,
    with open(out / "metrics.jsonl", "a") as fh:  # having logged steps 5 and 6
        fh.write("".join(json.dumps({"step": step, "loss": 99.0, "learning_rate": 0.0}) + "\n" for step in (5, 6)))
    resumed_record = tmp_path / "resumed-record"
    proc = run_to_end(killed_single["argv"], resumed_record)  # the same command line, as a scheduler re-runs it
    assert "skipping checkpoint-6" in proc.stderr and "no rufus_complete.json" in proc.stderr
    assert f"continuing from {out / f'checkpoint-{HOLD}'}" in " ".join(proc.stderr.split())
    assert_resumed_exactly(*reference_single, out, record, resumed_record, "1 process", 1)
    # the mirror got every later checkpoint and keeps save_total_limit of them, each complete
    mirror = killed_single["mirror"]
    assert sorted(p.name for p in mirror.iterdir()) == ["checkpoint-6", "checkpoint-8"]
    assert complete(mirror, 6) and complete(mirror, 8)
    run = json.loads((out / "run.json").read_text())
    assert run["checkpoint_mirror"]["copied"] == [6, 8] and run["checkpoint_mirror"]["failed"] == {}


@pytest.mark.spawn
def test_the_mirror_restores_a_run_into_an_empty_output_dir(reference_single, killed_single, tiny_model, shards,
                                                             tmp_path, monkeypatch, one_torch_thread):
    """A new machine after a preemption: nothing in output_dir, the checkpoints in the mirror
    (here memory://, filled with what the killed run had mirrored); `latest` restores
    checkpoint-4 and the run ends as the uninterrupted one did."""
    fs = fsspec.filesystem("memory")
    fs.put(str(killed_single["mirror_at_kill"]), "/preempted", recursive=True)
    try:
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/preempted", detail=False)) == ["checkpoint-2", "checkpoint-4"]
        record, out = tmp_path / "record", tmp_path / "new-machine"
        monkeypatch.setenv("RUFUS_TEST_HOOKS", "resume_hooks")
        monkeypatch.setenv(RECORD, str(record))
        monkeypatch.delenv(HOLD_AT, raising=False)
        config = tiny_config("sft", shards, out, model=tiny_model, max_rows=None, max_steps=STEPS,
                             save_steps=SAVE_STEPS, max_length=96, resume_from_checkpoint=LATEST,
                             checkpoint_mirror="memory://preempted", trainer={"save_total_limit": KEEP})
        result = run_stage(config)
        assert result.global_step == STEPS
        run = json.loads((out / "run.json").read_text())
        assert run["resumed_from"] == str(out / f"checkpoint-{HOLD}")  # restored from the mirror, then resumed from
        assert run["checkpoint_mirror"]["copied"] == [6, 8]  # checkpoint-4 was there already
        reference, ref_record = reference_single
        resumed = steps_rows(record)
        assert [s for s, _ in resumed[0]] == list(range(HOLD + 1, STEPS + 1))
        assert resumed[0] == [b for b in steps_rows(ref_record)[0] if b[0] > HOLD]
        # metrics.jsonl, rebuilt from the restored checkpoint, then continued: every step once
        assert [m["step"] for m in logged(out)] == list(range(1, STEPS + 1))
        assert [(m["learning_rate"], m["loss"]) for m in logged(out)] == [
            (m["learning_rate"], m["loss"]) for m in logged(reference)]
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/preempted", detail=False)) == ["checkpoint-6", "checkpoint-8"]
    finally:
        fs.rm("/preempted", recursive=True)


# ------------------------------------------------------------------ two processes (DDP, gloo)


@pytest.mark.spawn
@pytest.mark.distributed
def test_two_processes_killed_after_their_second_save_resume_exactly(tiny_model, shards, tmp_path):
    reference, ref_record = tmp_path / "reference", tmp_path / "reference-record"
    run_to_end(command(tiny_model, shards, reference, processes=2), ref_record)
    out, record, mirror = tmp_path / "run", tmp_path / "record", tmp_path / "mirror"
    argv = command(tiny_model, shards, out, str(mirror), processes=2)  # the mirror as a plain folder
    run_and_kill_when_held(argv, record, 2, lambda: complete(out, HOLD) and complete(mirror, HOLD))
    marker = json.loads((out / f"checkpoint-{HOLD}" / COMPLETE_MARKER).read_text())
    assert marker["world_size"] == 2 and {"rng_state_0.pth", "rng_state_1.pth"} <= set(marker["files"])
    resumed_record = tmp_path / "resumed-record"
    run_to_end(argv, resumed_record)
    assert_resumed_exactly(reference, ref_record, out, record, resumed_record, "2 processes (DDP, gloo)", 2)
    assert sorted(p.name for p in mirror.iterdir()) == ["checkpoint-6", "checkpoint-8"]


# ------------------------------------------------------------------ what `latest` accepts (no more training)


@pytest.mark.spawn  # the reference run's checkpoints
def test_latest_skips_half_written_and_half_copied_checkpoints(reference_single, tmp_path):
    local = local_storage()
    run = tmp_path / "run"
    shutil.copytree(reference_single[0] / f"checkpoint-{STEPS - 2}", run / "checkpoint-6")
    assert checkpoint_problem(local, str(run / "checkpoint-6")) is None
    half_written_copy(run / "checkpoint-6", 8)
    copied = run / "checkpoint-10"  # a copy cut short: the marker made it, the weights only in part
    shutil.copytree(run / "checkpoint-6", copied)
    weights = copied / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert "half-copied" in checkpoint_problem(local, str(copied))
    assert resume_checkpoint(LATEST, run, None) == str(run.resolve() / "checkpoint-6")
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-6"]  # the partial ones are gone
    half_written_copy(run / "checkpoint-6", 12)
    with pytest.raises(RufusError, match="no rufus_complete.json"):  # named explicitly, still refused
        resume_checkpoint(str(run / "checkpoint-12"), run, None)


@pytest.mark.spawn  # the reference run's checkpoints
def test_latest_without_a_checkpoint_starts_fresh_and_markerless_checkpoints_are_judged_by_their_files(
        reference_single, tmp_path, capsys):
    assert resume_checkpoint(LATEST, tmp_path / "empty", str(tmp_path / "no-mirror")) is None
    assert "no complete checkpoint" in capsys.readouterr().err
    legacy = tmp_path / "legacy"  # written by transformers alone: no marker anywhere, judged by its files
    shutil.copytree(reference_single[0] / "checkpoint-8", legacy / "checkpoint-8")
    (legacy / "checkpoint-8" / COMPLETE_MARKER).unlink()
    assert resume_checkpoint(LATEST, legacy, None) == str(legacy.resolve() / "checkpoint-8")
    (legacy / "checkpoint-8" / "optimizer.pt").unlink()
    assert "no optimizer state" in checkpoint_problem(local_storage(), str(legacy / "checkpoint-8"), False)


def test_resume_and_mirror_settings_are_checked_before_anything_loads(tmp_path):
    with pytest.raises(RufusError, match="checkpoint_mirror 'nosuch://bucket/run': fsspec cannot open it"):
        guards.check_resume(str(tmp_path), LATEST, "nosuch://bucket/run")
    with pytest.raises(RufusError, match="is output_dir itself"):
        guards.check_resume(str(tmp_path), LATEST, f"file://{tmp_path}")
    with pytest.raises(RufusError, match="is not a folder"):
        guards.check_resume(str(tmp_path), str(tmp_path / "checkpoint-3"), None)


# ------------------------------------------------------------------ the mirror's copier


def fake_checkpoint(out: Path, step: int, extra: dict[str, str] | None = None) -> Path:
    """The files a LoRA checkpoint holds (tiny contents), marked complete."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
                 *(extra or {})):
        (folder / name).write_text((extra or {}).get(name, f"{name} of step {step}"))
    assert mark_complete(folder, step, 1) == []
    return folder


def test_mirror_rotates_removes_killed_copies_and_reports_failures(tmp_path, monkeypatch, capsys):
    fs = fsspec.filesystem("memory")
    fs.makedirs("/rotating/checkpoint-1.tmp-999", exist_ok=True)  # a copy a killed job left behind
    fs.pipe_file("/rotating/checkpoint-1.tmp-999/optimizer.pt", b"x")
    try:
        mirror = Mirror("memory://rotating")
        mirror.start(tmp_path, save_total_limit=2)
        for step in (1, 2, 3, 4):
            mirror.submit(fake_checkpoint(tmp_path, step), step, protect="checkpoint-1")
        report = mirror.finish(timeout_s=60)
        assert report == {"location": "memory://rotating", "copied": [1, 2, 3, 4], "failed": {}, "pending": []}
        # save_total_limit 2: the newest two, and checkpoint-1 kept as the best; the killed copy is gone
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/rotating", detail=False)) == [
            "checkpoint-1", "checkpoint-3", "checkpoint-4"]
        assert not any((tmp_path / "_mirror_staging").iterdir())  # the snapshots went once copied

        broken = Mirror("memory://rotating")
        monkeypatch.setattr(broken.fs, "put_file", lambda *a, **k: (_ for _ in ()).throw(OSError("quota exceeded")))
        broken.start(tmp_path, save_total_limit=2)
        broken.submit(fake_checkpoint(tmp_path, 5), 5)
        assert broken.finish(timeout_s=60)["failed"] == {5: "OSError: quota exceeded"}
        assert "checkpoint-5 failed (OSError: quota exceeded)" in " ".join(capsys.readouterr().err.split())
        assert checkpoint_problem(fs, "/rotating/checkpoint-4") is None
    finally:
        fs.rm("/rotating", recursive=True)


def test_the_rollout_state_of_async_grpo_comes_back_from_the_mirror(tmp_path):
    fs = fsspec.filesystem("memory")
    try:
        mirror = Mirror("memory://async-run")
        mirror.start(tmp_path / "machine-a", save_total_limit=None)
        state = json.dumps({"prompt_index": 37, "model_version": 5})
        mirror.submit(fake_checkpoint(tmp_path / "machine-a", 6, {"rollout_state.json": state}), 6)
        assert mirror.finish(timeout_s=60)["copied"] == [6]
        restored = resume_checkpoint(LATEST, tmp_path / "machine-b", "memory://async-run")
        assert restored == str(tmp_path / "machine-b" / "checkpoint-6")
        rollout = read_rollout_state(restored, dataset_rows=32)
        assert (rollout.prompt_index, rollout.model_version, rollout.start_row) == (37, 5, 5)
    finally:
        fs.rm("/async-run", recursive=True)


# ------------------------------------------------------------------ checksums: same-size damage is refused


def test_same_size_damage_or_an_edited_trainer_state_is_refused_naming_the_file(tmp_path):
    """The probe: a checkpoint whose weights took same-size damage, or whose trainer_state.json
    was edited (global_step 12 -> 99), looked complete by its sizes and resumed silently. Each is
    refused now, naming the file and what to do, and left where it is; an intact one resumes."""
    out = tmp_path / "run"
    state = json.dumps({"global_step": 12, "max_steps": 20})
    folder = fake_checkpoint(out, 12, {"trainer_state.json": state})
    marker = json.loads((folder / COMPLETE_MARKER).read_text())["files"]
    assert len(marker["trainer_state.json"]["sha256"]) == 64  # each file's checksum recorded when saved
    assert resume_checkpoint(LATEST, out, None) == str(out.resolve() / "checkpoint-12")

    weights = folder / "adapter_model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(bytes([intact[0] ^ 1]) + intact[1:])  # one bit flipped, same size
    assert checkpoint_problem(local_storage(), str(folder)) is None  # the sizes still match
    for resume in (LATEST, str(folder)):
        with pytest.raises(RufusError, match=r"adapter_model.safetensors does not match the sha256") as refused:
            resume_checkpoint(resume, out, None)
        assert "--overwrite" in str(refused.value) and "Move checkpoint-12 out of the run folder" in str(refused.value)
    assert folder.is_dir()  # refused, never removed

    weights.write_bytes(intact)
    (folder / "trainer_state.json").write_text(state.replace("12", "99", 1))  # global_step 12 -> 99, same size
    with pytest.raises(RufusError, match=r"trainer_state.json does not match the sha256"):
        resume_checkpoint(LATEST, out, None)


def test_a_damaged_copy_in_the_mirror_is_not_restored(tmp_path):
    fs = fsspec.filesystem("memory")
    try:
        fs.put(str(fake_checkpoint(tmp_path / "machine-a", 4)), "/damaged/checkpoint-4", recursive=True)
        fs.pipe_file("/damaged/checkpoint-4/optimizer.pt", b"X" + fs.cat_file("/damaged/checkpoint-4/optimizer.pt")[1:])
        with pytest.raises(RufusError, match=r"mirror's /damaged/checkpoint-4/optimizer.pt does not match the sha256"):
            resume_checkpoint(LATEST, tmp_path / "machine-b", "memory://damaged")
        assert not any((tmp_path / "machine-b").glob("checkpoint-4*"))  # nothing restored, nothing half there
    finally:
        fs.rm("/damaged", recursive=True)
