"""The work folder of a suite run, so a crash, an OOM kill or Ctrl-C in task 9 of 10 keeps tasks
1-8 and re-running the same command continues with task 9.

It sits beside the run folder (`.eval-work-<key>` in its parent: outputs/eval by default) and is
keyed by the request: the suite as resolved (overrides applied), the tasks, the model's files
(path, size, modification time), the settings that shape the answers, and the run's --out and
--name when given. A request with another key starts afresh in its own folder; a run whose name
is the default (suite-ckpt-time) takes the name of the attempt that started it. It holds:

    key.json       the key, the run's name and when its first attempt started
    run/           what becomes the run folder: tasks/ (written once, by the first attempt, so every
                   attempt scores the same documents), lm_eval/ (each finished task's files)
    done/T.json    task T's record and pinned judge, written (atomically) once its files are whole

The run folder appears only when every task is done (`finish`: run/ renamed into place), so it is
whole or absent; the work folder is then removed. Locked while a run uses it (filelock: the kernel frees it when the process ends, however it ends)."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.folders.shards import move_into_place, refuse_existing_output

FORMAT = 1  # bump when the layout changes: older work folders then start afresh
KEY_FILE = "key.json"
PREPARED = "prepared.json"


def model_files(model: str) -> list:
    """What identifies a model folder's weights: its top-level files' (name, size, mtime); a served
    model (no folder here) by its name."""
    folder = Path(model)
    if not folder.is_dir():
        return [model]
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()]


def request_key(suite_json: str, tasks: list[str], model: str, settings: dict) -> str:
    text = json.dumps({"format": FORMAT, "suite": suite_json, "tasks": tasks, "model": str(model),
                       "model_files": model_files(model), "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class SuiteWork:
    """An open work folder: where the run is written, and what earlier attempts finished."""

    folder: Path
    run_name: str
    created: str

    @property
    def run(self) -> Path:
        return self.folder / "run"

    def prepared(self) -> dict | None:
        """{lm_names, skipped} of the first attempt's task preparation, None before it finished."""
        path = self.folder / PREPARED
        return json.loads(path.read_text()) if path.exists() else None

    def save_prepared(self, lm_names: dict, skipped: dict) -> None:
        _write_json(self.folder / PREPARED, {"lm_names": lm_names, "skipped": skipped})

    def done(self) -> dict[str, dict]:
        """{task: {record, judge}} of the tasks earlier attempts finished."""
        return {p.stem: json.loads(p.read_text()) for p in sorted((self.folder / "done").glob("*.json"))}

    def task_done(self, name: str, record: dict, judge: dict | None) -> None:
        _write_json(self.folder / "done" / f"{name}.json", {"record": record, "judge": judge})

    def finish(self, out: Path, overwrite: bool) -> None:
        """run/ becomes `out` (replacing an older run folder, with `overwrite`, only now), and the
        work folder goes."""
        out.parent.mkdir(parents=True, exist_ok=True)
        refuse_existing_output(out, overwrite)
        move_into_place(self.run, out, overwrite)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def suite_work(parent: Path, key: str, run_name: str) -> Iterator[SuiteWork]:
    """The work folder of `key` under `parent`, locked for the block, with what earlier attempts
    left (their run name and start time win over `run_name`)."""
    folder = parent / f".eval-work-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RufusError(f"another `rufus-eval suite` with this request is running (it holds {folder}): wait for "
                         "it to finish, or stop it") from None
    with contextlib.ExitStack() as held:
        held.callback(lock.release)
        for leftover in folder.rglob("*.tmp.*"):  # half-written by an attempt that was killed (atomic_file)
            leftover.unlink(missing_ok=True)
        state = _read_state(folder)
        if state is None:  # a fresh start (or a folder of an older layout)
            for path in folder.iterdir():
                if path.name != ".lock":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            state = {"key": key, "run": run_name,
                     "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
            _write_json(folder / KEY_FILE, state)
        (folder / "run").mkdir(exist_ok=True)
        yield SuiteWork(folder, state["run"], state["created"])


def _read_state(folder: Path) -> dict | None:
    try:
        state = json.loads((folder / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and {"key", "run", "created"} <= set(state) and \
        folder.name.endswith(str(state["key"])) else None


def _write_json(path: Path, value: dict) -> None:
    """`value` as JSON under its real name only once whole (paths.atomic_file)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(value, default=str))
