"""OpenMP defaults for the three CLIs on a CPU machine, set before torch loads.

By default OpenMP threads spin while they wait for work, and torch starts one per core. Next to
another busy process (a second job, a vLLM server) the spinning threads take the cores that
process needs and the other way round: a 2-step GRPO run took 7 min instead of 14 s. The test
suite has always set OMP_WAIT_POLICY=PASSIVE; the CLIs now do too, with no more threads than the
cores this process may use (its CPU affinity, and the cgroup's CPU quota in a container).
A value the user set in the environment always wins. Measured in bench/cpu_threads_bench.py."""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
GPU_DEVICES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))  # NVIDIA, AMD ROCm


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def has_gpu(environ: MutableMapping[str, str]) -> bool:
    """A GPU this process could use, told without importing torch (its device files)."""
    if environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(device.exists() for device in GPU_DEVICES)


def cpu_thread_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """On a CPU-only machine, set OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS (the usable cores,
    shared among the processes a launcher started on this machine: LOCAL_WORLD_SIZE) where
    `environ` (default os.environ) has neither; returns what it set. Call before torch loads."""
    environ = os.environ if environ is None else environ
    if has_gpu(environ):
        return {}
    local_processes = max(1, int(environ.get("LOCAL_WORLD_SIZE") or 1))
    threads = max(1, usable_cores() // local_processes)
    wanted = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}
    chosen = {key: value for key, value in wanted.items() if not environ.get(key)}
    environ.update(chosen)
    return chosen
