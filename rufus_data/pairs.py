"""`rufus-data pairs`: preference pairs from sampled answers, in TRL's conversational format.

Three ways to get a chosen and a rejected answer per prompt:
- strong vs weak (`--strong A --weak B`): A's answer chosen, B's rejected;
- on-policy (`--policy M --k 4 --reward SPEC`): the best passing (reward >= pass_threshold) of
  M's k samples chosen, the worst failing one rejected; prompts without both a passing and a
  failing sample (all pass, all fail, or all score the same) give no pair;
- `--perturb-answer`: rejected = chosen with only its final number changed (Tulu 3's GSM8K
  recipe: the same reasoning ending in a wrong answer); chosen comes from --strong, from a
  passing --policy sample, or else from the row's `solution` column.

Pairs whose answers are identical, or tie under the reward(s), are dropped and counted; when the
reward ranks the rejected answer higher (a strong model that got it wrong, a weak one that got it
right) the two are swapped and counted (`swapped_by_reward`): the verifier outranks the model
order. `--require-verified` keeps only pairs whose chosen passes and rejected fails. Generation is
journaled per prompt and model (resumable after a kill) and the output folder is atomic:

    OUT/data/*.parquet   id, source, label, prompt, chosen, rejected, chosen_model, rejected_model,
                         chosen_reward, rejected_reward, pair_method, sampling, chosen_sha256,
                         rejected_sha256, + the input row's other columns
    OUT/report.md, manifest.json"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Annotated

import pyarrow as pa
from pydantic import Field

from rufus_data.cli_options import Flag
from rufus_data.errors import RufusError
from rufus_data.generate import check_prompts_fit, open_generator, prompt_seed
from rufus_data.generate.journal import Journal, run_journaled
from rufus_data.generate.options import GenerationOptions, RewardSpecs
from rufus_data.generate.prompts import read_prompt_rows
from rufus_data.output_step import OutputStep
from rufus_data.report import markdown_table
from rufus_data.shards import write_shards


class PairsConfig(GenerationOptions):
    strong: str | None = Field(None, description="model whose answers are chosen")
    weak: str | None = Field(None, description="model whose answers are rejected")
    policy: str | None = Field(None, description="on-policy pairs: a passing vs a failing sample of k (needs --reward)")
    k: int = Field(4, ge=1, description="on-policy samples per prompt")
    reward: RewardSpecs = Field(default_factory=list)
    perturb_answer: bool = Field(False, description="rejected = chosen with its final number changed")
    require_verified: bool = Field(False, description="keep only chosen-passes/rejected-fails")
    pass_threshold: float = Field(1.0, description="a sample passes when its reward is at least this")
    temperature: float = Field(0.7, description="sampling temperature")
    strong_base_urls: Annotated[list[str], Flag("--strong-base-url")] = Field(
        default_factory=list, description="server backend: URL of --strong (default: --base-url)"
    )
    weak_base_urls: Annotated[list[str], Flag("--weak-base-url")] = Field(
        default_factory=list, description="server backend: URL of --weak (default: --base-url)"
    )

    def method(self) -> str:
        if self.policy:
            if self.strong or self.weak:
                raise RufusError("give either --policy (on-policy pairs) or --strong/--weak, not both")
            if not self.reward:
                raise RufusError("on-policy pairs (--policy) need --reward to tell passing from failing samples")
            return "on_policy_perturbed" if self.perturb_answer else "on_policy"
        if self.strong and self.weak:
            if self.perturb_answer:
                raise RufusError("--perturb-answer replaces the weak model: drop --weak or --perturb-answer")
            return "strong_vs_weak"
        if self.strong and self.perturb_answer:
            return "strong_perturbed"
        if self.strong or self.weak:
            raise RufusError("strong-vs-weak pairs need both --strong and --weak (or --strong with --perturb-answer)")
        if self.perturb_answer:
            return "solution_perturbed"
        raise RufusError(
            "say how to build pairs: --strong A --weak B, --policy M --k 4 --reward SPEC, or --perturb-answer"
        )

    def config_hash(self, role: str, model: str, n: int, inputs: list[dict]) -> str:
        return self.run_hash(n, inputs, role=role, model=model, reward=self.reward)


# --- perturbing a final answer --------------------------------------------------------------
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_FINAL_PATTERNS = (
    re.compile(r"####\s*\$?(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"(" + _NUMBER + ")"),
)


def perturb_final_answer(text: str, rng: random.Random) -> str | None:
    """`text` with only its final answer changed to another number (None: no number to change).

    The final answer is the number after the last `####`, else in the last `\\boxed{}`, else the
    last number in the text; it moves by a random non-zero amount, keeping its sign and decimals."""
    for pattern in _FINAL_PATTERNS:
        matches = list(pattern.finditer(text))
        if matches:
            match = matches[-1]
            break
    else:
        return None
    original = match.group(1)
    plain = original.replace(",", "")
    decimals = len(plain.split(".", 1)[1]) if "." in plain else 0
    value = float(plain)
    delta = rng.choice([d for d in range(-10, 11) if d != 0])
    new = value + delta
    if value >= 0 and new < 0:
        new = value + abs(delta)
    replacement = f"{new:.{decimals}f}" if decimals else str(round(new))
    if plain.startswith("+"):
        replacement = "+" + replacement
    return text[: match.start(1)] + replacement + text[match.end(1) :]


# --- the run --------------------------------------------------------------------------------
def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_pairs(shards: list[str | Path], out: str | Path, config: PairsConfig, overwrite: bool = False) -> dict:
    step = OutputStep("rufus-data pairs", out, overwrite=overwrite)
    out = step.out
    method = config.method()
    if config.require_verified and not config.reward:
        raise RufusError("--require-verified needs --reward to verify that chosen passes and rejected fails")
    scorer = None
    if config.reward:
        from rufus_data.generate.scoring import Scorer

        scorer = Scorer.from_specs(config.reward)
    rows, prompts, inputs, _ = read_prompt_rows(shards)
    if not prompts:
        raise RufusError(f"no prompts in {', '.join(map(str, shards))}: nothing to pair")
    by_id = {str(r["id"]): r for r in rows}
    partial = out.parent / f".{out.name}.partial"

    # which models sample, and how many samples each
    roles: list[tuple[str, str, int, list[str]]] = []
    if config.policy:
        roles.append(("policy", config.policy, config.k, config.base_urls))
    if config.strong:
        roles.append(("strong", config.strong, 1, config.strong_base_urls))
    if config.weak:
        roles.append(("weak", config.weak, 1, config.weak_base_urls))

    def to_record(result) -> dict:
        texts = [c.text for c in result.completions]
        rewards = [None] * len(texts)
        if scorer is not None:
            rewards, _ = scorer.score(by_id[result.prompt.id], result.prompt.messages, texts)
        return {
            "texts": texts,
            "num_tokens": [c.num_tokens for c in result.completions],
            "finish_reasons": [c.finish_reason for c in result.completions],
            "rewards": rewards,
        }

    samples: dict[str, dict[str, dict]] = {}
    generation = {}
    for role, model, n, urls in roles:
        sampling = config.sampling(n)
        config_hash = config.config_hash(role, model, n, inputs)
        journal = Journal(partial / f"pairs-{role}-{config_hash}.jsonl", config_hash)
        todo = [p for p in prompts if p.id not in journal]
        if todo:
            with open_generator(model, config.backend_config(urls)) as generator:
                status = check_prompts_fit(generator, model, todo, sampling)
                generation[role] = run_journaled(generator, prompts, sampling, journal, to_record, description=f"pairs {role}")
                generation[role]["max_model_len_check"] = status
        else:
            generation[role] = {"prompts_total": len(prompts), "prompts_resumed": len(prompts), "prompts_generated": 0}
        samples[role] = journal.records

    pairs, counts = make_pairs(rows, config, method, samples, scorer)
    summary = write_pairs_output(step, pairs, counts, config, method, inputs, generation)
    shutil.rmtree(partial, ignore_errors=True)
    return summary


def report_counters(config: PairsConfig, method: str, scored: bool) -> list[str]:
    """The counters a run of `method` can move, shown in the report even when 0."""
    reasons = ["prompts", "pairs", "dropped_identical"]
    if scored:
        reasons += ["dropped_tied", "swapped_by_reward"]
    if method == "on_policy":
        reasons += ["dropped_unscored", "dropped_no_pass_fail_split"]
    if method == "on_policy_perturbed":
        reasons += ["dropped_unscored", "dropped_no_passing_sample"]
    if method.endswith("perturbed"):
        reasons.append("dropped_no_answer_to_perturb")
    if method == "solution_perturbed":
        reasons.append("dropped_no_solution")
    if config.require_verified:
        reasons.append("dropped_not_verified")
    return reasons


def make_pairs(rows, config: PairsConfig, method: str, samples: dict, scorer) -> tuple[list[dict], Counter]:
    counts: Counter = Counter(dict.fromkeys(report_counters(config, method, scorer is not None), 0))
    pairs = []
    sampling_json = json.dumps(
        {role: config.sampling(config.k if role == "policy" else 1).to_dict() for role in samples}, sort_keys=True
    )
    for row in rows:
        pid = str(row["id"])
        counts["prompts"] += 1
        chosen = rejected = None
        chosen_model = rejected_model = None
        chosen_reward = rejected_reward = None
        if method.startswith("on_policy"):
            record = samples["policy"][pid]
            scored = [(r, i) for i, r in enumerate(record["rewards"]) if r is not None]
            if not scored:
                counts["dropped_unscored"] += 1
                continue
            passing = [s for s in scored if s[0] >= config.pass_threshold]
            failing = [s for s in scored if s[0] < config.pass_threshold]
            if not passing or (method == "on_policy" and not failing):
                # all samples pass, or all fail (equal scores included): nothing to contrast
                counts["dropped_no_passing_sample" if method == "on_policy_perturbed" else "dropped_no_pass_fail_split"] += 1
                continue
            best = max(passing, key=lambda x: (x[0], -x[1]))  # the best passing sample, first on ties
            chosen, chosen_reward, chosen_model = record["texts"][best[1]], best[0], config.policy
            if method == "on_policy":
                worst = min(failing, key=lambda x: (x[0], x[1]))  # the worst failing sample
                rejected, rejected_reward, rejected_model = record["texts"][worst[1]], worst[0], config.policy
        elif method.startswith("strong"):
            record = samples["strong"][pid]
            chosen, chosen_reward, chosen_model = record["texts"][0], record["rewards"][0], config.strong
            if method == "strong_vs_weak":
                weak = samples["weak"][pid]
                rejected, rejected_reward, rejected_model = weak["texts"][0], weak["rewards"][0], config.weak
        else:  # solution_perturbed
            solution = row.get("solution")
            if not isinstance(solution, str) or not solution.strip():
                counts["dropped_no_solution"] += 1
                continue
            chosen, chosen_model = solution, "dataset:solution"
            if scorer is not None:
                chosen_reward = scorer.score(row, _messages(row), [chosen])[0][0]
        if method.endswith("perturbed"):
            rng = random.Random(prompt_seed(config.seed or 0, pid))
            rejected = perturb_final_answer(chosen, rng)
            if rejected is None:
                counts["dropped_no_answer_to_perturb"] += 1
                continue
            rejected_model = f"perturbed:{chosen_model}"
            if scorer is not None:
                rejected_reward = scorer.score(row, _messages(row), [rejected])[0][0]
        if chosen.strip() == rejected.strip():
            counts["dropped_identical"] += 1
            continue
        if scorer is not None and chosen_reward is not None and chosen_reward == rejected_reward:
            counts["dropped_tied"] += 1
            continue
        if scorer is not None and chosen_reward is not None and rejected_reward is not None and chosen_reward < rejected_reward:
            chosen, rejected = rejected, chosen  # the verifier outranks the model order
            chosen_model, rejected_model = rejected_model, chosen_model
            chosen_reward, rejected_reward = rejected_reward, chosen_reward
            counts["swapped_by_reward"] += 1
        if config.require_verified:
            passes = chosen_reward is not None and chosen_reward >= config.pass_threshold
            fails = rejected_reward is not None and rejected_reward < config.pass_threshold
            if not (passes and fails):
                counts["dropped_not_verified"] += 1
                continue
        pairs.append(
            {
                **{key: value for key, value in row.items() if key not in ("prompt", "chosen", "rejected")},
                "id": pid,
                "prompt": _messages(row),
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
                "chosen_model": chosen_model,
                "rejected_model": rejected_model,
                "chosen_reward": chosen_reward,
                "rejected_reward": rejected_reward,
                "pair_method": method,
                "sampling": sampling_json,
                "chosen_sha256": _text_hash(chosen),
                "rejected_sha256": _text_hash(rejected),
            }
        )
        counts["pairs"] += 1
    return pairs, counts


def _messages(row: dict) -> list[dict]:
    from rufus_data.generate.prompts import normalise_prompt

    return normalise_prompt(row["prompt"], f"row {row.get('id')!r}")


def write_pairs_output(step: OutputStep, pairs, counts: Counter, config: PairsConfig, method: str, inputs, generation) -> dict:
    """Write the pairs as shards, with report.md and manifest.json, atomically; returns the summary."""
    chosen_chars = [len(p["chosen"][0]["content"]) for p in pairs]
    rejected_chars = [len(p["rejected"][0]["content"]) for p in pairs]
    ratio = (sum(chosen_chars) / sum(rejected_chars)) if pairs and sum(rejected_chars) else None
    summary = {
        "method": method,
        "counts": dict(sorted(counts.items())),
        "chosen_rejected_length_ratio": None if ratio is None else round(ratio, 4),
        "mean_chosen_chars": round(sum(chosen_chars) / len(pairs), 1) if pairs else None,
        "mean_rejected_chars": round(sum(rejected_chars) / len(pairs), 1) if pairs else None,
    }
    with step.folder() as tmp:
        message = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
        table = pa.Table.from_pylist(pairs) if pairs else pa.table(
            {"id": pa.array([], pa.string()), "prompt": pa.array([], message), "chosen": pa.array([], message),
             "rejected": pa.array([], message)}
        )
        write_shards(table, tmp)
        lines = [
            "# rufus-data pairs",
            "",
            (f"Method `{method}`; chosen/rejected length ratio (characters): "
            f"{'-' if ratio is None else f'{ratio:.3f}'} (far from 1 means a length bias the trainer can learn)."),
            "",
            markdown_table(["count", "value"], sorted(counts.items())),
            "## Generation",
            "",
            markdown_table(
                ["model role", "prompts", "resumed", "generated", "tokens/s", "max_model_len check"],
                [[role, g.get("prompts_total"), g.get("prompts_resumed"), g.get("prompts_generated"),
                  g.get("tokens_per_s", "-"), g.get("max_model_len_check", "-")] for role, g in generation.items()],
            ),
        ]
        manifest = step.manifest(
            config=config.model_dump(), inputs=inputs, counts=summary["counts"],
            versions=("transformers", "torch", "httpx"), seed=config.seed, generation=generation,
            **{key: value for key, value in summary.items() if key != "counts"},
        )
        step.finish(tmp, manifest, "\n".join(lines) + "\n")
    return {**summary, "out": str(step.out)}
