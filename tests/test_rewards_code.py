"""Code-execution reward on real HumanEval / MBPP, stdin/stdout cases, and hostile completions whose
containment the tests observe from outside (files, sockets, processes, output, time)."""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import read_jsonl

from rufus_data.rewards import (
    CodeExecutionReward,
    SandboxConfig,
    build_reward,
    namespaces_available,
    run_many,
    run_program,
)
from rufus_data.rewards.code_execution import _humaneval_source, extract_code
from rufus_data.rewards.sandbox import sandbox_uids

REPO = Path(__file__).resolve().parents[1]
WORKERS = 4  # runs are partly latency-bound (namespace set-up), so 4 keep 2 cores busy

# A copy of a HumanEval solution whose return value is wrong (the code still runs: no syntax error).
WRONG_RETURN = '''
def _rufus_wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "#"
    if isinstance(value, list):
        return value + [None]
    if isinstance(value, tuple):
        return value + (None,)
    return "wrong"
_rufus_original = {ep}
def {ep}(*args, **kwargs):
    return _rufus_wrong(_rufus_original(*args, **kwargs))
'''


def test_namespaces_are_used_here():
    """This machine supports unshare: the sandbox must not silently fall back to rlimits."""
    assert namespaces_available()
    assert run_program("print(1)").isolation == "namespaces"


@pytest.mark.spawn
def test_humaneval_canonical_pass_and_wrong_returns_fail_on_assertion(data_root):
    rows = read_jsonl(data_root / "humaneval" / "HumanEval.jsonl")
    assert len(rows) == 164
    reward = CodeExecutionReward(workers=WORKERS)
    columns = {"test": [r["test"] for r in rows], "entry_point": [r["entry_point"] for r in rows]}
    good = [f"Here is my solution:\n```python\n{r['prompt']}{r['canonical_solution']}\n```\nDone." for r in rows]
    assert reward(completions=good, **columns) == [1.0] * 164
    wrong = [r["prompt"] + r["canonical_solution"] + WRONG_RETURN.format(ep=r["entry_point"]) for r in rows]
    few = {key: values[:24] for key, values in columns.items()}
    assert reward(completions=wrong[:24], **few) == [0.0] * 24
    # and every one of the 164 fails on an assertion of the test, not on some other error
    programs = [(_humaneval_source(code, r["test"], r["entry_point"]), None) for code, r in zip(wrong, rows)]
    results = run_many(programs, SandboxConfig(), workers=WORKERS)
    last_lines = [res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "" for res in results]
    not_assertion = [(r["task_id"], line) for r, line in zip(rows, last_lines) if not line.startswith("AssertionError")]
    assert not_assertion == []


def test_prompt_imports_go_before_the_answers_code(data_root):
    """HumanEval prompts import `typing` etc.; an answer that repeats only the function lacks those
    imports. `prompt_imports` puts the import lines of the prompt the model saw before the code."""
    rows = [r for r in read_jsonl(data_root / "humaneval" / "HumanEval.jsonl") if "from typing import" in r["prompt"]][:6]
    assert len(rows) == 6
    # the function alone (the prompt minus its import lines) plus the canonical body
    answers = ["```python\n" + "\n".join(line for line in r["prompt"].splitlines() if not line.startswith(("import ", "from ")))
               + "\n" + r["canonical_solution"] + "```" for r in rows]
    columns = {"test": [r["test"] for r in rows], "entry_point": [r["entry_point"] for r in rows]}
    chat_prompts = [[{"role": "user", "content": f"Complete:\n```python\n{r['prompt']}```"}] for r in rows]
    assert CodeExecutionReward(workers=WORKERS)(prompts=chat_prompts, completions=answers, **columns) == [0.0] * 6
    reward = build_reward({"name": "code_execution", "workers": WORKERS, "prompt_imports": True})
    assert reward(prompts=chat_prompts, completions=answers, **columns) == [1.0] * 6
    assert reward(prompts=[r["prompt"] for r in rows], completions=answers, **columns) == [1.0] * 6  # plain text


@pytest.mark.spawn
def test_mbpp_reference_solutions_pass(data_root):
    rows = read_jsonl(data_root / "mbpp_sanitized" / "sanitized-mbpp.jsonl")
    assert len(rows) == 427
    reward = CodeExecutionReward(workers=WORKERS)
    scores = reward(completions=[r["code"] for r in rows], test_list=[r["test_list"] for r in rows],
                    test_imports=[r["test_imports"] for r in rows])
    assert [r["task_id"] for r, s in zip(rows, scores) if s != 1.0] == []


def test_mbpp_pass_fraction_and_early_exit_does_not_pass():
    reward = CodeExecutionReward(workers=WORKERS, pass_fraction=True)
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 1"]
    code = "def add(a, b):\n    return a + b"
    cheat = "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)"
    assert reward(completions=[code, cheat], test_list=[tests, tests]) == [pytest.approx(2 / 3), 0.0]
    strict = CodeExecutionReward(workers=WORKERS)
    assert strict(completions=[code, cheat, code.replace("+", "-")], test_list=[tests[:2]] * 3) == [1.0, 0.0, 0.0]


def test_pass_fraction_with_a_single_assert():
    reward = CodeExecutionReward(workers=WORKERS, pass_fraction=True)
    code = "def add(a, b):\n    return a + b"
    assert reward(completions=[code, code.replace("+", "-")], test_list=[["assert add(1, 2) == 3"]] * 2) == [1.0, 0.0]


# Reads every file it can reach (its own program, its arguments, /proc/self/{cmdline,environ}, every
# inherited descriptor), prints every marker-like token it finds (bare and with ":i" suffixes, the
# pass_fraction form), and exits 0 before any test runs. It scored 1.0 when the marker was written
# into the program's source.
MARKER_THIEF = r'''
import os, re, sys
def add(a, b):
    return 0
found = set()
paths = list(sys.argv) + ["/proc/self/cmdline", "/proc/self/environ"]
paths += ["/proc/self/fd/" + fd for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
for path in paths:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError):
        continue
    found.update(re.findall(rb"RUFUS-PASS-[0-9a-f]+", data))
    found.update(re.findall(rb"(?<![0-9a-zA-Z])[0-9a-f]{16,64}(?![0-9a-zA-Z])", data))
for token in found:
    os.write(1, b"\n" + token + b"\n" + b"".join(token + b":%d\n" % i for i in range(10)))
os.write(1, b"\nread %d files\n" % len(paths))
os._exit(0)
'''


def test_completion_reading_its_own_program_cannot_forge_the_pass_marker():
    good = "def add(a, b):\n    return a + b"
    humaneval = {"test": ["def check(candidate):\n    assert candidate(1, 2) == 3\n"] * 2, "entry_point": ["add"] * 2}
    mbpp = {"test_list": [["assert add(1, 2) == 3", "assert add(2, 2) == 4"]] * 2}
    strict = CodeExecutionReward(workers=2)
    fraction = CodeExecutionReward(workers=2, pass_fraction=True)
    assert strict(completions=[MARKER_THIEF, good], **humaneval) == [0.0, 1.0]
    assert strict(completions=[MARKER_THIEF, good], **mbpp) == [0.0, 1.0]
    assert fraction(completions=[MARKER_THIEF, good], **mbpp) == [0.0, 1.0]
    # the thief did run (and read its files) in the harness
    job = strict.jobs_for(0, MARKER_THIEF, {"test_list": mbpp["test_list"][0]})[0]
    result = run_many([job.sandbox_job()], strict.sandbox_config)[0]
    assert result.returncode == 0 and "read " in result.stdout and job.marker not in result.stdout


def test_stdin_stdout_cases_and_none_rules():
    reward = CodeExecutionReward(workers=WORKERS, pass_fraction=True)
    program = "```python\nn = int(input())\nprint(n * 2)\n```"
    apps = {"inputs": ["2\n", "5\n", "7\n"], "outputs": ["4\n", "10\n", "15\n"]}
    lcb = '[{"input": "3\\n", "output": "6\\n", "testtype": "stdin"}]'
    scores = reward(completions=[program, program, "<think>```python\nprint(1)\n```", "print(1)"],
                    input_output=[apps, None, None, None], test_cases=[None, lcb, lcb, None])
    assert scores == [pytest.approx(2 / 3), 1.0, 0.0, None]  # no tests at all: None


def test_extract_code_prefers_last_python_block():
    text = "```bash\nls\n```\n```python\nx = 1\n```\nthen\n```python\nx = 2\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("def f(): pass") == "def f(): pass"


# ------------------------------------------------------------------ hostile completions

HOSTILE = SandboxConfig(timeout_s=2.0, cpu_s=1, memory_mb=256, max_processes=32, max_output_bytes=1 << 20)
SLACK_S = 3.0  # process start + kill, on a loaded 2-core machine


def _hostile_reward():
    """The reward with the hostile limits (its CPU limit equals its wall limit)."""
    return CodeExecutionReward(workers=1, timeout_s=HOSTILE.timeout_s, memory_mb=HOSTILE.memory_mb)


def _score_mbpp(code: str) -> tuple[float, float]:
    start = time.monotonic()
    score = _hostile_reward()(completions=[code], test_list=[["assert solve() == 1"]])[0]
    return score, time.monotonic() - start


def _bound_s() -> float:
    """The wall limit, plus the slack, plus what a benign program costs through the same reward
    right now: on a busy machine starting and ending a sandbox takes longer, the limit does not."""
    benign = _score_mbpp("def solve():\n    return 1")
    assert benign[0] == 1.0
    return HOSTILE.timeout_s + SLACK_S + benign[1]


def _sandbox_processes() -> list[int]:
    """Processes on this machine running as a sandbox uid of this test process (its block of 64:
    another test session running beside this one has sandboxes of its own)."""
    own = sandbox_uids()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                uid = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if uid in own:
            found.append(int(entry))
    return found


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_infinite_loop_is_stopped_within_its_limit():
    score, took = _score_mbpp("def solve():\n    return 1\nwhile True:\n    pass")
    assert score == 0.0 and took < _bound_s()
    result = run_program("while True:\n    pass", config=HOSTILE)  # the 1 s CPU limit, or the wall limit
    assert (result.timed_out or result.returncode != 0) and result.wall_s < _bound_s()


def test_fork_bomb_is_contained_and_leaves_nothing():
    bomb = "import os\ndef solve():\n    return 1\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    score, took = _score_mbpp(bomb)
    assert score == 0.0 and took < _bound_s()
    time.sleep(0.2)
    assert _sandbox_processes() == []


def test_process_count_limit_stops_a_fork_loop():
    code = (
        "import os, time\nchildren = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as error:\n        print('refused', error.errno, flush=True)\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    children += 1\n"
        "print('children', children, flush=True)\n"
    )
    result = run_program(code, config=HOSTILE)
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert lines["refused"] == "11", result  # EAGAIN: RLIMIT_NPROC
    assert 1 <= int(lines["children"]) <= HOSTILE.max_processes, result
    time.sleep(0.2)
    assert _sandbox_processes() == []


def test_cpu_limit_kills_before_the_wall_limit():
    """The CPU limit, not the wall clock, stops a busy loop: the wall limit is far above what one
    CPU second takes even on a loaded machine (there the loop gets a share of a core, and a
    3-second wall bound raced the load), so the CPU limit is what fired."""
    config = SandboxConfig(timeout_s=120.0, cpu_s=1, memory_mb=256)
    result = run_program("while True:\n    pass", config=config)
    assert not result.timed_out and result.returncode not in (0, None), result
    assert result.wall_s < config.timeout_s, result


def test_memory_bomb_hits_the_address_space_limit():
    # a wall limit far above the allocations' time: on a loaded machine the MemoryError's exit
    # raced a 2 s wall limit (timed_out), and the address-space limit is what this checks
    config = dataclasses.replace(HOSTILE, timeout_s=120.0)
    result = run_program("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2 ** 20))", config=config)
    assert result.returncode != 0 and "MemoryError" in result.stderr and not result.timed_out
    score, took = _score_mbpp("def solve():\n    return 1\nx = bytearray(4 * 1024 ** 3)")
    assert score == 0.0 and took < _bound_s()


def test_writes_outside_the_scratch_dir_do_not_survive():
    tmp_dir = Path(tempfile.mkdtemp(prefix="rufus-sentinel-", dir="/tmp"))
    repo_dir = Path(tempfile.mkdtemp(prefix=".rufus-sentinel-", dir=REPO))
    try:
        for folder in (tmp_dir, repo_dir):
            folder.chmod(0o777)  # world-writable: only the sandbox stands between the code and the folder
        targets = [str(tmp_dir / "sentinel"), str(repo_dir / "sentinel"), "/dev/shm/rufus-sentinel"]
        code = (
            "def solve():\n    return 1\n"
            f"for path in {targets!r}:\n"
            "    try:\n        open(path, 'w').write('escaped')\n        print('wrote', path)\n"
            "    except OSError as error:\n        print('refused', path, error)\n"
            "open('scratch.txt', 'w').write('fine')\n"
            "assert False, 'score 0'\n"
        )
        result = run_program(code, config=HOSTILE)
        # the host folders are unreachable; /dev/shm is the sandbox's own tmpfs (writable, gone afterwards)
        assert result.stdout.count("refused") == 2 and "wrote /dev/shm" in result.stdout, result.stdout
        assert "score 0" in result.stderr  # the run went on: the scratch dir itself is writable
        assert _score_mbpp(code)[0] == 0.0
        assert [p for p in targets if os.path.exists(p)] == []
    finally:
        for folder in (tmp_dir, repo_dir):
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()


def test_sandboxed_code_sees_only_its_private_root(data_root):
    """No host file is there to read: not the data root's benchmark answers, the checkout, /etc
    or /root (issue #47, item 15); the interpreter's files are read-only."""
    secrets = [str(data_root / "gsm8k" / "test.jsonl"), str(REPO / "README.md"), "/etc/passwd", "/root", "/run"]
    assert all(os.path.exists(path) for path in secrets[:3])  # they are there for an ordinary process
    code = (
        "import os\n"
        f"print(sorted(os.listdir('/')))\nprint([p for p in {secrets!r} if os.path.exists(p)])\n"
        "try:\n    open('/usr/escaped', 'w')\nexcept OSError as error:\n    print(error.strerror)\n"
    )
    result = run_program(code, config=HOSTILE)
    assert result.returncode == 0, result.stderr
    listing, found, write = result.stdout.splitlines()
    assert set(eval(listing)) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "proc", "dev", "tmp"}
    assert found == "[]" and write == "Read-only file system"


def test_network_is_unreachable_from_the_sandbox():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    received = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            received.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        # the listener works for an ordinary process (so the test could fail)
        with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
            probe.sendall(b"probe")
        deadline = time.monotonic() + 2
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert received == [b"probe"]
        received.clear()
        code = (
            "import socket\ndef solve():\n    return 1\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'leak')\n"
        )
        assert _score_mbpp(code)[0] == 0.0
        result = run_program(code, config=HOSTILE)
        assert "Network is unreachable" in result.stderr or "Connection refused" in result.stderr
        time.sleep(0.3)
        assert received == []
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()


def test_planted_secret_does_not_come_back(monkeypatch):
    secret = "rufus-secret-" + os.urandom(6).hex()
    monkeypatch.setenv("RUFUS_TEST_SECRET", secret)
    code = (
        "import os, glob\n"
        "print(os.environ.get('RUFUS_TEST_SECRET'))\nprint(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n        print(open(path, 'rb').read())\n    except OSError as error:\n        print(error)\n"
    )
    result = run_program(code, config=HOSTILE)
    assert result.returncode == 0 and "None" in result.stdout
    assert secret not in result.stdout + result.stderr


def test_sigterm_ignoring_process_is_killed():
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ndef solve():\n    return 1\nwhile True:\n    time.sleep(1)"
    score, took = _score_mbpp(code)
    assert score == 0.0 and took < _bound_s()
    assert _sandbox_processes() == []


def test_setsid_child_does_not_survive_the_run():
    marker = "rufus-orphan-" + os.urandom(4).hex()
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'], start_new_session=True)\n"
        "print('spawned', flush=True)\n"
    )
    result = run_program(code, config=HOSTILE)
    assert result.returncode == 0 and "spawned" in result.stdout
    time.sleep(0.3)
    assert _processes_with(marker) == []
    assert _score_mbpp(code)[0] == 0.0  # no solve(): fails, and still leaves nothing behind
    time.sleep(0.3)
    assert _processes_with(marker) == [] and _sandbox_processes() == []


def test_100_mb_of_output_is_capped():
    code = "import sys\nchunk = 'x' * 1_000_000\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
    # the cap, not the clock, must end it: HOSTILE's 2 s wall limit raced a loaded machine
    patient = dataclasses.replace(HOSTILE, timeout_s=60.0)
    result = run_program(code, config=patient)
    assert result.output_truncated and len(result.stdout) <= HOSTILE.max_output_bytes
    assert not result.timed_out and result.wall_s < patient.timeout_s, result.wall_s
    metrics = {}
    reward = CodeExecutionReward(workers=1, timeout_s=patient.timeout_s, memory_mb=HOSTILE.memory_mb)
    assert reward(completions=["def solve():\n    return 1\n" + code], test_list=[["assert solve() == 1"]],
                  log_metric=metrics.__setitem__) == [0.0]
    assert metrics["code_execution/output_capped"] == 1.0


def test_rlimits_fallback_is_reported_and_still_limits(monkeypatch):
    import warnings

    from rufus_data.rewards import sandbox

    limited = SandboxConfig(isolation="rlimits", memory_mb=256)
    result = run_program("x = bytearray(2 * 1024 ** 3)", config=limited)
    assert result.isolation == "rlimits" and "MemoryError" in result.stderr  # the address-space limit holds
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    monkeypatch.setitem(sandbox._probe, "warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_program("import os\nopen('x', 'w').write('1')\nprint('ran in', os.getcwd())", config=SandboxConfig())
    assert result.isolation == "rlimits" and result.stdout.startswith("ran in /tmp/rufus-sandbox-"), result
    assert not os.path.exists(result.stdout.split()[-1])  # the scratch folder is removed afterwards
    assert any("falling back to rlimits only" in str(w.message) for w in caught)


def test_rlimits_fallback_as_root_still_kills_setsid_children():
    assert os.geteuid() == 0, "CI and the dev machines run as root; this checks the root-only uid sweep"
    marker = "rufus-fallback-orphan-" + os.urandom(4).hex()
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'], start_new_session=True)\n"
        "print('spawned', flush=True)\n"
    )
    result = run_program(code, config=SandboxConfig(isolation="rlimits"))
    assert result.stdout == "spawned\n" and result.isolation == "rlimits"
    time.sleep(0.3)
    assert _processes_with(marker) == []
