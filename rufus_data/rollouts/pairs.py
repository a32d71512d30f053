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
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rufus_data.base.errors import RufusError
from rufus_data.base.report import markdown_table
from rufus_data.base.yaml_config import settings_model
from rufus_data.folders.output_step import OutputStep, StepResult
from rufus_data.folders.shards import read_manifest, write_shards
from rufus_data.generate.backends import (
    check_model,
    check_prompts_fit,
    generator_thinking,
    model_to_load,
    open_generator,
)
from rufus_data.generate.sampling import prompt_seed
from rufus_data.models.builtin import DEFAULT_MODEL
from rufus_data.models.reference import ModelRef
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


def build_pairs(inputs: list[str | Path] | None = None, out: str | Path | None = None,
                settings: PairsConfig | dict | str | Path | None = None, *, overwrite: bool = False,
                show_progress: bool = False) -> StepResult:
    """Build the pairs. `inputs`: shard folders or catalogs (None: catalogs/rl.yaml); `out` None:
    outputs/<input name>-pairs; `settings`: PairsConfig, or a dict or YAML file of its fields."""
    config = settings_model(PairsConfig, settings).resolved()  # `auto` decided before the journals' keys are made
    entries = data_inputs(inputs, DEFAULT_RL_CATALOG)
    step = OutputStep("rufus-data pairs", out if out is not None else default_out(entries, "pairs"), overwrite=overwrite)
    roles = _sampling_roles(config)
    partial = step.out.parent / f".{step.out.name}.partial"
    folders, catalogs = input_folders(entries, partial, show_progress)
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
    samples, generation = {}, {}
    for role, model, loadable, n, urls in roles:
        config_hash = config.config_hash(role, model, n, inputs_, specs)
        journal = Journal(partial / f"pairs-{role}-{config_hash}.jsonl", config_hash)
        generation[role] = _sample(config, loadable, n, urls, prompts, journal, rows, scorer, f"pairs {role}", show_progress)
        samples[role] = {str(row["id"]): journal.records[str(row["id"])] for row in rows}
        generation[role]["finish_length"] = sum(
            reason == "length" for record in samples[role].values() for reason in record["finish_reasons"])
    tokenizer = pair_tokenizer(config, folders)
    counter = TokenCounter(tokenizer, masks="if_any")
    pairs, counts = make_pairs(rows, config, method, samples, scorer,
                               encode=lambda text: counter.tokenizer.encode(text, add_special_tokens=False))
    count_pair_tokens(pairs, counter)
    rewards = {"from": rewards_from, "specs": specs, "names": scorer.names if scorer else []}
    result = write_pairs_output(step, pairs, counts, config, method, inputs_, generation, rewards=rewards,
                                tokenizer=tokenizer)
    shutil.rmtree(partial, ignore_errors=True)
    return result


def _sampling_roles(config: PairsConfig) -> list[tuple[str, str, str | ModelRef, int, list[str]]]:
    """(role, model as given, the model to load, samples per prompt, server URLs) of each model that
    samples, after refusing a configuration that builds no pairs, a bad --reward or a model that
    cannot load (nothing loads)."""
    config.method(data_rewards=True)
    if config.reward:
        Scorer.from_specs(config.reward)
    roles = []
    if config.policy:
        roles.append(("policy", config.policy, config.k, config.base_urls))
    if config.strong:
        roles.append(("strong", config.strong, 1, config.strong_base_urls))
    if config.weak:
        roles.append(("weak", config.weak, 1, config.weak_base_urls))
    resolved = []
    for role, model, n, urls in roles:
        loadable = model_to_load(model, config.access(urls))
        check_model(loadable, config.access(urls))
        generator_thinking(loadable, config.access(urls), config.thinking)  # a mode the template cannot take: refused now
        resolved.append((role, model, loadable, n, urls))
    return resolved


def _sample(config: PairsConfig, model: str | ModelRef, n: int, urls: list[str], prompts: list, journal: Journal, rows: list[dict],
            scorer: Scorer | None, description: str, show_progress: bool) -> dict:
    """`n` answers of `model` to each prompt the journal lacks, scored into it; returns the timings."""
    todo = [p for p in prompts if p.id not in journal]
    if not todo:
        return {"prompts_total": len(prompts), "prompts_resumed": len(prompts), "prompts_generated": 0}
    by_id = {str(r["id"]): r for r in rows}
    sampling = config.sampling(n)
    with open_generator(model, config.access(urls), config.thinking) as generator:
        status = check_prompts_fit(generator, model, todo, sampling)
        timings = run_journaled(generator, prompts, sampling, journal, lambda result: _answers_record(scorer, by_id, result),
                                description=description, show_progress=show_progress)
    return {**timings, "max_model_len_check": status}


def _answers_record(scorer: Scorer | None, by_id: dict[str, dict], result) -> dict:
    """A prompt's journal record: the answers, their token counts, finish reasons and rewards (None unscored)."""
    texts = [c.text for c in result.completions]
    rewards = [None] * len(texts)
    if scorer is not None:
        rewards, _ = scorer.score(by_id[result.prompt.id], result.prompt.messages, texts, known_token_ids(result.completions))
    return {
        "texts": texts,
        "num_tokens": [c.num_tokens for c in result.completions],
        "finish_reasons": [c.finish_reason for c in result.completions],
        "rewards": rewards,
    }


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


@dataclass
class Answer:
    """One side of a pair: its text, the model (or dataset column) it came from, and its reward."""

    text: str
    model: str | None
    reward: float | None = None


def make_pairs(rows, config: PairsConfig, method: str, samples: dict, scorer, encode=None) -> tuple[list[dict], Counter]:
    """The pairs of `method` from the sampled answers (or the rows' own); `encode`: text -> token
    ids, for length rewards that score an answer no model generated."""

    def score_text(row: dict, text: str) -> float | None:
        if scorer is None:
            return None
        return scorer.score(row, _messages(row), [text], [encode(text)] if encode else None)[0][0]

    counts: Counter = Counter(dict.fromkeys(report_counters(config, method, scorer is not None), 0))
    sampling_json = json.dumps(
        {role: config.sampling(config.k if role == "policy" else 1).to_dict() for role in samples}, sort_keys=True
    )
    pairs = []
    for row in rows:
        counts["prompts"] += 1
        sides = _answers(row, config, method, samples, score_text, counts)
        if sides is not None:
            sides = _ranked(*sides, scorer is not None, config, counts)
        if sides is not None:
            pairs.append(_pair_row(row, *sides, method, sampling_json))
            counts["pairs"] += 1
    return pairs, counts


def _answers(row: dict, config: PairsConfig, method: str, samples: dict, score_text, counts: Counter) -> tuple[Answer, Answer] | None:
    """One row's chosen and rejected answer, before the reward ranks them; None (counted) when it gives none."""
    pid = str(row["id"])
    if method.startswith("on_policy"):
        sides = _on_policy(samples["policy"][pid], config, method, counts)
    elif method.startswith("strong"):
        strong = samples["strong"][pid]
        weak = samples["weak"][pid] if method == "strong_vs_weak" else None
        sides = (Answer(strong["texts"][0], config.strong, strong["rewards"][0]),
                 None if weak is None else Answer(weak["texts"][0], config.weak, weak["rewards"][0]))
    else:  # reference_perturbed
        reference = reference_answer(row)
        if reference is None:
            counts["dropped_no_reference_answer"] += 1
            return None
        sides = (Answer(reference[0], f"dataset:{reference[1]}", score_text(row, reference[0])), None)
    if sides is None or not method.endswith("perturbed"):
        return sides
    chosen = sides[0]
    rejected = perturb_final_answer(chosen.text, random.Random(prompt_seed(config.seed or 0, pid)))
    if rejected is None:
        counts["dropped_no_answer_to_perturb"] += 1
        return None
    return chosen, Answer(rejected, f"perturbed:{chosen.model}", score_text(row, rejected))


def _on_policy(record: dict, config: PairsConfig, method: str, counts: Counter) -> tuple[Answer, Answer | None] | None:
    """The best passing of the policy's samples and, for `on_policy`, the worst failing one."""
    scored = [(r, i) for i, r in enumerate(record["rewards"]) if r is not None]
    if not scored:
        counts["dropped_unscored"] += 1
        return None
    passing = [s for s in scored if s[0] >= config.pass_threshold]
    failing = [s for s in scored if s[0] < config.pass_threshold]
    if not passing or (method == "on_policy" and not failing):
        # all samples pass, or all fail (equal scores included): nothing to contrast
        counts["dropped_no_passing_sample" if method == "on_policy_perturbed" else "dropped_no_pass_fail_split"] += 1
        return None
    best = max(passing, key=lambda x: (x[0], -x[1]))  # the best passing sample, first on ties
    chosen = Answer(record["texts"][best[1]], config.policy, best[0])
    if method != "on_policy":
        return chosen, None
    worst = min(failing, key=lambda x: (x[0], x[1]))  # the worst failing sample
    return chosen, Answer(record["texts"][worst[1]], config.policy, worst[0])


def _ranked(chosen: Answer, rejected: Answer, scored: bool, config: PairsConfig, counts: Counter) -> tuple[Answer, Answer] | None:
    """Identical and tied answers dropped; the two swapped where the reward ranks the rejected one
    higher (the verifier outranks the model order); with --require-verified, only a passing chosen
    against a failing rejected kept. None (counted) for a dropped pair."""
    if chosen.text.strip() == rejected.text.strip():
        counts["dropped_identical"] += 1
        return None
    if scored and chosen.reward is not None and chosen.reward == rejected.reward:
        counts["dropped_tied"] += 1
        return None
    if scored and chosen.reward is not None and rejected.reward is not None and chosen.reward < rejected.reward:
        chosen, rejected = rejected, chosen
        counts["swapped_by_reward"] += 1
    if config.require_verified:
        passes = chosen.reward is not None and chosen.reward >= config.pass_threshold
        fails = rejected.reward is not None and rejected.reward < config.pass_threshold
        if not (passes and fails):
            counts["dropped_not_verified"] += 1
            return None
    return chosen, rejected


def _pair_row(row: dict, chosen: Answer, rejected: Answer, method: str, sampling_json: str) -> dict:
    """The output row: the input row's other columns, the conversation and where each answer came from."""
    return {
        **{key: value for key, value in row.items() if key not in ("prompt", "chosen", "rejected")},
        "id": str(row["id"]),
        "prompt": _messages(row),
        "chosen": [{"role": "assistant", "content": chosen.text}],
        "rejected": [{"role": "assistant", "content": rejected.text}],
        "chosen_model": chosen.model,
        "rejected_model": rejected.model,
        "chosen_reward": chosen.reward,
        "rejected_reward": rejected.reward,
        "pair_method": method,
        "sampling": sampling_json,
        "chosen_sha256": _text_hash(chosen.text),
        "rejected_sha256": _text_hash(rejected.text),
    }


def _messages(row: dict) -> list[dict]:
    return normalise_prompt(row["prompt"], f"row {row.get('id')!r}")


def write_pairs_output(step: OutputStep, pairs, counts: Counter, config: PairsConfig, method: str, inputs, generation,
                       rewards: dict | None = None, tokenizer: str | None = None) -> StepResult:
    """Write the pairs as shards, with report.md and manifest.json, atomically."""
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
    return StepResult(out=step.out, manifest=manifest, counts=manifest["counts"])
