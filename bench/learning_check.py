"""Training that visibly learns: sft, dpo and reasoning_rl on a task the built-in 135M model
solves sometimes, each measured on held-out items before and after.

    RUFUS_DATA_ROOT=/work/shared/data .venv/bin/python bench/learning_check.py [--work DIR]

The task: one-step arithmetic from GSM8K train's calculator annotations (`<<18*2=36>>` becomes
"What is 18 * 2? Answer with the number only."), real calculations from real solutions, those on
numbers up to 25 (`--max-operand`), scored by the `string_match` verifier on the last number. The
base model answers 37.5% of the 64 held-out items right greedily (on all of GSM8K's calculations
17%, below the 20-60% a check needs; up to 20, 48%, where it already prefers the right result in
97% of the DPO pairs and DPO has nothing left to show). The held-out items are disjoint from every
training item. Each stage starts from the base model:

- sft on `18 * 2 = 36` answers: the held-out loss (mean NLL of the assistant tokens) must fall;
- dpo on pairs whose rejected answer has its result moved (`rufus-data pairs`' perturbation): the
  held-out preference accuracy (chosen log-prob above rejected) must rise;
- reasoning_rl with the stage's own rewards, the verifier plus DAPO's soft overlong penalty (the
  last 6 of 16 tokens), 4 prompts x 4 samples a step: the mean reward of the last 5 steps must
  beat the first 5 by >= 0.15, and greedy held-out accuracy (64 items, the verifier alone) must
  rise by >= 10 points. With 2 prompts a step and a learning rate of 3e-4 the policy collapsed
  to short wrong answers in one of three runs; 4 prompts at 2e-4 is what held;

all within 15 minutes on a 2-core CPU. Writes OUT/learning_check.json, OUT/learning_check.md (the
table) and OUT/learning_check.png (the curves) and exits 1 when a criterion is missed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import mean

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' shard builders
import example_shards

from rufus_data.rewards import build_reward
from rufus_train import modeling
from rufus_train.config_loading import load_stage_config
from rufus_train.mask import loss_mask
from rufus_train.runner import run_stage
from rufus_train.stages import get_stage

BUDGET_S = 15 * 60
HELD_OUT = 64
MODEL = "smollm2-135m"
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VERIFIER = {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}
CRITERIA = {"rl_reward_gain": 0.15, "rl_accuracy_gain": 0.10}


def stage_run(stage: str, data: Path, out: Path, **settings) -> dict:
    """One stage from the base model with LoRA on every linear layer; returns its metrics and time."""
    overrides = {"model": MODEL, "data": [str(data)], "output_dir": str(out), "overwrite": True,
                 "gradient_checkpointing": False, "logging_steps": 1, "save_steps": 10_000, "seed": 0,
                 "lora.r": 16, "lora.target_modules": ALL_LINEAR, **settings}
    config = load_stage_config(stage, get_stage(stage).config_class, overrides=overrides)
    started = time.time()
    result = run_stage(config)
    return {"metrics": result.metrics, "train_s": round(time.time() - started, 1), "steps": result.global_step}


# ------------------------------------------------------------------ held-out measures


def chat(question: str, answer: str | None = None) -> list[dict]:
    turns = [{"role": "user", "content": example_shards.calculation_question(question)}]
    return turns + ([{"role": "assistant", "content": answer}] if answer is not None else [])


@torch.no_grad()
def answer_logps(model, tokenizer, conversations: list[list[dict]], batch_size: int = 32) -> tuple[list[float], list[int]]:
    """Sum of log-probs of each conversation's assistant tokens (the SFT loss mask), and how many there are."""
    sums, counts = [], []
    examples_ = [loss_mask(tokenizer, messages, assistant_only=True, max_length=None) for messages in conversations]
    for start in range(0, len(examples_), batch_size):
        batch = examples_[start:start + batch_size]
        width = max(len(e.input_ids) for e in batch)
        ids = torch.tensor([e.input_ids + [tokenizer.pad_token_id] * (width - len(e.input_ids)) for e in batch])
        attention = torch.tensor([[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in batch])
        loss = torch.tensor([e.loss_mask + [0] * (width - len(e.loss_mask)) for e in batch], dtype=torch.bool)
        logps = torch.log_softmax(model(ids, attention_mask=attention).logits[:, :-1].float(), dim=-1)
        picked = logps.gather(2, ids[:, 1:, None])[..., 0] * loss[:, 1:]
        sums += picked.sum(1).tolist()
        counts += loss[:, 1:].sum(1).tolist()
    return sums, counts


def held_out_loss(model, tokenizer, items) -> float:
    sums, counts = answer_logps(model, tokenizer, [chat(e, f"{e} = {v}") for e, v in items])
    return -sum(sums) / sum(counts)


def preference_accuracy(model, tokenizer, pairs: list[tuple[str, str, str]]) -> float:
    chosen, _ = answer_logps(model, tokenizer, [chat(e, c) for e, c, _ in pairs])
    rejected, _ = answer_logps(model, tokenizer, [chat(e, r) for e, _, r in pairs])
    return sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(pairs)


@torch.no_grad()
def greedy_accuracy(model, tokenizer, items, max_new_tokens: int, batch_size: int = 32) -> float:
    """Greedy answers to the held-out questions, scored by the RL stage's own verifier."""
    tokenizer.padding_side = "left"
    reward = build_reward(VERIFIER)
    texts = []
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        prompts = [tokenizer.apply_chat_template(chat(e), tokenize=False, add_generation_prompt=True) for e, _ in batch]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        texts += tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    scores = reward(completions=texts, expected_output=[v for _, v in items])
    return sum(s or 0.0 for s in scores) / len(items)


def loaded(ref: str):
    model = modeling.load_model(ref, "float32")
    model.eval()
    return model


# ------------------------------------------------------------------ the check


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="runs/learning_check", help="folder for shards, runs and the report")
    parser.add_argument("--max-operand", type=int, default=25, help="the task: calculations on numbers up to this")
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--rl-batch", type=int, default=16, help="completions a step: 4 prompts x 4 samples")
    parser.add_argument("--rl-learning-rate", type=float, default=2e-4)
    parser.add_argument("--rl-temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=16, help="RL completions and greedy answers")
    parser.add_argument("--overlong-cache", type=int, default=6, help="DAPO buffer: the last N of max-new-tokens")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    data_root = Path(os.environ.get("RUFUS_DATA_ROOT", "/work/shared/data"))
    work = Path(args.work)
    started = time.time()

    items = example_shards.gsm8k_calculations(data_root, HELD_OUT + 128 + 128 + 256, max_operand=args.max_operand)
    held_out, sft_items, dpo_items, rl_items = items[:64], items[64:192], items[192:320], items[320:]
    sft_data = example_shards.calculation_sft(sft_items, work / "shards" / "sft")
    dpo_data = example_shards.calculation_preference(dpo_items, work / "shards" / "dpo")
    rl_data = example_shards.calculation_rl(rl_items, work / "shards" / "rl")
    pairs = [(e, *example_shards.calculation_pair(e, v, f"held-{i}")) for i, (e, v) in enumerate(held_out)]

    tokenizer = modeling.load_tokenizer(MODEL)
    base = loaded(MODEL)
    before = {"sft_loss": held_out_loss(base, tokenizer, held_out),
              "dpo_accuracy": preference_accuracy(base, tokenizer, pairs),
              "rl_accuracy": greedy_accuracy(base, tokenizer, held_out, args.max_new_tokens)}
    print(f"base: {before}", flush=True)

    sft = stage_run("sft", sft_data, work / "sft", max_steps=12, per_device_train_batch_size=8, learning_rate=1e-4,
                    max_length=128)
    dpo = stage_run("dpo", dpo_data, work / "dpo", max_steps=12, per_device_train_batch_size=4, learning_rate=2e-4,
                    max_length=128)
    rl = stage_run("reasoning_rl", rl_data, work / "rl", max_steps=args.rl_steps, per_device_train_batch_size=args.rl_batch,
                   num_generations=4, max_completion_length=args.max_new_tokens, temperature=args.rl_temperature,
                   learning_rate=args.rl_learning_rate, overlong_cache=args.overlong_cache, rewards=[VERIFIER])
    after = {"sft_loss": held_out_loss(loaded(str(work / "sft")), tokenizer, held_out),
             "dpo_accuracy": preference_accuracy(loaded(str(work / "dpo")), tokenizer, pairs),
             "rl_accuracy": greedy_accuracy(loaded(str(work / "rl")), tokenizer, held_out, args.max_new_tokens)}
    rewards = [m["reward"] for m in rl["metrics"] if "reward" in m]
    correct = [m["rewards/string_match_last_number/mean"] for m in rl["metrics"] if "reward" in m]
    clipped = [m["completions/clipped_ratio"] for m in rl["metrics"] if "reward" in m]
    first, last = mean(rewards[:5]), mean(rewards[-5:])
    total = time.time() - started
    checks = {
        "sft lowers the held-out loss": after["sft_loss"] < before["sft_loss"],
        "dpo raises the held-out preference accuracy": after["dpo_accuracy"] > before["dpo_accuracy"],
        f"rl mean reward, last 5 steps - first 5 >= {CRITERIA['rl_reward_gain']}": last - first >= CRITERIA["rl_reward_gain"],
        f"rl greedy held-out accuracy gain >= {CRITERIA['rl_accuracy_gain']:.0%}":
            after["rl_accuracy"] - before["rl_accuracy"] >= CRITERIA["rl_accuracy_gain"] - 1e-9,
        f"within {BUDGET_S // 60} minutes": total <= BUDGET_S,
    }
    report = {"before": before, "after": after, "rl_rewards": rewards, "rl_first5": first, "rl_last5": last,
              "rl_correct": correct, "rl_clipped": clipped,
              "train_s": {"sft": sft["train_s"], "dpo": dpo["train_s"], "reasoning_rl": rl["train_s"]},
              "total_s": round(total, 1), "checks": checks,
              "sft_losses": [m["loss"] for m in sft["metrics"] if "loss" in m],
              "dpo_losses": [m["loss"] for m in dpo["metrics"] if "loss" in m]}
    (work / "learning_check.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown_table(report)
    (work / "learning_check.md").write_text(table)
    plot(report, work / "learning_check.png")
    print(table)
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    raise SystemExit(0 if all(checks.values()) else 1)


def markdown_table(report: dict) -> str:
    b, a, t = report["before"], report["after"], report["train_s"]
    rows = [
        "| stage | held-out measure (64 items) | base | after | train_s |",
        "|---|---|---|---|---|",
        f"| sft | loss on the answer tokens | {b['sft_loss']:.3f} | {a['sft_loss']:.3f} | {t['sft']} |",
        f"| dpo | preference accuracy (chosen log-prob > rejected) | {b['dpo_accuracy']:.3f} | {a['dpo_accuracy']:.3f} | {t['dpo']} |",
        f"| reasoning_rl | greedy accuracy (string_match) | {b['rl_accuracy']:.3f} | {a['rl_accuracy']:.3f} | {t['reasoning_rl']} |",
        f"| reasoning_rl | mean reward (verifier + overlong penalty), first 5 -> last 5 steps | {report['rl_first5']:.3f} | {report['rl_last5']:.3f} | |",
        f"| reasoning_rl | of which the verifier, first 5 -> last 5 steps | {mean(report['rl_correct'][:5]):.3f} | {mean(report['rl_correct'][-5:]):.3f} | |",
        f"| reasoning_rl | completions cut at the limit, first 5 -> last 5 steps | {mean(report['rl_clipped'][:5]):.3f} | {mean(report['rl_clipped'][-5:]):.3f} | |",
    ]
    return "\n".join(rows) + f"\n\ntotal {report['total_s'] / 60:.1f} min\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib  # heavy, and only for the picture

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    curves = [("sft: training loss", report["sft_losses"]), ("dpo: training loss", report["dpo_losses"]),
              ("reasoning_rl: reward per step (verifier + overlong)", report["rl_rewards"])]
    for ax, (title, values) in zip(axes, curves, strict=True):
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
    rl = report["rl_rewards"]
    axes[2].plot(range(1, len(rl) + 1), report["rl_correct"], marker="o", markersize=3, label="verifier alone")
    axes[2].hlines([report["rl_first5"], report["rl_last5"]], [1, len(rl) - 4], [5, len(rl)], colors="C2",
                   label="mean of 5 steps")
    axes[2].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
