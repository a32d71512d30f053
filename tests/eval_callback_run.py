"""A tiny CPU SFT run (TRL SFTTrainer, LoRA r=4 on the model it is given) with the checkpoint-eval
callback attached; used in-process by tests/test_eval_callback.py and as a script for the runs
that need their own process (an exception that ends the process; 2 ranks under torchrun + gloo).

Script use: python tests/eval_callback_run.py SPEC.json  (SPEC: see `run` keyword arguments)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from datasets import Dataset
from ifeval_suites import ifeval_task, no_comma_rows, write_rows, write_suite
from peft import LoraConfig
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback

PROMPTS = ["What is 2 + 3?", "Name a colour.", "Say hello.", "What is the capital of France?"]
ANSWERS = ["2 + 3 = 5.", "Blue.", "Hello!", "Paris."]


def tiny_suite(folder: Path) -> Path:
    """One IFEval-scored task on two local rows: cheap enough to evaluate inside a test."""
    rows = write_rows(folder / "tiny.jsonl", no_comma_rows(["Say hi without commas.", "Name a fruit."]))
    return write_suite(folder / "tiny.yaml", [ifeval_task("nocomma", rows)], repeats=1, max_tokens=4)


class RaiseAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"planned failure at step {self.step}")


def build_trainer(model: str, out: Path, eval_config: dict, max_steps: int = 3, save_total_limit: int | None = 1,
                  extra_callbacks=(), **sft_overrides) -> tuple[SFTTrainer, CheckpointEvalCallback]:
    data = Dataset.from_list(
        [{"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]} for p, a in zip(PROMPTS, ANSWERS)]
    )
    config = SFTConfig(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=1, save_steps=1,
        save_total_limit=save_total_limit, logging_steps=1, report_to=[], use_cpu=True, max_length=64,
        learning_rate=1e-3, save_only_model=False, dataloader_num_workers=0, **sft_overrides,
    )
    callback = CheckpointEvalCallback(eval_config)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=data,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        callbacks=[callback, *extra_callbacks],
    )
    return trainer, callback


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    rank = int(os.environ.get("RANK", "0"))
    extra = [RaiseAt(spec["raise_at"])] if spec.get("raise_at") else []
    overrides = {"ddp_backend": "gloo"} if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {}
    trainer, callback = build_trainer(spec["model"], out, spec["eval"], max_steps=spec.get("max_steps", 3),
                                      extra_callbacks=extra, **overrides)
    report = out / f"rank{rank}.json"
    try:
        trainer.train()
    finally:
        report.write_text(json.dumps({"rank": rank, "jobs": callback.jobs, "skipped": callback.skipped,
                                      "logged": callback.logged}))


if __name__ == "__main__":
    main(sys.argv[1])
