"""Precision as the recipes train: `dtype: auto` on a native-bf16 GPU keeps fp32 master weights
and AdamW states for full fine-tuning (fp32 weights, bf16 autocast, as the Tulu 3 notebook
trains), LoRA keeps its frozen base in bf16 with fp32 adapter weights, and pure bf16 trains only
when asked for by name, with a warning. The GPU's capability check is forced (as
tests/test_distributed_setup.py forces it for fp16); the real optimizer step runs on the CPU,
whose autocast computes bf16 too. Also: the playbook's full fine-tuning baseline (`sft_full`)
and the checks bench/gpu_smoke.sh runs on its checkpoints."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from typer.testing import CliRunner

from rufus_data.folders.shards import write_shards
from rufus_train import guards, launch, modeling
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config
from rufus_train.runner import run_stage
from rufus_train.stages import get_stage
from rufus_train.trl_args import build_trl_args

REPO = Path(__file__).resolve().parents[1]
ONE_STEP = {"max_steps": 1, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "max_rows": 4,
            "max_length": 128, "save_steps": 1, "logging_steps": 1, "gradient_checkpointing": False, "overwrite": True}


@pytest.fixture
def bf16_gpu(monkeypatch):
    """A native-bf16 GPU (Ampere or newer) for every precision decision; training stays on the CPU."""
    monkeypatch.setattr(modeling, "gpu_kind", lambda: "bf16")


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    rows = [{"id": f"sft-{a}-{b}", "source": "generated", "label": "arithmetic",
             "messages": [{"role": "user", "content": f"What is {a} times {b}?"},
                          {"role": "assistant", "content": f"{a} times {b} is {a * b}."}]}
            for a in range(1, 5) for b in range(1, 3)]
    folder = tmp_path_factory.mktemp("precision") / "sft"
    write_shards(pa.Table.from_pylist(rows), folder)
    return folder


def load(stage: str, **overrides):
    return load_stage_config(stage, get_stage(stage).config_class, overrides=overrides)


def one_step(stage: str, tiny_model: str, data: Path, out: Path, monkeypatch, **overrides):
    """One real optimizer step through run_stage; what the loaded model held and the autocast its
    forward passes ran under (a pre-hook on its decoder: accelerate enters autocast inside the
    top model's forward, after that module's own hooks)."""
    loaded, autocast = [], []
    real_load = modeling.load_model

    def load_and_watch(*args, **kwargs):
        model = real_load(*args, **kwargs)
        loaded.extend({p.dtype for p in model.parameters()})
        model.get_decoder().register_forward_pre_hook(
            lambda module, inputs: autocast.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                                                   else None))
        return model

    monkeypatch.setattr(modeling, "load_model", load_and_watch)
    config = load(stage, model=tiny_model, data=[str(data)], output_dir=str(out), **{**ONE_STEP, **overrides})
    result = run_stage(config)
    return result, set(loaded), set(autocast)


def dtypes(params) -> set:
    return {p.dtype for p in params}


# ------------------------------------------------------------------ precision


@pytest.mark.train
def test_full_fine_tuning_on_a_bf16_gpu_keeps_fp32_masters(bf16_gpu, tiny_model, sft_data, tmp_path, monkeypatch):
    result, loaded, autocast = one_step("sft", tiny_model, sft_data, tmp_path / "full", monkeypatch,
                                        **{"lora.enabled": False, "dtype": "auto"})
    trainer = result.trainer
    assert result.global_step == 1 and trainer.args.bf16 and not trainer.args.fp16
    assert loaded == {torch.float32}  # the weights load in fp32: they are the master copy
    assert autocast == {torch.bfloat16}  # and every forward pass computes in bf16
    assert dtypes(p for p in trainer.model.parameters() if p.requires_grad) == {torch.float32}
    states = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert states and dtypes(states) == {torch.float32}
    precision = json.loads((result.output_dir / "run.json").read_text())["precision"]
    assert precision == {"frozen": [], "trainable": ["float32"], "autocast": "bf16", "optimizer_steps": ["float32"],
                         "optimizer_states": ["float32"]}


@pytest.mark.train
def test_lora_on_a_bf16_gpu_keeps_the_base_in_bf16_and_the_adapter_in_fp32(bf16_gpu, tiny_model, sft_data, tmp_path,
                                                                            monkeypatch):
    result, loaded, autocast = one_step("sft", tiny_model, sft_data, tmp_path / "lora", monkeypatch, dtype="auto")
    model = result.trainer.model
    assert loaded == {torch.bfloat16} and autocast == {torch.bfloat16}
    adapter = [p for n, p in model.named_parameters() if "lora_" in n]
    assert adapter and all(p.requires_grad for p in adapter) and dtypes(adapter) == {torch.float32}
    assert dtypes(p for p in model.parameters() if not p.requires_grad) == {torch.bfloat16}
    precision = json.loads((result.output_dir / "run.json").read_text())["precision"]
    assert precision == {"frozen": ["bfloat16"], "trainable": ["float32"], "autocast": "bf16",
                         "optimizer_steps": ["float32"], "optimizer_states": ["float32"]}


def test_pure_bf16_only_by_name_and_then_with_the_playbooks_warning(bf16_gpu, sft_data, tmp_path):
    assert modeling.precision("auto", full_finetune=True) == modeling.Precision("float32", bf16=True, fp16=False)
    assert modeling.precision("bfloat16", full_finetune=True) == modeling.Precision("bfloat16", bf16=True, fp16=False)
    base = {"data": [str(sft_data)], "output_dir": str(tmp_path / "o"), "lora.enabled": False}
    with pytest.warns(UserWarning, match=r"pure bf16: .*'mystery of the melting GPUs'.*saves 8 bytes per parameter"):
        guards.check_precision(load("sft", dtype="bfloat16", **base))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where fp32 masters are kept
        guards.check_precision(load("sft", **base))  # auto
        guards.check_precision(load("sft", dtype="bfloat16", **{**base, "lora.enabled": True}))  # fp32 adapter
        for engine in ("zero2", "zero3", "fsdp2"):  # ZeRO's fp32 partitions, FSDP2's fp32 shards
            guards.check_precision(load("sft", dtype="bfloat16", accelerate_config=engine, **base))


def test_sharded_configs_compute_in_bf16_over_fp32_masters(bf16_gpu, monkeypatch):
    """The shipped DeepSpeed and FSDP2 configs get bf16 from Rufus's dtype: ZeRO then keeps fp32
    master partitions, and accelerate upcasts FSDP2's trainable shards to fp32 (param_dtype bf16)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "deepspeed" else find_spec(name, *a))
    for engine in ("zero2", "zero3", "fsdp2", "ddp"):
        config = load("sft", num_processes=2, accelerate_config=engine, **{"lora.enabled": False})
        argv = launch.launch_command("sft", config, None, []).argv
        assert argv[argv.index("--mixed_precision") + 1] == "bf16", engine
        assert launch.engine_keeps_fp32_masters(config) == (engine != "ddp")
        assert modeling.precision(config.dtype, full_finetune=True).dtype == "float32"  # ddp: fp32 weights loaded
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    assert (plugin.mixed_precision_policy.param_dtype, plugin.mixed_precision_policy.reduce_dtype) == (torch.bfloat16,) * 2


def test_the_stage_yamls_the_dtype_help_and_the_docs_say_what_auto_does():
    """What a user reads about `dtype: auto` (each stage YAML's comment, the key's help, docs/train.md)
    says fp32 master weights with bf16 autocast, as `precision` trains, async GRPO included."""
    from rufus_train.config import StageConfig

    comments = {path.name: line.partition("#")[2] for path in sorted((REPO / "catalogs" / "stages").glob("*.yaml"))
                for line in path.read_text().splitlines() if line.startswith("dtype:")}
    assert len(comments) >= 8
    wrong = {name: c for name, c in comments.items() if "fp32 master weights + bf16 autocast" not in c}
    assert not wrong, wrong
    help_text = StageConfig.model_fields["dtype"].description
    assert "fp32 master weights" in help_text and "bf16 autocast" in help_text and "async GRPO" in help_text
    docs = (REPO / "docs" / "train.md").read_text()
    assert "async GRPO (`grpo_execution: async`, TRL's AsyncGRPOTrainer) trains the same way" in docs


# ------------------------------------------------------------------ the playbook's full fine-tuning baseline


def test_sft_full_dry_run_resolves_the_playbooks_baseline(tmp_path, monkeypatch):
    """`rufus-train stage sft_full --dry-run`, as typed: full fine-tuning at 1e-5, 128 sequences a
    step on one GPU, 1 epoch, no packing, 3% warmup, dtype auto."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["stage", "sft_full", "--dry-run"])
    assert result.exit_code == 0, result.output
    resolved = result.stdout
    for line in ("stage: sft_full", "lora:\n  enabled: false", "learning_rate: 1.0e-05", "num_train_epochs: 1.0",
                 "per_device_train_batch_size: 8", "gradient_accumulation_steps: 16", "packing: false",
                 "dtype: auto", "trainer:\n  warmup_steps: 0.03", "data:\n- catalogs/data/sft_mixture.yaml"):
        assert line in resolved, line
    config = load("sft_full", output_dir=str(tmp_path / "o"))
    args = build_trl_args(config, tmp_path / "o")
    assert (args.learning_rate, args.num_train_epochs, args.packing, args.warmup_steps) == (1e-5, 1.0, False, 0.03)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 128


@pytest.mark.train
def test_sft_full_trains_on_tiny_model_with_fp32_masters(bf16_gpu, tiny_model, sft_data, tmp_path, monkeypatch):
    """Two steps of sft_full; bench/gpu_smoke.sh's own checks pass on its checkpoint and metrics."""
    result, loaded, autocast = one_step("sft_full", tiny_model, sft_data, tmp_path / "full", monkeypatch,
                                        max_steps=2, save_steps=2)
    summary = json.loads((result.output_dir / "run.json").read_text())
    assert (summary["global_step"], summary["lora"], summary["dtype"]) == (2, None, "float32")
    assert (result.output_dir / "model.safetensors").exists()  # the full model, not an adapter
    assert loaded == {torch.float32} and autocast == {torch.bfloat16}
    fp32_masters, steps_once = smoke_check("FP32_MASTERS"), smoke_check("STEPS_ONCE")
    checkpoint = result.output_dir / "checkpoint-2"
    assert run_check(fp32_masters, checkpoint).returncode == 0
    metrics = result.output_dir / "metrics.jsonl"
    assert run_check(steps_once, metrics).returncode == 0
    (tmp_path / "twice.jsonl").write_text(metrics.read_text() * 2)  # a resume that logged steps again
    assert run_check(steps_once, tmp_path / "twice.jsonl").returncode == 1


@pytest.mark.train
def test_the_smoke_fp32_check_fails_on_a_pure_bf16_checkpoint(bf16_gpu, tiny_model, sft_data, tmp_path, monkeypatch):
    with pytest.warns(UserWarning, match="melting GPUs"):
        result, loaded, _ = one_step("sft_full", tiny_model, sft_data, tmp_path / "bf16", monkeypatch, dtype="bfloat16")
    assert loaded == {torch.bfloat16}
    precision = json.loads((result.output_dir / "run.json").read_text())["precision"]
    assert precision["optimizer_states"] == ["bfloat16"]  # no fp32 master copy: what the warning says
    check = run_check(smoke_check("FP32_MASTERS"), result.output_dir / "checkpoint-1")
    assert check.returncode == 1 and "bfloat16" in check.stdout


def smoke_check(name: str) -> str:
    """A Python check bench/gpu_smoke.sh runs on a checkpoint (`NAME='...'` in the script)."""
    script = (REPO / "bench" / "gpu_smoke.sh").read_text()
    return re.search(rf"^{name}='\n(.*?)\n'$", script, re.DOTALL | re.MULTILINE).group(1)


def run_check(code: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", str(path)], input=code, capture_output=True, text=True, timeout=120,
                          check=False)
