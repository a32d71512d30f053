"""Rufus beside plain TRL on the same settings: `stage sft` and `stage dpo` run by Rufus, and the
same TRL trainer built by hand (the model read with from_pretrained, the same LoRA adapter and
seed, the TRL config Rufus builds, the same rows), each side in a fresh process with the same
OpenMP and torch threads. Per-step losses must be equal; wall time and peak RSS (the process's
high-water mark, ru_maxrss) are reported as ratios Rufus / TRL.

    RUFUS_DATA_ROOT=/work/shared/data .venv/bin/python bench/trl_side_by_side.py [--stages sft dpo]
        [--model smollm2-135m] [--steps 10] [--threads 1] [--work DIR]

Writes WORK/trl_side_by_side.json and prints the table; exits 1 when the losses differ."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' shard builders

ROWS = 64
SETTINGS = {"per_device_train_batch_size": 4, "max_length": 256, "logging_steps": 1, "save_steps": 10_000,
            "gradient_checkpointing": False, "overwrite": True, "seed": 0}


def stage_config(stage: str, model: str, data: Path, out: Path, steps: int):
    from rufus_train.config_loading import load_stage_config
    from rufus_train.stages import get_stage

    overrides = {**SETTINGS, "model": model, "data": [str(data)], "output_dir": str(out), "max_steps": steps}
    return load_stage_config(stage, get_stage(stage).config_class, overrides=overrides)


def rufus_side(config) -> list[float]:
    from rufus_train.runner import run_stage

    return [m["loss"] for m in run_stage(config).metrics if "loss" in m]


def trl_side(config) -> list[float]:
    """The TRL trainer of the stage, by hand: what a user of plain TRL writes for these settings."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import DPOTrainer, SFTTrainer

    from rufus_data.folders.shards import KIND_COLUMNS
    from rufus_data.models.reference import ModelRef
    from rufus_train.data import read_rows
    from rufus_train.modeling import torch_dtype
    from rufus_train.stage_base import conversational
    from rufus_train.trl_args import build_trl_args

    path = ModelRef.of(config.model).folder()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(config.dtype, full_finetune=False))
    set_seed(config.seed)
    lora = config.lora
    model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=lora.dropout,
                                             target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
    rows = read_rows(config.data, config.max_rows, config.seed, config.stage)
    columns = ("messages",) if config.stage == "sft" else KIND_COLUMNS["preference"]
    dataset = Dataset.from_dict({column: conversational(rows, column) for column in columns})
    trainer_class = SFTTrainer if config.stage == "sft" else DPOTrainer
    args = build_trl_args(config, Path(config.output_dir))
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def one_side(args) -> None:
    """Run in a fresh process: one side of one stage, its result as the last line of stdout."""
    import torch

    torch.set_num_threads(args.threads)
    config = stage_config(args.stage, args.model, Path(args.data), Path(args.work) / f"{args.stage}-{args.side}",
                          args.steps)
    started = time.perf_counter()
    losses = (rufus_side if args.side == "rufus" else trl_side)(config)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"losses": losses, "seconds": round(seconds, 2), "peak_rss_mib": round(peak, 1)}))


def shards(stage: str, work: Path) -> Path:
    import example_shards

    root = Path(os.environ["RUFUS_DATA_ROOT"])
    build = example_shards.gsm8k_sft if stage == "sft" else example_shards.gsm8k_preference
    folder = work / f"{stage}-data"
    return folder if folder.exists() else build(root, folder, limit=ROWS, max_chars=400)


def measure(stage: str, args) -> dict:
    data = shards(stage, Path(args.work))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    found = {}
    for side in ("trl", "rufus"):
        command = [sys.executable, __file__, "--side", side, "--stage", stage, "--data", str(data), "--work", args.work,
                   "--model", args.model, "--steps", str(args.steps), "--threads", str(args.threads)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"{stage} {side} failed:\n{done.stderr[-3000:]}")
        found[side] = json.loads(done.stdout.strip().splitlines()[-1])
    rufus, trl = found["rufus"], found["trl"]
    return {"stage": stage, "rufus": rufus, "trl": trl, "losses_equal": rufus["losses"] == trl["losses"],
            "time_ratio": round(rufus["seconds"] / trl["seconds"], 3),
            "peak_rss_ratio": round(rufus["peak_rss_mib"] / trl["peak_rss_mib"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", nargs="+", default=["sft", "dpo"], choices=["sft", "dpo"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="outputs/trl_side_by_side")
    parser.add_argument("--side", choices=["rufus", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        one_side(args)
        return
    if not os.environ.get("RUFUS_DATA_ROOT"):
        raise SystemExit("set RUFUS_DATA_ROOT to the shared data folder (the GSM8K rows are read from it)")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    results = [measure(stage, args) for stage in args.stages]
    (Path(args.work) / "trl_side_by_side.json").write_text(json.dumps(results, indent=2))
    print(f"{'stage':6} {'losses equal':>12} {'time Rufus/TRL':>15} {'peak RSS Rufus/TRL':>19}  (MiB)")
    for r in results:
        print(f"{r['stage']:6} {r['losses_equal']!s:>12} {r['time_ratio']:>15} {r['peak_rss_ratio']:>19}  "
              f"({r['rufus']['peak_rss_mib']:.0f} / {r['trl']['peak_rss_mib']:.0f})")
    if not all(r["losses_equal"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
