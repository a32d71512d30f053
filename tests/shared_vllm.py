"""The vLLM CPU server of the `vllm_server` fixture, and one server for all pytest-xdist workers
(not a test module).

A session-scoped fixture runs once per xdist worker, so each worker would start its own server
(about 4.6 GB and a minute of both cores). Under xdist the workers share one instead: the first to
need it starts it and records it in a JSON file beside the workers' temporary folders, the others
read it there, and the worker that started it stops it once no other live worker holds it (the
launcher ends a server with the process that started it, so that worker waits for the others).
pytest-xdist's `--dist loadgroup` would send every vLLM test to one worker instead, but with
pytest 9.2 it no longer groups anything (pytest-dev/pytest-xdist#1386)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

from rufus_data.generate.launcher import LaunchConfig, VLLMServer, group_members
from rufus_data.generate.vllm_command import cpu_command
from rufus_data.models.builtin import file_lock

RECORD = "vllm_server.json"


def start_server(model: str) -> VLLMServer:
    server = VLLMServer(LaunchConfig(model=model, served_model_name="smollm2-135m", command=cpu_command(), cpu=True,
                                     max_model_len=2048, ready_timeout_s=300))
    return server.start()


def stop_server(server: VLLMServer) -> None:
    pgid = server.pgid
    server.stop()
    assert not group_members(pgid), f"vLLM server processes left behind: {group_members(pgid)}"


@contextlib.contextmanager
def _record(root: Path):
    """The shared server's record, {} when none runs, read and written under a file lock."""
    with file_lock(root / f"{RECORD}.lock"):
        path = root / RECORD
        record = json.loads(path.read_text()) if path.exists() else {}
        yield record
        if record:
            path.write_text(json.dumps(record))
        else:
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def shared_server(root: Path, model: str):
    """Yield the server every worker of this run shares (`.base_url`, `.model`, `.pgid`)."""
    me, started = os.getpid(), None
    with _record(root) as record:
        if not record:
            started = start_server(model)
            record.update(base_url=started.base_url, model=started.model, pgid=started.pgid, users=[])
        record["users"].append(me)
        server = started or SimpleNamespace(base_url=record["base_url"], model=record["model"], pgid=record["pgid"])
    try:
        yield server
    finally:
        while True:
            with _record(root) as record:
                record["users"] = [pid for pid in record["users"] if pid != me and _alive(pid)]
                if started is None or not record["users"]:
                    if started is not None:
                        record.clear()  # a worker that needs a server after this starts a new one
                    break
            time.sleep(1)
        if started is not None:
            stop_server(started)
