"""`rufus-train stage NAME --num_processes N --accelerate_config ddp|fsdp2|zero2|zero3|FILE`:
the stage starts `accelerate launch` itself, the way TRL's CLI does, so nobody writes launch
lines by hand. Every launched process runs the same `rufus-train stage` command line.

What is refused before anything starts (accelerate would otherwise do something else silently):
- FSDP or DeepSpeed without a CUDA GPU: accelerate 1.15 enables its FSDP and DeepSpeed plugins
  only for accelerator process groups; processes on CPU become MULTI_CPU (gloo) and train plain
  DDP without a word (measured: `distributed_type: FSDP` -> DistributedType.MULTI_CPU).
- DeepSpeed configs when the `deepspeed` package is missing.

The launched processes get the trainer's GPUs (the stage's `devices.trainer`) as
CUDA_VISIBLE_DEVICES, verbatim, and accelerate gets Rufus's mixed precision (`dtype`), so the
accelerate config file's `mixed_precision` never disagrees with the trainer's bf16/fp16 switch.
A one-process run on trainer GPUs other than this process's is started the same way, without
accelerate: `rufus-train stage` runs itself again in a process that starts on those GPUs."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.catalog_files import catalog_file
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.ports import free_port
from rufus_data.base.yaml_config import load_yaml_text
from rufus_data.models.devices import gpu_ids
from rufus_train.config import StageConfig
from rufus_train.modeling import precision

NAMED_CONFIGS = ("ddp", "fsdp2", "zero2", "zero3")
LAUNCHED_ENV = "RUFUS_LAUNCHED"  # set in the processes `rufus-train stage` launched: they run, never relaunch


@dataclass
class Launch:
    """One `accelerate launch` of a stage: its argv and the environment entries it adds."""

    argv: list[str]
    env: dict[str, str]

    def shell(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def accelerate_config_path(value: str) -> Path:
    """A named config of catalogs/accelerate/ (ddp, fsdp2, zero2, zero3) or a file."""
    if value in NAMED_CONFIGS:
        # absolute: accelerate reads it from the launched processes, wherever they start
        return catalog_file(f"accelerate/{value}.yaml", "accelerate config").absolute()
    path = Path(value).expanduser()
    if not path.is_file():
        raise RufusError(
            f"accelerate_config {value!r} is neither one of {', '.join(NAMED_CONFIGS)} (catalogs/accelerate/) nor a "
            "file: give one of those names or the path of an accelerate config YAML"
        )
    return path


def engine_keeps_fp32_masters(config: StageConfig) -> bool:
    """The stage's accelerate config shards with DeepSpeed ZeRO or FSDP, which keep fp32 master
    weights and optimizer states whatever dtype the weights load in (ZeRO's fp32 partitions with
    bf16 enabled; accelerate upcasts FSDP2's trainable shards to fp32 and computes in bf16)."""
    if config.accelerate_config is None:
        return False
    try:
        path = accelerate_config_path(config.accelerate_config)
        settings = load_yaml_text(path.read_text(), str(path)) or {}
    except RufusError:  # an unknown file is refused where the launch line is built
        return False
    return str(settings.get("distributed_type", "")).upper() in ("DEEPSPEED", "FSDP")


def in_launched_process() -> bool:
    """True inside a process that accelerate / torchrun started (never launch again from there)."""
    return os.environ.get(LAUNCHED_ENV) == "1" or "LOCAL_RANK" in os.environ


def takes_output_lock() -> bool:
    """Whether this process takes the run folder's lock (rufus_data/folders/output_lock.py): not a process
    `rufus-train stage` launched (the launcher holds it for the run), and of the ranks torchrun or
    accelerate started otherwise only rank 0, so the ranks of one run never lock each other out."""
    return os.environ.get(LAUNCHED_ENV) != "1" and os.environ.get("RANK", "0") == "0"


def uses_accelerate(config: StageConfig) -> bool:
    return (config.num_processes or 1) > 1 or config.accelerate_config is not None


def launch_reason(config: StageConfig) -> str | None:
    """Why the stage must run in processes Rufus starts (None: it runs in this one): several
    processes or an accelerate config, or trainer GPUs this process was not started with (CUDA
    reads CUDA_VISIBLE_DEVICES once, when a process first touches it, so a running process cannot
    move to other GPUs: one process is started on them, as several are)."""
    if in_launched_process():
        return None
    if uses_accelerate(config):
        return f"num_processes {config.num_processes} / accelerate_config {config.accelerate_config}"
    devices = config.devices.trainer
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu_ids(devices) and gpu_ids(devices) != gpu_ids(visible):
        return (f"devices.trainer {devices} while this process has CUDA_VISIBLE_DEVICES={visible or '(unset)'} "
                f"(or export CUDA_VISIBLE_DEVICES={devices} before Python starts)")
    return None


def wants_launch(config: StageConfig) -> bool:
    """This process starts the stage's trainer process(es) instead of training itself."""
    return launch_reason(config) is not None


def launch_problems(settings: dict, cuda: bool, deepspeed_installed: bool) -> list[str]:
    """What accelerate would not run as asked on this machine, one message each."""
    kind = str(settings.get("distributed_type", "")).upper()
    problems = []
    if kind in ("FSDP", "DEEPSPEED") and not cuda:
        name = "FSDP" if kind == "FSDP" else "DeepSpeed"
        problems.append(
            f"{name} needs CUDA GPUs: without one, accelerate (1.15) starts the processes as MULTI_CPU (gloo) and "
            f"drops the {name} plugin without a word, so the run would train plain DDP. Use --accelerate_config ddp "
            "on CPU, or run on GPUs"
        )
    if kind == "DEEPSPEED" and not deepspeed_installed:
        problems.append("DeepSpeed configs need the deepspeed package: `pip install deepspeed` (CUDA machines)")
    return problems


def launch_command(name: str, config: StageConfig, config_file: str | Path | None, args: list[str]) -> Launch:
    """The line that runs `rufus-train stage NAME [--config FILE] ARGS` on the trainer's GPUs:
    `accelerate launch` for several processes or an accelerate config (refused here when accelerate
    would not run it as asked), else the stage itself in one process."""
    stage = ["-m", "rufus_train.cli", "stage", name, *(["--config", str(config_file)] if config_file else []), *args]
    env = {LAUNCHED_ENV: "1"}
    if gpu_ids(config.devices.trainer):
        env["CUDA_VISIBLE_DEVICES"] = config.devices.trainer  # physical ids, verbatim
    if not uses_accelerate(config):
        return Launch([sys.executable, *stage], env)
    import torch  # heavy: only when a stage is launched (the CUDA check)

    path = accelerate_config_path(config.accelerate_config or "ddp")
    settings = load_yaml_text(path.read_text(), str(path)) or {}
    problems = launch_problems(settings, torch.cuda.is_available(), importlib.util.find_spec("deepspeed") is not None)
    if problems:
        raise RufusError(f"cannot launch stage {name} with {path}:\n- " + "\n- ".join(problems))
    mixed = precision(config.dtype, full_finetune=not config.lora.enabled).autocast or "no"
    argv = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), "--mixed_precision", mixed]
    if config.num_processes:
        argv += ["--num_processes", str(config.num_processes)]
    if "main_process_port" not in settings and int(settings.get("num_machines", 1) or 1) == 1:
        argv += ["--main_process_port", str(free_port())]  # two runs on one machine must not share 29500
    return Launch(argv + stage, env)


def run_launch(launch: Launch) -> int:
    """Run the launch in the foreground; its exit code."""
    console.print(f"[bold]launching:[/] {launch.shell()}", highlight=False, soft_wrap=True)
    return subprocess.run(launch.argv, env={**os.environ, **launch.env}, check=False).returncode


def on_main_process(fn, *args):
    """`fn(*args)` on the main process only; with several processes the others wait and receive
    its result (or its error). For what every rank would otherwise do at once on one folder:
    preparing the run folder (it may delete it) and mixing catalogs (rebuilt each run)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return fn(*args)
    import torch  # heavy: only in a multi-process run
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    # the process group transformers would start anyway (use_cpu on CPU: gloo, as common_trl_kwargs sets)
    state = PartialState(cpu=not torch.cuda.is_available())
    outcome: list = [None]
    if state.is_main_process:
        try:
            outcome = [("ok", fn(*args))]
        except Exception as err:  # noqa: BLE001 - re-raised on every process below
            outcome = [("error", err)]
    broadcast_object_list(outcome, from_process=0)
    kind, value = outcome[0]
    if kind == "error":
        if state.is_main_process:
            raise value
        raise RufusError(f"the main process failed in {getattr(fn, '__name__', fn)}: {value}")
    return value
