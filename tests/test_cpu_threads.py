"""The CLIs' OpenMP defaults on a CPU machine (rufus_data/base/cpu_threads.py): passive waiting and no
more threads than the usable cores, set when the program starts and before torch loads, and
never over what the user set. Their effect is measured in bench/cpu_threads_bench.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rufus_data.base import cpu_threads
from rufus_data.base.cpu_threads import cpu_thread_defaults, usable_cores

CLIS = ("rufus_data.cli", "rufus_train.cli", "rufus_eval.cli")


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_threads, "GPU_DEVICES", (tmp_path / "nvidiactl",))


def test_defaults_fill_only_what_the_user_left_unset(no_gpu):
    cores = usable_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    env: dict[str, str] = {}
    assert cpu_thread_defaults(env) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(cores)}
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(cores)}
    mine = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7"}
    assert cpu_thread_defaults(mine) == {} and mine == {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7"}
    half = {"OMP_NUM_THREADS": "1"}
    assert cpu_thread_defaults(half) == {"OMP_WAIT_POLICY": "PASSIVE"} and half["OMP_NUM_THREADS"] == "1"


def test_threads_are_shared_among_a_launchers_processes_and_capped_by_the_cgroup(no_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: set(range(8)))
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(cpu_threads, "CGROUP_CPU_MAX", quota)
    quota.write_text("max 100000\n")
    assert usable_cores() == 8
    assert cpu_thread_defaults({"LOCAL_WORLD_SIZE": "4"})["OMP_NUM_THREADS"] == "2"
    quota.write_text("300000 100000\n")  # a container limited to 3 CPUs
    assert usable_cores() == 3
    assert cpu_thread_defaults({})["OMP_NUM_THREADS"] == "3"


def test_nothing_is_set_where_a_gpu_is_visible(monkeypatch, tmp_path):
    device = tmp_path / "nvidiactl"
    device.write_text("")
    monkeypatch.setattr(cpu_threads, "GPU_DEVICES", (device,))
    assert cpu_thread_defaults({}) == {}
    assert cpu_thread_defaults({"CUDA_VISIBLE_DEVICES": ""})["OMP_WAIT_POLICY"] == "PASSIVE"  # GPUs hidden


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.spawn
def test_each_cli_sets_them_at_start_before_torch_loads(cli):
    """Importing a CLI module loads no torch (the defaults must be in the environment before it),
    and running the program sets them; the user's own values win."""
    code = (f"import os, sys\nfrom {cli} import app\n"
            "loaded = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "sys.argv = ['cli', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print(loaded, os.environ.get('OMP_WAIT_POLICY'), os.environ.get('OMP_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split("\n")[-2] == f"[] PASSIVE {usable_cores()}"
    users = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "1"},
                           capture_output=True, text=True, timeout=300, check=False)
    assert users.stdout.split("\n")[-2] == "[] ACTIVE 1"
