"""Start a vLLM OpenAI-compatible server as a separate process, wait until it answers, and
always stop it.

The server runs in its own process session (`start_new_session`), so stopping it is one
`os.killpg` that reaches the API server and every engine/worker process it forked. It is
stopped on the normal path (`stop()` / leaving the `with` block), on exceptions, from an
`atexit` hook, and - on Linux - by the kernel if the Python process that started it dies
(PR_SET_PDEATHSIG), so a SIGKILLed run does not leave a server behind. The command line and
environment come from vllm_command.py.

Used by `rufus-data filter/pairs --backend vllm` and by checkpoint evaluation."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from rufus_data.base.errors import RufusError
from rufus_data.base.ports import free_port
from rufus_data.generate.vllm_command import LaunchConfig, server_command
from rufus_data.models.openai_api import GaveUp, RetryPolicy, capped, checked, started_here, sync_client


class VLLMServer:
    """A running server: `base_url`, `model` (the served name); `stop()` is idempotent."""

    def __init__(self, config: LaunchConfig):
        self.config = dataclasses.replace(config, port=config.port or free_port())
        self.model = self.config.name
        self.port = self.config.port
        self.base_url = f"http://{config.host}:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log_path = Path(config.log_path or tempfile.mkstemp(prefix="rufus-vllm-", suffix=".log")[1])
        self._log = None

    # --- starting ---------------------------------------------------------------------------
    def argv(self) -> list[str]:
        return server_command(self.config)[1]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **server_command(self.config)[0]}

    def start(self) -> VLLMServer:
        argv = self.argv()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - stays open for the server's lifetime
        try:
            self.process = subprocess.Popen(
                argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
                # only prctl(); launch() runs before the generators start their threads
                preexec_fn=die_with_parent(),  # noqa: PLW1509
            )
        except OSError as err:
            self._log.close()
            raise RufusError(f"could not start the vLLM server `{shlex.join(argv)}`: {err}") from None
        _RUNNING.add(self)
        started_here(self.base_url)  # reached directly, never through a proxy
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Poll GET /v1/models until it answers 200, the process dies, or the timeout passes (the
        shared retry policy, with no count of attempts: the timeout bounds them)."""
        poll = RetryPolicy(attempts=None, backoff_s=0.25, max_backoff_s=2.0, total_s=self.config.ready_timeout_s)
        with sync_client([self.base_url], timeout_s=5.0) as client:

            def ask(left_s: float) -> None:
                if self.process.poll() is not None:
                    raise RufusError(
                        f"the vLLM server exited with code {self.process.returncode} before it was ready "
                        f"(`{shlex.join(self.argv())}`); its log {self.log_path} ends with:\n{self.log_tail()}"
                    )
                checked(client.get(f"{self.base_url}/v1/models", timeout=capped(client.timeout, left_s)))

            try:
                poll.call(ask, what=f"the vLLM server at {self.base_url}")
            except GaveUp:
                raise RufusError(
                    f"the vLLM server at {self.base_url} was not ready after {self.config.ready_timeout_s:.0f} s; "
                    f"raise the timeout or read its log {self.log_path}:\n{self.log_tail()}"
                ) from None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # --- stopping ---------------------------------------------------------------------------
    @property
    def pgid(self) -> int | None:
        return self.process.pid if self.process else None  # session leader: pgid == pid

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`."""
        proc, self.process = self.process, None
        _RUNNING.discard(self)
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # the leader may be gone while engine workers linger: make sure the group is empty
        deadline = time.monotonic() + grace_s
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self if self.process else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(config: LaunchConfig) -> VLLMServer:
    """Start a server and return it once it answers; use as `with launch(cfg) as server:`."""
    return VLLMServer(config).start()


# --- process-group helpers ------------------------------------------------------------------
_RUNNING: set[VLLMServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace_s=5.0)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc (Linux); for tests and checks."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def die_with_parent():
    """A `preexec_fn` that asks Linux to SIGTERM the child when its parent dies (even by SIGKILL);
    None elsewhere. prctl is looked up here, in the parent, so that the child, forked from a
    process that may run threads, only calls it."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
