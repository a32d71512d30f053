"""Training at scale, the parts that need no model: the mixed-precision choice (the GPU's
capability forced), `rufus-train stage --num_processes/--accelerate_config` (the accelerate line,
what it refuses on CPU, and the environment that really reaches the launched processes), the GPU
roles of a GRPO stage applied to the processes Rufus starts (read back from a stand-in's
environment), and the recipe's `rufus-train serve` defaults."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_train import launch, modeling, serve
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config
from rufus_train.runner import run_stage
from rufus_train.stages import get_stage
from rufus_train.trl_args import common_trl_kwargs

REPO = Path(__file__).resolve().parents[1]


def stage_config(stage: str = "reasoning_rl", config_file: Path | None = None, **overrides):
    return load_stage_config(stage, get_stage(stage).config_class, config_file, overrides=overrides)


def force_gpu(monkeypatch, native_bf16: bool) -> None:
    """A CUDA machine whose GPU computes bf16 natively (Ampere+) or only by emulation (T4, V100)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation or native_bf16)


# ------------------------------------------------------------------ mixed precision


def test_auto_precision_bf16_only_where_native_else_fp16_with_scaler(monkeypatch, tmp_path):
    config = stage_config("sft", output_dir=str(tmp_path))
    cpu = common_trl_kwargs(config, tmp_path)
    assert (cpu["bf16"], cpu["fp16"], cpu["use_cpu"], modeling.torch_dtype("auto")) == (False, False, True, torch.float32)

    force_gpu(monkeypatch, native_bf16=False)  # a 16 GB T4: bf16 only emulated
    t4 = common_trl_kwargs(config, tmp_path)
    assert (t4["bf16"], t4["fp16"], t4["use_cpu"]) == (False, True, False)
    assert modeling.torch_dtype("auto") == torch.float32  # fp16 autocast + gradient scaler keep fp32 weights
    assert modeling.precision("float16", full_finetune=True) == modeling.Precision("float32", bf16=False, fp16=True)

    force_gpu(monkeypatch, native_bf16=True)  # Ampere or newer
    a100 = common_trl_kwargs(config, tmp_path)
    assert (a100["bf16"], a100["fp16"]) == (True, False) and modeling.torch_dtype("auto") == torch.bfloat16  # LoRA base
    full = common_trl_kwargs(stage_config("sft", output_dir=str(tmp_path), **{"lora.enabled": False}), tmp_path)
    assert full["bf16"] and modeling.torch_dtype("auto", full_finetune=True) == torch.float32  # fp32 masters, bf16 compute


def test_float16_needs_a_gpu():
    with pytest.raises(RufusError, match="dtype: float16 trains with fp16 autocast and a gradient scaler, which need a CUDA GPU"):
        modeling.precision("float16", full_finetune=True)


# ------------------------------------------------------------------ launching accelerate


STUB_PROCESS = """import json, os, sys
from pathlib import Path
Path(sys.argv[1], f"rank{os.environ['RANK']}.json").write_text(json.dumps(dict(os.environ)))
"""


@pytest.mark.spawn
@pytest.mark.distributed
def test_launch_line_and_the_environment_that_reaches_every_process(tmp_path):
    """The accelerate line `rufus-train stage` runs, then that line itself with a stand-in for the
    training module: each launched process reports its environment."""
    args = ["--num_processes", "2", "--accelerate_config", "ddp", "--devices.trainer", "0,1"]
    config = stage_config(num_processes=2, accelerate_config="ddp", **{"devices.trainer": "0,1"})
    assert launch.wants_launch(config)
    line = launch.launch_command("reasoning_rl", config, None, args)
    assert line.argv[:4] == [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    assert line.argv[4] == str(REPO / "catalogs" / "accelerate" / "ddp.yaml")
    flags = " ".join(line.argv)
    assert "--mixed_precision no --num_processes 2 --main_process_port " in flags  # Rufus's precision: fp32 on CPU
    module = line.argv.index("rufus_train.cli")
    assert line.argv[module - 1:] == ["-m", "rufus_train.cli", "stage", "reasoning_rl", *args]
    assert line.env == {"RUFUS_LAUNCHED": "1", "CUDA_VISIBLE_DEVICES": "0,1"}  # the trainer's role, verbatim

    stub = tmp_path / "stub.py"
    stub.write_text(STUB_PROCESS)
    argv = [*line.argv[:module - 1], str(stub), str(tmp_path)]
    proc = subprocess.run(argv, env={**os.environ, **line.env}, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for env in ranks:
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["RUFUS_LAUNCHED"] == "1" and env["WORLD_SIZE"] == "2"
        assert env["ACCELERATE_MIXED_PRECISION"] == "no"
    with pytest.MonkeyPatch.context() as mp:  # inside a launched process nothing launches again
        mp.setenv("RUFUS_LAUNCHED", "1")
        assert not launch.wants_launch(config)


def test_launch_refuses_what_accelerate_would_silently_change_on_cpu():
    assert not torch.cuda.is_available()
    for name, engine in (("fsdp2", "FSDP"), ("zero3", "DeepSpeed")):
        with pytest.raises(RufusError, match=rf"{engine} needs CUDA GPUs: without one, accelerate .* plain DDP"):
            launch.launch_command("sft", stage_config("sft", num_processes=2, accelerate_config=name), None, [])
    with pytest.raises(RufusError, match="DeepSpeed configs need the deepspeed package"):
        launch.launch_command("sft", stage_config("sft", accelerate_config="zero2"), None, [])
    with pytest.raises(RufusError, match="accelerate_config 'fsdp3' is neither one of ddp, fsdp2, zero2, zero3"):
        launch.launch_command("sft", stage_config("sft", accelerate_config="fsdp3"), None, [])
    assert launch.launch_problems({"distributed_type": "FSDP"}, cuda=True, deepspeed_installed=False) == []


def test_run_stage_does_not_pretend_to_be_several_processes(tmp_path):
    with pytest.raises(RufusError, match=r"asks for num_processes 2 .* run it with `rufus-train stage sft \.\.\.`"):
        run_stage(stage_config("sft", num_processes=2, output_dir=str(tmp_path)))


def test_one_process_run_starts_on_the_trainer_gpus(tmp_path, monkeypatch, tiny_model):
    """`rufus-train stage` with devices.trainer and one process: the process that trains is started
    with them as CUDA_VISIBLE_DEVICES (a stand-in interpreter reports its environment), as the
    launched processes of a multi-process run are; it never trains in a process that has others."""
    from rufus_train import runner

    rl = tmp_path / "rl"
    write_rl_shards(rl)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("RUFUS_LAUNCHED", raising=False)
    monkeypatch.setattr(runner, "run_stage", lambda config: pytest.fail("trained in this process, not on GPU 2"))
    monkeypatch.setattr(sys, "executable", str(stub_interpreter(tmp_path)))
    args = ["--model", tiny_model, "--data", str(rl), "--output_dir", str(tmp_path / "run"), "--devices.trainer", "2"]
    result = CliRunner().invoke(app, ["stage", "reasoning_rl", *args])
    assert result.exit_code == 0, result.output
    argv, env = started_environment(tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["RUFUS_LAUNCHED"] == "1"
    assert argv == ["-m", "rufus_train.cli", "stage", "reasoning_rl", *args]  # the same command, in one process

    config = stage_config(model=tiny_model, data=[str(rl)], **{"devices.trainer": "2"})
    with pytest.raises(RufusError, match=r"asks for devices.trainer 2 while this process has CUDA_VISIBLE_DEVICES="
                                         r"\(unset\) .*export CUDA_VISIBLE_DEVICES=2"):
        run_stage(config)  # a pipeline or Python caller: refused, never trained on other GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # started on them already: nothing to launch
    assert not launch.wants_launch(config)


# ------------------------------------------------------------------ GPU roles


def test_gpu_roles_are_checked_without_a_server_too(tmp_path):
    """Every pair of roles, also in a sync run that generates in the trainer (no vllm_server): the
    one check every stage's guards run (rufus_train/guards.py)."""
    with pytest.raises(RufusError, match=r"GPU 1 is both a trainer device .* and a vLLM server device"):
        stage_config(**{"devices.trainer": "0,1", "devices.server": "1"}).devices.check()
    with pytest.warns(UserWarning, match=r"evaluation devices \(0\) overlap the trainer's on GPU 0"):
        stage_config(**{"devices.trainer": "0", "devices.eval": "0"}).devices.check()
    with pytest.raises(RufusError, match=r"devices.server \(1\): stage sft trains against no vLLM server"):
        stage_config("sft", **{"devices.server": "1"})  # a role no process of the stage takes is refused


def test_default_eval_gpus_are_checked_against_the_server_and_trainer(monkeypatch):
    """With checkpoint evaluation on and no eval GPUs given, the evaluation runs on devices.eval's
    default (0,1): resolved once into devices.eval, it is checked against the server's GPU and the
    trainer's (the trainer role given, not the GPUs this process happens to see)."""
    from rufus_data.models import devices
    from rufus_train.runner import checkpoint_eval_callback
    from rufus_train.serve import config_for_stage

    config = stage_config(**{"devices.trainer": "2", "devices.server": "1", "eval.eval_on_checkpoint": True})
    assert config.devices.eval == "0,1"
    with pytest.warns(UserWarning, match=r"evaluation devices \(0,1\) overlap the vLLM server's on GPU 1"):
        config.devices.check()
    with pytest.warns(UserWarning, match=r"evaluation devices \(0,1\) overlap the vLLM server's on GPU 1"):
        config_for_stage(config)  # `rufus-train serve --stage` checks the same pairs
    assert stage_config().devices.eval is None  # no evaluation, no eval role

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "gpu_count", lambda: 4)  # this process sees every GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # trainer 2 (given), eval 0,1: no overlap
        checkpoint_eval_callback(config)
    with pytest.warns(UserWarning, match=r"evaluation devices \(0,1\) overlap the trainer's on GPU 1"):
        checkpoint_eval_callback(stage_config(**{"devices.trainer": "1", "eval.eval_on_checkpoint": True}))


def test_devices_eval_is_the_checkpoint_evaluations_gpus():
    """One key for the evaluation's GPUs, for every stage: devices.eval; the old eval.eval_devices
    is refused with the key to write instead."""
    assert stage_config(**{"devices.eval": "3"}).devices.eval == "3"
    assert stage_config("sft", **{"devices.eval": "2,3", "eval.eval_on_checkpoint": True}).devices.eval == "2,3"
    with pytest.raises(RufusError, match=r"eval.eval_devices is now devices.eval.*devices: \{eval: \"2\"\}"):
        stage_config(**{"eval.eval_devices": "2"})


STUB_INTERPRETER = """#!/bin/sh
{ echo "ARGV $*"; env; } > "$(dirname "$0")/started.env"
"""


def write_rl_shards(folder: Path) -> None:
    import pyarrow as pa

    from rufus_data.folders.shards import write_shards

    rows = [{"id": f"add-{a}", "source": "generated", "label": "arithmetic", "expected_output": str(a + 1),
             "prompt": [{"role": "user", "content": f"What is {a} + 1?"}]} for a in range(8)]
    write_shards(pa.Table.from_pylist(rows), folder)


def started_environment(folder: Path) -> tuple[list[str], dict[str, str]]:
    lines = (folder / "started.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    return lines[0].split()[1:], env


def stub_interpreter(folder: Path) -> Path:
    stub = folder / "python"
    stub.write_text(STUB_INTERPRETER)
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


@pytest.mark.spawn
def test_serve_for_a_stage_starts_the_server_on_its_gpus(tmp_path):
    """`rufus-train serve --stage`: the process it starts (a stand-in interpreter) gets the stage's
    devices.server as CUDA_VISIBLE_DEVICES, the recipe's context and the stage's port and LoRA rank."""
    stage_yaml = tmp_path / "rl.yaml"
    stage_yaml.write_text("devices: {trainer: '0', server: '2,3'}\nvllm_server: http://127.0.0.1:8123\n")
    stub = stub_interpreter(tmp_path)
    cli = [sys.executable, "-m", "rufus_train.cli", "serve", "--stage", "reasoning_rl", "--python", str(stub)]
    proc = subprocess.run([*cli, "--config", str(stage_yaml)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv, env = started_environment(tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["VLLM_SERVER_DEV_MODE"] == "1"
    flags = " ".join(argv)
    for flag in ("--max-model-len 16384", "--port 8123", "--tensor-parallel-size 2", "--enable-lora --max-lora-rank 8"):
        assert flag in flags
    model = argv[argv.index("--model") + 1]
    assert argv[argv.index("--served-model-name") + 1] == model  # the name TRL's async worker asks for

    # the recipe's defaults without a stage, and a clash refused before anything starts (in this process)
    env, argv = serve.serve_command(serve.ServeConfig(model="smollm2-135m"))
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "--max-model-len 16384" in " ".join(argv)
    stage_yaml.write_text("devices: {trainer: '0,1', server: '1'}\n")
    clash = CliRunner().invoke(app, ["serve", "--stage", "reasoning_rl", "--python", str(stub), "--config", str(stage_yaml)])
    assert clash.exit_code == 2 and "GPU 1 is both a trainer device" in clash.output


@pytest.mark.spawn
def test_serve_listens_on_loopback_and_beyond_it_only_with_a_key(tmp_path):
    """The probe: `rufus-train serve` listened on every interface, developer routes on, no key.
    Now: 127.0.0.1 by default; --host 0.0.0.0 is refused without OPENAI_API_KEY (nothing starts),
    and with it the server gets the key as VLLM_API_KEY (vLLM's --api-key), in no argv or output,
    and a warning says the developer routes stay open to the network."""
    stub = stub_interpreter(tmp_path)
    cli = [sys.executable, "-m", "rufus_train.cli", "serve", "tiny-random", "--vllm_command", f"{stub} -m vllm"]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VLLM_API_KEY")}
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv, started = started_environment(tmp_path)
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "VLLM_API_KEY" not in started
    assert "GRPO syncs the trained weights through them" in " ".join(proc.stderr.split())
    (tmp_path / "started.env").unlink()

    proc = subprocess.run([*cli, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 2 and "set an API key in $OPENAI_API_KEY" in " ".join(proc.stderr.split())
    assert not (tmp_path / "started.env").exists()  # refused before anything started

    key = "sk-serve-test-0123456789"
    for extra in (["--dry_run"], []):
        proc = subprocess.run([*cli, "--host", "0.0.0.0", *extra], capture_output=True, text=True, timeout=120,
                              env={**env, "OPENAI_API_KEY": key}, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        output = " ".join((proc.stdout + proc.stderr).split())
        assert key not in output and "checks the key on /v1 routes only" in output
    argv, started = started_environment(tmp_path)
    assert started["VLLM_API_KEY"] == key and key not in argv and argv[argv.index("--host") + 1] == "0.0.0.0"


def test_checkpoint_evaluation_process_gets_the_eval_gpus(tmp_path, monkeypatch):
    """The evaluation the callback starts (a stand-in interpreter) runs on devices.eval, verbatim,
    whatever the trainer's CUDA_VISIBLE_DEVICES and rank variables say."""
    from types import SimpleNamespace

    from rufus_train.runner import checkpoint_eval_callback

    config = stage_config(**{"devices.trainer": "0,1", "devices.eval": "3", "eval.eval_on_checkpoint": True,
                             "eval.eval_baseline": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval on 3, trainer on 0,1: no overlap warning
        config.devices.check()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    evaluator = checkpoint_eval_callback(config)
    monkeypatch.setattr(sys, "executable", str(stub_interpreter(tmp_path)))
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    state = SimpleNamespace(is_world_process_zero=True, global_step=2, log_history=[])
    evaluator.on_save(SimpleNamespace(output_dir=str(tmp_path / "run")), state, None)
    assert evaluator.wait(60)
    argv, env = started_environment(tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "RANK" not in env and "MASTER_ADDR" not in env
    assert argv[:3] == ["-m", "rufus_eval.cli", "suite"]



# ------------------------------------------------------------------ bench/gpu_smoke.sh without a GPU


def test_gpu_smoke_script_commands_parse_with_rufus_clis(tmp_path):
    """The script cannot run without a GPU; its dry run prints every command, and each Rufus command
    in it is parsed here by the CLI that will run it (stage keys validated by the stage config)."""
    import shlex

    import typer

    from rufus_eval.cli import app as eval_app
    from rufus_train.cli import app as train_app
    from rufus_train.config_loading import parse_cli_overrides

    script = REPO / "bench" / "gpu_smoke.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    proc = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "WORK": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    commands = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[") and "] " in line:
            name, command = line[1:].split("] ", 1)
            commands[name] = shlex.split(command)
    assert list(commands) == ["serve", "sync_grpo", "async_grpo", "async_resume", "ckpt_eval", "eval_vllm", "eval_hf",
                              "eval_agree", "full_ft", "resume_killed", "resume_latest", "zero3"]
    assert "| async_resume  | dry  |" in proc.stdout
    assert commands["resume_killed"] == commands["resume_latest"]  # one command line, first run and restart
    assert commands["resume_latest"][-2:] == ["--resume_from_checkpoint", "latest"]
    zero3 = " ".join(commands["zero3"])
    assert "--num_processes 1 --accelerate_config zero3 --eval.eval_on_checkpoint" in zero3
    for name, argv in commands.items():
        while argv[0] == "env" or "=" in argv[0]:
            argv = argv[1:]
        if argv[1:3] == ["-m", "rufus_train.cli"] and argv[3] == "stage":
            stage = argv[4]
            load_stage_config(stage, get_stage(stage).config_class, overrides=parse_cli_overrides(argv[5:]))
        elif argv[1:3] in (["-m", "rufus_train.cli"], ["-m", "rufus_eval.cli"]):
            group = typer.main.get_command(train_app if argv[2] == "rufus_train.cli" else eval_app)
            command = group.get_command(group.make_context("cli", list(argv[3:])), argv[3])
            command.make_context(argv[3], list(argv[4:]))  # unknown options and bad values raise here
        else:
            assert name == "eval_agree", name


@pytest.mark.spawn
def test_gpu_smoke_precheck_names_what_is_missing_and_how_to_install_it(tmp_path):
    """On this machine (no GPU, a CPU torch, no vllm/kernels/deepspeed) the pre-check lists each need
    with what it found, marks the missing ones, prints the install commands and exits 2; a full run
    stops there too, having run nothing."""
    import importlib.util

    script = REPO / "bench" / "gpu_smoke.sh"
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "RUFUS_DATA_ROOT": str(tmp_path)}
    proc = subprocess.run(["bash", str(script), "--precheck"], capture_output=True, text=True, timeout=120,
                          check=False, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")]
                                              for line in proc.stdout.splitlines() if line.startswith("| "))}
    assert rows["GPU"][0] == "MISSING" and rows["CUDA torch"][0] == "MISSING"
    assert not torch.cuda.is_available() and "CPU build" in rows["CUDA torch"][1]
    for package in ("vllm", "kernels", "deepspeed", "trl", "lm_eval", "aiohttp"):
        installed = importlib.util.find_spec(package) is not None
        assert rows[package][0] == ("ok" if installed else "MISSING"), (package, rows[package])
        assert installed or "install-gpu below" in rows[package][1]
    assert rows["attention kernel"] == ["MISSING", "not checked: needs CUDA and kernels (above)"]
    assert rows["RUFUS_DATA_ROOT"] == ["ok", str(tmp_path)]
    assert f'install-gpu:   {sys.executable} -m pip install -c {REPO}/constraints.txt -e "{REPO}[gpu]"' in proc.stdout
    assert "rufus_train.cli prefetch" in proc.stdout
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert run.returncode == 2 and "nothing run" in run.stdout and "| step " not in run.stdout
    assert not (tmp_path / "work").exists()
