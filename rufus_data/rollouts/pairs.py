"""`rufus-data pairs`: preference pairs from sampled answers, in TRL's conversational format.

Three ways to get a chosen and a rejected answer per prompt:
- strong vs weak (`--strong A --weak B`): A's answer chosen, B's rejected;
- on-policy (`--policy M --k 4 --reward SPEC`): the best passing (reward >= pass_threshold) of
  M's k samples chosen, the worst failing one rejected; prompts without both a passing and a
  failing sample (all pass, all fail, or all score the same) give no pair;
- `--perturb-answer`: rejected = chosen with only its final number changed (Tulu 3's GSM8K
  recipe: the same reasoning ending in a wrong answer); chosen comes from --strong, from a
  passing --policy sample, or else from the row's reference answer (`solution`, else
  `expected_output`).

The input is shard folders or catalogs (mixed first), by default catalogs/rl.yaml; `--limit N`
takes a seeded sample. Rewards are --reward, or else each row's own source's reward (the
`reward_spec` column; rewards/data_rewards.py), or none (strong vs weak and perturbed pairs need
none).

Pairs whose answers are identical, or tie under the reward(s), are dropped and counted; when the
reward ranks the rejected answer higher (a strong model that got it wrong, a weak one that got it
right) the two are swapped and counted (`swapped_by_reward`): the verifier outranks the model
order. `--require-verified` keeps only pairs whose chosen passes and rejected fails. Generation is
journaled per prompt and model (resumable after a kill) and the output folder is atomic:

    OUT/data/*.parquet   id, source, label, prompt, chosen, rejected, chosen_model, rejected_model,
                         chosen_reward, rejected_reward, pair_method, sampling, chosen_sha256,
                         rejected_sha256, num_tokens (prompt + chosen), num_trainable_tokens
                         (chosen), num_rejected_tokens (prompt + rejected), + the input row's
                         other columns (its prompt-only token counts and pass_rate are replaced)
    OUT/report.md, manifest.json"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa

from rufus_data.base.errors import RufusError
from rufus_data.base.report import markdown_table
from rufus_data.folders.output_step import OutputStep
from rufus_data.folders.shards import read_manifest, write_shards
from rufus_data.generate.backends import check_model, check_prompts_fit, open_generator
from rufus_data.generate.sampling import prompt_seed
from rufus_data.models.builtin import DEFAULT_MODEL
from rufus_data.rewards.data_rewards import declares_rewards, scoring_specs
from rufus_data.rollouts.journal import Journal, run_journaled
from rufus_data.rollouts.options import PairsConfig
from rufus_data.rollouts.prompts import (
    DEFAULT_RL_CATALOG,
    default_out,
    input_folders,
    normalise_prompt,
    read_prompt_rows,
)
from rufus_data.rollouts.scoring import Scorer, known_token_ids
from rufus_data.sources.inputs import data_inputs
from rufus_data.sources.perturb import perturb_final_answer
from rufus_data.sources.tokens import TokenCounter


# --- the run --------------------------------------------------------------------------------
def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_pairs(inputs: list[str | Path] | None, out: str | Path | None, config: PairsConfig,
                overwrite: bool = False) -> dict:
    """Build the pairs; `inputs`: shard folders or catalogs (None: catalogs/rl.yaml); `out` None:
    outputs/<input name>-pairs. Returns the summary that also goes into the manifest."""
    config = config.resolved()  # `auto` decided before the journals' keys are made
    entries = data_inputs(inputs, DEFAULT_RL_CATALOG)
    step = OutputStep("rufus-data pairs", out if out is not None else default_out(entries, "pairs"), overwrite=overwrite)
    out = step.out
    config.method(data_rewards=True)  # refuses a configuration that builds no pairs, before anything loads
    if config.reward:
        Scorer.from_specs(config.reward)  # a bad --reward fails before anything loads
    # which models sample, and how many samples each
    roles: list[tuple[str, str, int, list[str]]] = []
    if config.policy:
        roles.append(("policy", config.policy, config.k, config.base_urls))
    if config.strong:
        roles.append(("strong", config.strong, 1, config.strong_base_urls))
    if config.weak:
        roles.append(("weak", config.weak, 1, config.weak_base_urls))
    for _, model, _, urls in roles:
        check_model(model, config.access(urls))
    partial = out.parent / f".{out.name}.partial"
    folders, catalogs = input_folders(entries, partial)
    rows, prompts, inputs_, _ = read_prompt_rows(folders, config.limit, config.seed)
    if not prompts:
        raise RufusError(f"no prompts in {', '.join(map(str, folders))}: nothing to pair")
    for entry in inputs_:
        entry.update({"catalog": catalogs[entry["path"]]} if entry["path"] in catalogs else {})
    specs, rewards_from = scoring_specs(config.reward, rows) if config.reward or declares_rewards(rows) else ([], "none")
    method = config.method(data_rewards=bool(specs))
    if config.require_verified and not specs:
        raise RufusError("--require-verified needs a reward to verify that chosen passes and rejected fails: pass "
                         "--reward SPEC, or give the rows' sources a `reward:` in their catalog")
    scorer = Scorer.from_specs(specs) if specs else None
    tokenizer = pair_tokenizer(config, folders)
    counter = TokenCounter(tokenizer)
    by_id = {str(r["id"]): r for r in rows}

    def to_record(result) -> dict:
        texts = [c.text for c in result.completions]
        rewards = [None] * len(texts)
        if scorer is not None:
            rewards, _ = scorer.score(by_id[result.prompt.id], result.prompt.messages, texts,
                                      known_token_ids(result.completions))
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
        config_hash = config.config_hash(role, model, n, inputs_, specs)
        journal = Journal(partial / f"pairs-{role}-{config_hash}.jsonl", config_hash)
        todo = [p for p in prompts if p.id not in journal]
        if todo:
            with open_generator(model, config.access(urls)) as generator:
                status = check_prompts_fit(generator, model, todo, sampling)
                generation[role] = run_journaled(generator, prompts, sampling, journal, to_record, description=f"pairs {role}")
                generation[role]["max_model_len_check"] = status
        else:
            generation[role] = {"prompts_total": len(prompts), "prompts_resumed": len(prompts), "prompts_generated": 0}
        samples[role] = {pid: journal.records[pid] for pid in by_id}
        generation[role]["finish_length"] = sum(
            reason == "length" for record in samples[role].values() for reason in record["finish_reasons"])

    pairs, counts = make_pairs(rows, config, method, samples, scorer,
                               encode=lambda text: counter.tokenizer.encode(text, add_special_tokens=False))
    count_pair_tokens(pairs, counter)
    rewards = {"from": rewards_from, "specs": specs, "names": scorer.names if scorer else []}
    summary = write_pairs_output(step, pairs, counts, config, method, inputs_, generation,
                                 rewards=rewards, tokenizer=tokenizer)
    shutil.rmtree(partial, ignore_errors=True)
    return summary


def pair_tokenizer(config: PairsConfig, folders: list[Path]) -> str:
    """The tokenizer that counts a pair's tokens: the model whose answers are chosen (--policy or
    --strong), else the input mix's tokenizer, else the built-in model's."""
    if config.policy or config.strong:
        return config.policy or config.strong
    manifest = read_manifest(folders[0])
    return manifest.get("tokenizer") or (manifest.get("config") or {}).get("policy") or DEFAULT_MODEL


def count_pair_tokens(pairs: list[dict], counter: TokenCounter) -> None:
    """Token counts of each pair, as mix counts preference rows: num_tokens = prompt + chosen,
    num_trainable_tokens = the chosen reply; plus num_rejected_tokens = prompt + rejected. The
    input's prompt-only counts and filter's pass_rate describe another row and are replaced or
    dropped."""
    if not pairs:
        return
    (_, chosen), = counter.count_batches([pairs], "preference")
    rejected_rows = [{"prompt": p["prompt"], "chosen": p["rejected"]} for p in pairs]
    (_, rejected), = counter.count_batches([rejected_rows], "preference")
    for pair, total, trainable, rejected_total in zip(pairs, chosen.total, chosen.trainable, rejected.total, strict=True):
        pair.pop("pass_rate", None)
        pair.update(num_tokens=total, num_trainable_tokens=trainable, num_rejected_tokens=rejected_total)


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
    if method == "reference_perturbed":
        reasons.append("dropped_no_reference_answer")
    if config.require_verified:
        reasons.append("dropped_not_verified")
    return reasons


REFERENCE_COLUMNS = ("solution", "expected_output")  # a row's reference answer, the worked one first


def reference_answer(row: dict) -> tuple[str, str] | None:
    """(the row's reference answer, its column): `solution`, else `expected_output`; None without one."""
    for column in REFERENCE_COLUMNS:
        value = row.get(column)
        if value is not None and not isinstance(value, (str, int, float)):
            continue  # tests or structured gold: no answer text to perturb
        text = None if value is None else str(value)
        if text and text.strip():
            return text, column
    return None


def make_pairs(rows, config: PairsConfig, method: str, samples: dict, scorer, encode=None) -> tuple[list[dict], Counter]:
    """The pairs of `method` from the sampled answers (or the rows' own); `encode`: text -> token
    ids, for length rewards that score an answer no model generated."""

    def score_text(row: dict, text: str) -> float | None:
        return scorer.score(row, _messages(row), [text], [encode(text)] if encode else None)[0][0]

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
        else:  # reference_perturbed
            reference = reference_answer(row)
            if reference is None:
                counts["dropped_no_reference_answer"] += 1
                continue
            chosen, chosen_model = reference[0], f"dataset:{reference[1]}"
            if scorer is not None:
                chosen_reward = score_text(row, chosen)
        if method.endswith("perturbed"):
            rng = random.Random(prompt_seed(config.seed or 0, pid))
            rejected = perturb_final_answer(chosen, rng)
            if rejected is None:
                counts["dropped_no_answer_to_perturb"] += 1
                continue
            rejected_model = f"perturbed:{chosen_model}"
            if scorer is not None:
                rejected_reward = score_text(row, rejected)
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
    return normalise_prompt(row["prompt"], f"row {row.get('id')!r}")


def write_pairs_output(step: OutputStep, pairs, counts: Counter, config: PairsConfig, method: str, inputs, generation,
                       rewards: dict | None = None, tokenizer: str | None = None) -> dict:
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
    rewards = rewards or {"from": "none", "specs": [], "names": []}
    with step.folder() as tmp:
        message = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
        table = pa.Table.from_pylist(pairs) if pairs else pa.table(
            {"id": pa.array([], pa.string()), "prompt": pa.array([], message), "chosen": pa.array([], message),
             "rejected": pa.array([], message)}
        )
        write_shards(table, tmp)
        specs = ", ".join(f"`{json.dumps(spec, sort_keys=True)}`" for spec in rewards["specs"]) or "none"
        lines = [
            "# rufus-data pairs",
            "",
            (f"Method `{method}`; chosen/rejected length ratio (characters): "
             f"{'-' if ratio is None else f'{ratio:.3f}'} (far from 1 means a length bias the trainer can learn)."),
            "",
            (f"Rewards from {rewards['from']}: {specs}. Token counts (num_tokens = prompt + chosen, "
            f"num_rejected_tokens = prompt + rejected) with the tokenizer of `{tokenizer}`."),
            "",
            markdown_table(["count", "value"], sorted(counts.items())),
            "## Generation",
            "",
            markdown_table(
                ["model role", "prompts", "resumed", "generated", "tokens/s", "finish=length", "max_model_len check"],
                [[role, g.get("prompts_total"), g.get("prompts_resumed"), g.get("prompts_generated"),
                  g.get("tokens_per_s", "-"), g.get("finish_length", "-"), g.get("max_model_len_check", "-")]
                 for role, g in generation.items()],
            ) if generation else "No model sampled (the pairs come from the rows' reference answers).\n",
        ]
        manifest = step.manifest(
            config=config.model_dump(), inputs=inputs, counts=summary["counts"],
            versions=("transformers", "torch", "httpx"), seed=config.seed, generation=generation, rewards=rewards,
            tokenizer=tokenizer, **{key: value for key, value in summary.items() if key != "counts"},
        )
        step.finish(tmp, manifest, "\n".join(lines) + "\n")
    return {**summary, "out": str(step.out)}
