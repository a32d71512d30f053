"""The precision table: for full fine-tuning and LoRA under each `dtype` (auto, bfloat16,
float32), what one real optimizer step of the sft stage trained in, as run.json's `precision`
records it: the loaded weights (the frozen base with LoRA, every weight with full fine-tuning),
the trainable parameters, the trainer's autocast, and the AdamW states.

    python bench/precision_table.py [--model tiny-random] [--work DIR]

Two machines in one run: a native-bf16 GPU, simulated (the capability check forced, as
tests/test_train_precision.py does; the step then runs on the CPU, whose autocast computes bf16
too), and this machine as it is (its CPU, or its GPU on a GPU machine). About a minute on a
2-core CPU with the built-in tiny-random model; exits 1 when a row breaks the rule that only
`dtype: bfloat16` with full fine-tuning trains without fp32 master weights."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from unittest import mock

import pyarrow as pa

from rufus_data.folders.run_folder import read_run_json
from rufus_data.folders.shards import write_shards
from rufus_data.models.builtin import pull
from rufus_train import modeling
from rufus_train.config_loading import load_stage_config
from rufus_train.runner import run_stage
from rufus_train.stages import get_stage

DTYPES = ("auto", "bfloat16", "float32")
MACHINES = {"bf16 GPU (forced)": "bf16", "this machine": None}


def sft_shards(folder: Path) -> Path:
    rows = [{"id": f"sft-{a}-{b}", "source": "generated", "label": "arithmetic",
             "messages": [{"role": "user", "content": f"What is {a} times {b}?"},
                          {"role": "assistant", "content": f"{a} times {b} is {a * b}."}]}
            for a in range(1, 5) for b in range(1, 3)]
    write_shards(pa.Table.from_pylist(rows), folder)
    return folder


def one_step(model: str, data: Path, out: Path, lora: bool, dtype: str, forced: str | None) -> dict:
    """One optimizer step through run_stage; run.json's `precision`."""
    overrides = {"model": model, "data": [str(data)], "output_dir": str(out), "overwrite": True, "max_steps": 1,
                 "per_device_train_batch_size": 2, "max_rows": 4, "max_length": 128, "save_steps": 1000,
                 "logging_steps": 1, "gradient_checkpointing": False, "lora.enabled": lora, "dtype": dtype}
    config = load_stage_config("sft", get_stage("sft").config_class, overrides=overrides)
    if forced:
        with mock.patch.object(modeling, "gpu_kind", lambda: forced):
            result = run_stage(config)
    else:
        result = run_stage(config)
    return read_run_json(result.output_dir)["precision"]


def fp32_masters(report: dict) -> bool:
    return report["optimizer_steps"] == ["float32"] and report["optimizer_states"] == ["float32"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random", help="built-in name or model folder")
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary folder)")
    args = parser.parse_args()
    model = str(pull(args.model)) if not Path(args.model).exists() else args.model
    work = args.work or Path(tempfile.mkdtemp(prefix="rufus-precision-"))
    data = sft_shards(work / "sft")
    rows, broken = [], []
    for machine, forced in MACHINES.items():
        for lora in (False, True):
            for dtype in DTYPES:
                report = one_step(model, data, work / "run", lora, dtype, forced)
                loaded = report["frozen"] or report["trainable"]
                rows.append((machine, "LoRA" if lora else "full", dtype, "/".join(loaded), "/".join(report["trainable"]),
                             report["autocast"], "/".join(report["optimizer_states"])))
                pure_bf16_asked = dtype == "bfloat16" and not lora
                if fp32_masters(report) == pure_bf16_asked:
                    broken.append(rows[-1])
    print("| machine | tuning | dtype | loaded weights | trainable params | autocast | optimizer states |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for row in broken:
        print(f"BROKEN: {row}: only dtype bfloat16 with full fine-tuning may train without fp32 master weights")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
