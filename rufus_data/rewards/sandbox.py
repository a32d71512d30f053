"""Run untrusted (model-written) Python in a throwaway sandbox: one fresh process tree per run.

Layers, outermost first (see docs/rewards.md):
1. A separate process, started as an unprivileged uid (one per concurrent slot, when we are root) with a
   scrubbed environment and resource limits: CPU seconds, address space, process count, file size, open
   files, no core dumps.
2. `unshare`: fresh user, PID, network, mount, IPC and UTS namespaces. The network namespace has no
   interface up (nothing is reachable, not even 127.0.0.1 of the host); /proc is remounted for the new
   PID namespace (no other process is visible); the code runs in a private root (pivot_root): /usr and
   the interpreter's prefix read-only, four device nodes, and fresh size-capped tmpfs /tmp (the scratch
   working directory) and /dev/shm. No other host file exists there (not the data root, the checkout,
   /etc or /run's sockets), nothing written survives the run, and no host socket is reachable.
3. A nested user namespace maps the code to uid 65534, so it holds no capability (it cannot undo the
   mounts above).
4. The parent enforces the wall-clock limit and the output cap, and at the end SIGKILLs the namespace's
   init; the kernel then kills every process left in the PID namespace (children that called `setsid`
   included).
When `unshare` cannot create the namespaces, the sandbox falls back to layer 1 plus a process-group kill
(and, as root, killing every process of the run's uid), warns once, and reports `isolation="rlimits"`:
then the code reads every file the sandbox uid may read (every world-readable host file).
"""

from __future__ import annotations

import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rufus_data.base.errors import RufusError

SANDBOX_UID_BASE = 200000  # uids nobody owns: uid = base + (pid % 2048) * 64 + slot
UIDS_PER_PROCESS = 64  # slots 0-62 for programs, 63 for the probe


def sandbox_uids() -> range:
    """This process's block of sandbox uids: its sandboxes run as these, so two processes side by
    side (two test sessions, two commands) never share a uid."""
    first = SANDBOX_UID_BASE + (os.getpid() % 2048) * UIDS_PER_PROCESS
    return range(first, first + UIDS_PER_PROCESS)


@dataclass
class SandboxConfig:
    timeout_s: float = 10.0  # wall clock, from start to the last process killed
    cpu_s: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS (address space)
    max_processes: int = 64  # RLIMIT_NPROC (per sandbox uid)
    max_output_bytes: int = 1 << 20  # stdout + stderr; more kills the run (output_truncated=True)
    max_file_mb: int = 64  # RLIMIT_FSIZE and the size of each tmpfs
    python: str | None = None  # interpreter inside the sandbox; default: one the sandbox uid can run
    python_flags: tuple[str, ...] = ("-I", "-S")  # isolated mode, no site-packages (stdlib only, fast start)
    isolation: str = "auto"  # auto | namespaces | rlimits

    def __post_init__(self):
        if self.isolation not in ("auto", "namespaces", "rlimits"):
            raise RufusError(f"sandbox isolation must be auto, namespaces or rlimits (got {self.isolation!r})")


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    wall_s: float = 0.0
    isolation: str = "namespaces"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated


# ---------------------------------------------------------------- environment probing

_probe_lock = threading.Lock()
_probe: dict[str, object] = {}
_slots_lock = threading.Lock()
_free_slots: list[int] = list(range(UIDS_PER_PROCESS - 1))  # the last slot is the probe's


def _is_root() -> bool:
    return os.geteuid() == 0


def _world_executable(path: str) -> bool:
    """Can an unrelated uid run this file (every folder on the way searchable, the file readable+executable)?"""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        folder = os.sep.join(parts[:i]) or os.sep
        if not os.stat(folder).st_mode & 0o001:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & 0o004 and mode & 0o001)


def sandbox_python(config: SandboxConfig) -> str:
    if config.python:
        return config.python
    if not _is_root():
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.path.exists(candidate) and _world_executable(candidate):
            return os.path.realpath(candidate)
    raise RufusError(
        f"no Python the sandbox uid can run: {sys.executable} sits in a private folder; install a system "
        "python3 (/usr/bin/python3) or set SandboxConfig(python=...)"
    )


def namespaces_available() -> bool:
    """Whether the full namespace sandbox works here (probed once, with a trivial program, as a sandbox uid)."""
    with _probe_lock:
        if "namespaces" not in _probe:
            ok = False
            if shutil.which("unshare"):
                program_fd = _memfd("program", b"print('ok')")
                try:
                    result = subprocess.run(
                        _command(SandboxConfig(), "namespaces", program_fd),
                        capture_output=True, timeout=20, check=False, env={"PATH": "/usr/bin:/bin"},
                        pass_fds=(program_fd,), **_drop_privileges(_probe_uid()),
                    )
                    ok = result.stdout == b"ok\n"
                    _probe["why"] = result.stderr.decode(errors="replace").strip()[-500:]
                except (OSError, subprocess.SubprocessError, RufusError) as error:
                    _probe["why"] = str(error)
                finally:
                    os.close(program_fd)
            _probe["namespaces"] = ok
        return bool(_probe["namespaces"])


def _probe_uid() -> int:
    return sandbox_uids()[-1]


def _drop_privileges(uid: int | None) -> dict:
    if uid is None or not _is_root():
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


def effective_isolation(config: SandboxConfig) -> str:
    if config.isolation == "rlimits":
        return "rlimits"
    if namespaces_available():
        return "namespaces"
    if config.isolation == "namespaces":
        raise RufusError(f"sandbox isolation=namespaces but unshare cannot create namespaces here: {_probe.get('why')}")
    if not _probe.get("warned"):
        warnings.warn(
            "sandbox: unshare cannot create user/PID/network/mount namespaces here "
            f"({_probe.get('why') or 'unshare missing'}); falling back to rlimits only: model code "
            "can reach the network and the file system as the sandbox user",
            RuntimeWarning,
            stacklevel=3,
        )
        _probe["warned"] = True
    return "rlimits"


# ---------------------------------------------------------------- one run


def _acquire_slot() -> int:
    with _slots_lock:
        if not _free_slots:
            raise RufusError("sandbox: more than 63 concurrent runs in one process; lower the worker count")
        return _free_slots.pop()


def _release_slot(slot: int) -> None:
    with _slots_lock:
        _free_slots.append(slot)


def _limits_script(config: SandboxConfig) -> str:
    """dash `ulimit` builtins, one flag each: CPU s, address space KiB, processes, 512-byte file blocks."""
    return (
        f"ulimit -t {max(1, int(config.cpu_s))}; ulimit -v {config.memory_mb << 10}; "
        f"ulimit -p {config.max_processes}; ulimit -f {config.max_file_mb << 11}; ulimit -n 256; ulimit -c 0; "
    )


def _command(config: SandboxConfig, isolation: str, program_fd: int, input_fds: Sequence[int] = ()) -> list[str]:
    python = [sandbox_python(config), *config.python_flags, f"/proc/self/fd/{program_fd}", *map(str, input_fds)]
    if isolation == "rlimits":
        return ["/bin/sh", "-c", "set -e; " + _limits_script(config) + 'exec "$@"', "sandbox", *python]
    size = f"size={config.max_file_mb}m,mode=1777"
    script = (
        # A private root on a tiny tmpfs, holding only what the interpreter needs, read-only (/usr, the
        # /bin and /lib links of the host, the interpreter's own prefix), a fresh /proc, four device
        # nodes, and size-capped tmpfs /tmp (the scratch working directory) and /dev/shm; pivot_root
        # into it and detach the host's tree, so no host file (the data root, the checkout, /etc) is
        # there to read, whatever the code does. Few processes: each start costs about as much CPU as
        # the model's program (measured: bench/rewards_bench.py).
        "set -e; mount -t tmpfs -o size=1m,mode=755 tmpfs /tmp; cd /tmp; mkdir usr proc dev tmp .old; "
        + _host_links_script()
        + "mount -o bind,ro /usr usr; "
        + "".join(f"mkdir -p .{shlex.quote(d)}; mount -o bind,ro {shlex.quote(d)} .{shlex.quote(d)}; "
                  for d in _interpreter_roots(python[0]))
        + "mount -t proc proc proc; mount -t tmpfs -o size=64k,mode=755 tmpfs dev; "
        "touch dev/null dev/zero dev/random dev/urandom; "
        "for d in null zero random urandom; do mount -o bind /dev/$d dev/$d; done; "
        f"mkdir dev/shm; mount -t tmpfs -o {size} tmpfs dev/shm; mount -t tmpfs -o {size} tmpfs tmp; "
        f"{_PIVOT_ROOT} . .old; umount -l /.old; rmdir /.old; cd /tmp; "
        + _limits_script(config)
        + 'exec unshare --user --map-user=65534 --map-group=65534 -- "$@"'
    )
    namespaces = ["unshare", "--user", "--map-root-user", "--pid", "--net", "--mount", "--ipc", "--uts",
                  "--fork", "--kill-child", "--mount-proc", "--"]
    return namespaces + ["/bin/sh", "-c", script, "sandbox", *python]


_PIVOT_ROOT = shutil.which("pivot_root", path="/usr/sbin:/sbin:/usr/bin:/bin") or "/usr/sbin/pivot_root"


def _host_links_script() -> str:
    """The top-level folders the interpreter may need besides /usr (bin, lib, lib64, sbin): the
    host's symlinks into /usr as links, real folders bound read-only."""
    parts = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            parts.append(f"ln -s {shlex.quote(os.readlink(host))} {name}; ")
        elif os.path.isdir(host):
            parts.append(f"mkdir {name}; mount -o bind,ro {host} {name}; ")
    return "".join(parts)


def _interpreter_roots(python: str) -> list[str]:
    """Folders to show read-only besides /usr: the prefix of an interpreter that lives elsewhere
    (a pyenv or conda Python: its stdlib sits beside its binary)."""
    real = os.path.realpath(python)
    if real.startswith("/usr/") or os.path.dirname(os.path.dirname(real)) in ("/", ""):
        return []
    return [os.path.dirname(os.path.dirname(real))]


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # no MFD_CLOEXEC: the sandbox inherits it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the namespace init: the kernel then kills every process in its PID namespace, and `unshare`
    (our direct child) reaps it and exits once they are all gone. Then the process group, for the rlimits
    fallback and for a run killed before its namespace existed."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as handle:
            children = [int(c) for c in handle.read().split()]
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if children:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(
    program: str, stdin: str | None = None, config: SandboxConfig | None = None, inputs: Sequence[bytes] = ()
) -> SandboxResult:
    """Run `program` (Python source) in a fresh sandbox; never raises on what the program does.

    `inputs` reach the program as open file descriptors whose numbers follow the program in `sys.argv`
    (the code-execution harness reads its secret pass marker from one and closes it before running
    model code: see harness.py)."""
    config = config or SandboxConfig()
    isolation = effective_isolation(config)
    slot = _acquire_slot()
    uid = sandbox_uids()[slot]
    program_fd = _memfd("program", program.encode())
    input_fds = [_memfd("input", data) for data in inputs]
    stdin_fd = _memfd("stdin", stdin.encode()) if stdin is not None else None
    scratch = _scratch_dir(isolation, uid)
    start = time.monotonic()
    proc = None
    try:
        proc = subprocess.Popen(
            _command(config, isolation, program_fd, input_fds),
            stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
                 "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"},
            cwd="/" if isolation == "namespaces" else scratch,
            pass_fds=(program_fd, *input_fds),
            start_new_session=True,
            **_drop_privileges(uid),
        )
        for fd in input_fds:  # the child holds its copies; ours must not stay readable at /proc/<parent>/fd
            os.close(fd)
        input_fds = []
        stdout, stderr, timed_out, truncated = _read_output(proc, start + config.timeout_s, isolation,
                                                             config.max_output_bytes)
        returncode = _stop(proc, isolation, uid)
    finally:
        if proc is not None:
            proc.stdout.close()
            proc.stderr.close()
        for fd in (program_fd, *input_fds):
            os.close(fd)
        if isolation == "rlimits":
            shutil.rmtree(scratch, ignore_errors=True)
        if stdin_fd is not None:
            os.close(stdin_fd)
        _release_slot(slot)
    cap = config.max_output_bytes
    return SandboxResult(
        returncode=None if (timed_out or truncated) else returncode,
        stdout=bytes(stdout[:cap]).decode("utf-8", errors="replace"),
        stderr=bytes(stderr[:cap]).decode("utf-8", errors="replace"),
        timed_out=timed_out,
        output_truncated=truncated,
        wall_s=time.monotonic() - start,
        isolation=isolation,
    )


def _scratch_dir(isolation: str, uid: int) -> str:
    """The run's working directory and HOME: /tmp of the namespace (a fresh tmpfs), or in the
    fallback a fresh folder (the run's uid owns it when we are root), removed after the run."""
    if isolation == "namespaces":
        return "/tmp"
    scratch = tempfile.mkdtemp(prefix="rufus-sandbox-")
    if _is_root():
        os.chown(scratch, uid, uid)
    return scratch


def _read_output(proc: subprocess.Popen, deadline: float, isolation: str,
                 max_output_bytes: int) -> tuple[bytearray, bytearray, bool, bool]:
    """The program's stdout and stderr until it closes them, the deadline passes (timed out) or they
    hold more than `max_output_bytes` together (truncated): (stdout, stderr, timed_out, truncated)."""
    stdout, stderr = bytearray(), bytearray()
    timed_out = truncated = False
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, stdout)
        selector.register(proc.stderr, selectors.EVENT_READ, stderr)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            # without a PID namespace an escaped child may hold the pipes open: once our process has
            # exited, take what is already in the pipes and stop
            exited = isolation == "rlimits" and proc.poll() is not None
            for key, _ in selector.select(timeout=0 if exited else min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(stdout) + len(stderr) > max_output_bytes:
                    truncated = True
                    break
            if truncated or (exited and not any(selector.select(timeout=0))):
                break
    return stdout, stderr, timed_out, truncated


def _stop(proc: subprocess.Popen, isolation: str, uid: int) -> int:
    """Kill the program's process tree (and, without a PID namespace, every process of its uid);
    its exit code."""
    _kill_tree(proc)
    if isolation == "rlimits" and _is_root():
        # no PID namespace: kill whatever still runs as this run's uid (a `setsid` child), as that uid
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], check=False, timeout=5, **_drop_privileges(uid))
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        return proc.wait()


def run_many(jobs: Sequence[tuple], config: SandboxConfig | None = None, workers: int = 2) -> list[SandboxResult]:
    """Run (program, stdin) or (program, stdin, inputs) jobs, up to `workers` sandboxes at a time; results in
    job order."""
    config = config or SandboxConfig()
    if not jobs:
        return []
    effective_isolation(config)  # probe (and warn) once, before the threads start
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], config, *job[2:]), jobs))
