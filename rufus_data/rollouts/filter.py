"""`rufus-data filter`: keep the RL prompts a policy can learn from.

A GRPO group whose k rewards are all equal has zero advantage and gives no gradient, so each
prompt is sampled k times with the policy, scored with the reward(s), and bucketed by
`rufus_data.rewards.group_outcomes`:

    OUT/all_pass/  learnable/  all_fail/  unscored/   shard folders: the canonical rows + pass_rate
       (constant/ for equal non-0/1 rewards and outside_band/ for learnable prompts outside
        --keep appear only when they have rows)
       each with its own report.md and manifest.json; learnable/ also carries the input's
       `holdout` split (mix's held-out prompts), unfiltered, so it travels on to decontam and training
    OUT/rollouts.parquet   every completion with its reward(s), sampling parameters and model
    OUT/report.md, pass_rate_hist.png, manifest.json

The input is shard folders or catalogs (mixed first); none means the default RL mixture,
catalogs/rl.yaml. Each row is scored by --reward, or else by its own source's reward (the
`reward_spec` column mix writes from a catalog's `reward:`; rewards/data_rewards.py). `--limit N`
takes a seeded sample of N prompts. Generation is resumable per prompt (journal.py)
and the output folder is written atomically. `--from-rollouts DIR` re-buckets DIR's stored
rewards (e.g. with another --keep band) without generating."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.report import markdown_table, pyplot
from rufus_data.base.yaml_config import settings_model
from rufus_data.folders.output_step import OutputStep, StepResult
from rufus_data.folders.shards import DATA_DIR, MANIFEST, read_shards, write_shards
from rufus_data.generate.backends import (
    check_model,
    check_prompts_fit,
    generator_thinking,
    model_to_load,
    open_generator,
)
from rufus_data.generate.sampling import SamplingParams
from rufus_data.models.reference import ModelRef
from rufus_data.rewards.data_rewards import scoring_specs
from rufus_data.rewards.groups import group_outcomes
from rufus_data.rollouts.journal import Journal, run_journaled
from rufus_data.rollouts.options import FilterConfig
from rufus_data.rollouts.prompts import (
    DEFAULT_RL_CATALOG,
    default_out,
    input_folders,
    read_holdout,
    read_prompt_rows,
)
from rufus_data.rollouts.scoring import JudgeWatch, Scorer
from rufus_data.sources.inputs import data_inputs

BUCKETS = ("all_pass", "learnable", "all_fail", "unscored")
EXTRA_BUCKETS = ("constant", "outside_band")
ROLLOUTS = "rollouts.parquet"
HOLDOUT_BUCKET = "learnable"  # the input's holdout split travels with the prompts trained on
PASS_RATE = "pass_rate"


# --- the keep band --------------------------------------------------------------------------
_BAND = re.compile(r"^\s*(?:(?P<lo>[0-9.]+)\s*(?P<lop><=|<)\s*)?p\s*(?:(?P<hip><=|<)\s*(?P<hi>[0-9.]+))?\s*$")
_BAND_GE = re.compile(r"^\s*p\s*(?P<op>>=|>)\s*(?P<v>[0-9.]+)\s*$")


_BAND_SYNTAX = 'write e.g. "0.1<p<0.9", "0.2<=p", "p<=0.5" or "p>0.3", with bounds in [0, 1] and low < high'


def _bound(text: str, band: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RufusError(f"--keep {band!r}: {text!r} is not a number; {_BAND_SYNTAX}") from None
    if not 0 <= value <= 1:
        raise RufusError(f"--keep {band!r}: {value} is outside [0, 1] (a pass rate); {_BAND_SYNTAX}")
    return value


def parse_band(text: str):
    """`"0.1<p<0.9"`, `"0.2<=p"`, `"p<=0.5"`, `"p>0.3"` -> predicate on a pass rate. A malformed,
    inverted (`"0.9<p<0.1"`) or out-of-[0, 1] band raises RufusError naming it and the syntax."""
    match = _BAND.match(text)
    if match and (match["lo"] or match["hi"]):
        lo_v = _bound(match["lo"], text) if match["lo"] else None
        hi_v = _bound(match["hi"], text) if match["hi"] else None
        if lo_v is not None and hi_v is not None and lo_v >= hi_v:
            raise RufusError(f"--keep {text!r} is empty: its low bound {lo_v} is not below its high bound {hi_v}; {_BAND_SYNTAX}")
        lo_ok = (lambda p: True) if lo_v is None else (lambda p: p > lo_v if match["lop"] == "<" else p >= lo_v)
        hi_ok = (lambda p: True) if hi_v is None else (lambda p: p < hi_v if match["hip"] == "<" else p <= hi_v)
        return lambda p: p is not None and lo_ok(p) and hi_ok(p)
    match = _BAND_GE.match(text)
    if match:
        v = _bound(match["v"], text)
        return (lambda p: p is not None and p > v) if match["op"] == ">" else (lambda p: p is not None and p >= v)
    raise RufusError(f"--keep {text!r} is not a pass-rate band: {_BAND_SYNTAX}")


def bucket_of(outcome: str, pass_rate: float | None, keep) -> str:
    """The folder of a prompt: the rewards' group outcome, with learnable ones outside --keep set apart."""
    if outcome == "learnable" and not keep(pass_rate):
        return "outside_band"
    return outcome


# --- generation -----------------------------------------------------------------------------
def partial_dir(out: Path) -> Path:
    """Where the journals of an unfinished run live (beside OUT, removed when OUT is written)."""
    return out.parent / f".{out.name}.partial"


def filter_prompts(inputs: list[str | Path] | None = None, out: str | Path | None = None,
                   settings: FilterConfig | dict | str | Path | None = None, *, overwrite: bool = False,
                   show_progress: bool = False) -> StepResult:
    """Sample, score and bucket. `inputs`: shard folders or catalogs (None: catalogs/rl.yaml); `out`
    None: outputs/<input name>-filtered; `settings`: FilterConfig, or a dict or YAML file of its
    fields (`policy` at least)."""
    config = settings_model(FilterConfig, settings).resolved()  # `auto` decided before the journal's key is made
    entries = data_inputs(inputs, DEFAULT_RL_CATALOG)
    step = OutputStep("rufus-data filter", out if out is not None else default_out(entries, "filtered"), overwrite=overwrite)
    parse_band(config.keep)
    if config.reward:
        Scorer.from_specs(config.reward)  # a bad --reward fails before anything loads
    policy = model_to_load(config.policy, config.access())
    check_model(policy, config.access())
    generator_thinking(policy, config.access(), config.thinking)  # a mode the template cannot take: refused now
    folders, catalogs = input_folders(entries, partial_dir(step.out), show_progress)
    rows, prompts, inputs_, schema = read_prompt_rows(folders, config.limit, config.seed)
    if not prompts:
        raise RufusError(f"no prompts in {', '.join(map(str, folders))}: nothing to filter")
    specs, rewards_from = scoring_specs(config.reward, rows)
    scorer = Scorer.from_specs(specs)
    for entry in inputs_:
        entry.update({"catalog": catalogs[entry["path"]]} if entry["path"] in catalogs else {})
    config_hash = config.rollout_hash(inputs_, specs)
    journal = Journal(partial_dir(step.out) / f"filter-{config_hash}.jsonl", config_hash)
    by_id = {str(r["id"]): r for r in rows}
    _rescore_failed(scorer, by_id, {p.id: p.messages for p in prompts}, journal)
    watch = JudgeWatch(scorer)
    timings, context_status = _generate(config, policy, prompts, journal,
                                        lambda result: watch.checked(_scored(scorer, by_id[result.prompt.id],
                                                                             result.prompt.messages,
                                                                             _completion_dicts(result.completions))),
                                        show_progress)
    scoring = watch.final([journal.records[p.id] for p in prompts], journal.path)
    run = {"config": config.model_dump(), "config_hash": config_hash, "inputs": inputs_, "seed": config.seed,
           "generation": timings, "max_model_len_check": context_status, "scoring": scoring,
           "rewards": {"from": rewards_from, "specs": specs, "names": scorer.names,
                       "weights": dict(zip(scorer.names, scorer.weights, strict=True))}}
    rollouts = rollouts_table(prompts, by_id, journal, config, config.sampling(config.k))
    result = write_filter_output(step, rows, schema, rollouts, config.k, config.keep, config.aggregation, run,
                                 holdout=read_holdout(folders))
    shutil.rmtree(partial_dir(step.out), ignore_errors=True)
    return result


def _generate(config: FilterConfig, policy: str | ModelRef, prompts: list, journal: Journal, to_record, show_progress: bool) -> tuple[dict, str]:
    """k samples of each prompt the journal lacks, scored into it: (timings, max_model_len check)."""
    todo = [p for p in prompts if p.id not in journal]
    if not todo:
        if show_progress:
            console.print(f"all {len(prompts)} prompts already generated in {journal.path}: writing the output")
        return {"prompts_total": len(prompts), "prompts_resumed": len(prompts), "prompts_generated": 0}, "n/a"
    sampling = config.sampling(config.k)
    with open_generator(policy, config.access(), config.thinking) as generator:
        context_status = check_prompts_fit(generator, policy, todo, sampling)
        timings = run_journaled(generator, prompts, sampling, journal, to_record, description=f"filter k={config.k}",
                                show_progress=show_progress)
    return timings, context_status


def _completion_dicts(completions) -> list[dict]:
    return [{"text": c.text, "token_ids": c.token_ids, "num_tokens": c.num_tokens, "finish_reason": c.finish_reason,
             "seed": c.seed, "logprobs": c.logprobs} for c in completions]


def _scored(scorer: Scorer, row: dict, messages: list[dict], completions: list[dict]) -> dict:
    """A prompt's journal record: each completion with its combined reward and each reward's score,
    and the rewards' tally (failed judge requests, unparsable answers: `scoring`)."""
    ids = [c["token_ids"] for c in completions]
    known = ids if all(i or c["num_tokens"] == 0 for i, c in zip(ids, completions, strict=True)) else None
    tally: dict = {}
    combined, per_function = scorer.score(row, messages, [c["text"] for c in completions], known, tally)
    return {
        "completions": [
            {**c, "reward": combined[i], "rewards": {name: scores[i] for name, scores in per_function.items()}}
            for i, c in enumerate(completions)  # num_tokens: from usage where a server sends no token ids
        ],
        "scoring": tally,
    }


def _rescore_failed(scorer: Scorer, by_id: dict, messages: dict, journal: Journal) -> None:
    """Score again the journaled prompts whose judge failed (a rerun after the judge is fixed):
    their completions are kept, not generated again."""
    for prompt_id, record in list(journal.records.items()):
        if prompt_id in messages and any(c.get("failed") or c.get("unparsable") for c in record.get("scoring", {}).values()):
            completions = [{key: c[key] for key in c if key not in ("reward", "rewards")} for c in record["completions"]]
            journal.append({**record, **_scored(scorer, by_id[prompt_id], messages[prompt_id], completions)})


def rollouts_table(prompts, by_id, journal: Journal, config: FilterConfig, sampling: SamplingParams) -> pa.Table:
    """One row per completion, in prompt order then sample order."""
    columns: dict[str, list] = {
        name: []
        for name in (
            "prompt_id", "label", "source", "sample_index", "completion", "token_ids", "num_tokens",
            "finish_reason", "seed", "logprobs", "reward", "rewards", "model", "backend", "sampling",
            "config_hash", "generated_by_pid",
        )
    }
    sampling_json = sampling.to_json()
    for prompt in prompts:
        record = journal.records[prompt.id]
        row = by_id[prompt.id]
        for index, completion in enumerate(record["completions"]):
            columns["prompt_id"].append(prompt.id)
            columns["label"].append(row.get("label"))
            columns["source"].append(row.get("source"))
            columns["sample_index"].append(index)
            columns["completion"].append(completion["text"])
            columns["token_ids"].append(completion["token_ids"])
            columns["num_tokens"].append(completion.get("num_tokens", len(completion["token_ids"])))
            columns["finish_reason"].append(completion["finish_reason"])
            columns["seed"].append(completion["seed"])
            columns["logprobs"].append(completion["logprobs"])
            columns["reward"].append(completion["reward"])
            columns["rewards"].append(json.dumps(completion["rewards"], sort_keys=True))
            columns["model"].append(config.policy)
            columns["backend"].append(config.backend)
            columns["sampling"].append(sampling_json)
            columns["config_hash"].append(journal.config_hash)
            columns["generated_by_pid"].append(record["pid"])
    schema = pa.schema(
        [
            ("prompt_id", pa.string()), ("label", pa.string()), ("source", pa.string()),
            ("sample_index", pa.int32()), ("completion", pa.string()), ("token_ids", pa.list_(pa.int32())),
            ("num_tokens", pa.int32()), ("finish_reason", pa.string()), ("seed", pa.int64()),
            ("logprobs", pa.list_(pa.float32())), ("reward", pa.float64()), ("rewards", pa.string()),
            ("model", pa.string()), ("backend", pa.string()), ("sampling", pa.string()),
            ("config_hash", pa.string()), ("generated_by_pid", pa.int64()),
        ]
    )
    return pa.table(columns, schema=schema)


# --- bucketing and output -------------------------------------------------------------------
def bucket_prompts(rollouts: pa.Table, k: int, keep: str, aggregation: str = "sum_then_normalize",
                   weights: dict[str, float] | None = None) -> dict[str, tuple[str, float | None]]:
    """{prompt id: (bucket, pass rate)} from the stored rewards: each completion's combined reward,
    or under normalize_then_sum each reward's own score (the `rewards` column), weighted by
    `weights` (1.0 where it names none), since GRPO then normalises each reward by itself."""
    band = parse_band(keep)
    ids = rollouts.column("prompt_id").to_pylist()
    combined = rollouts.column("reward").to_pylist()
    per_name = ([json.loads(scores) for scores in rollouts.column("rewards").to_pylist()]
                if aggregation == "normalize_then_sum" else None)
    grouped: dict[str, list[int]] = {}
    for index, pid in enumerate(ids):
        grouped.setdefault(pid, []).append(index)
    result = {}
    for pid, group in grouped.items():
        if len(group) != k:
            raise RufusError(f"rollouts: prompt {pid} has {len(group)} completions, expected k={k}")
        if per_name is None:
            outcome = group_outcomes([combined[i] for i in group], k)[0]
        else:
            names = sorted({name for i in group for name in per_name[i]})
            outcome = group_outcomes([[per_name[i].get(name) for i in group] for name in names], k,
                                     [(weights or {}).get(name, 1.0) for name in names], aggregation=aggregation)[0]
        result[pid] = (bucket_of(outcome.outcome, outcome.p, band), outcome.p)
    return result


def write_filter_output(step: OutputStep, rows: list[dict], schema: pa.Schema, rollouts: pa.Table, k: int, keep: str,
                        aggregation: str, run: dict, holdout: pa.Table | None = None) -> StepResult:
    """Write the bucket folders (input schema + pass_rate; each with report.md and manifest.json),
    the input's holdout split into learnable/, rollouts, report and manifest, atomically.
    `run`: what made the rollouts (config, config_hash, inputs, generation, ...), for the manifest."""
    buckets = bucket_prompts(rollouts, k, keep, aggregation, (run.get("rewards") or {}).get("weights"))
    by_bucket: dict[str, list[dict]] = {b: [] for b in BUCKETS + EXTRA_BUCKETS}
    for row in rows:
        bucket, pass_rate = buckets[str(row["id"])]
        by_bucket[bucket].append({**{k_: v for k_, v in row.items() if k_ != PASS_RATE}, PASS_RATE: pass_rate})
    if PASS_RATE in schema.names:
        schema = schema.remove(schema.get_field_index(PASS_RATE))
    schema = schema.append(pa.field(PASS_RATE, pa.float64()))
    counts = {b: len(r) for b, r in by_bucket.items()}
    holdout_rows = holdout.num_rows if holdout is not None else 0
    summary = {"counts": counts, "prompts": len(rows), "completions": rollouts.num_rows, "keep": keep, "k": k,
               "aggregation": aggregation, "holdout_rows": holdout_rows}
    core = {"config": run.get("config"), "config_hash": run.get("config_hash"), "inputs": run.get("inputs"),
            "versions": ("transformers", "torch", "httpx")}
    with step.folder() as tmp:
        for bucket, bucket_rows in by_bucket.items():
            if bucket in EXTRA_BUCKETS and not bucket_rows:
                continue
            write_shards(pa.Table.from_pylist(bucket_rows, schema=schema), tmp / bucket)
            held = holdout_rows if bucket == HOLDOUT_BUCKET else 0
            if held:
                write_shards(holdout, tmp / bucket, split="holdout")
            manifest = step.manifest(**core, counts={"rows": len(bucket_rows), "holdout": held}, bucket=bucket,
                                     keep=keep, k=k, part_of="../manifest.json")
            step.finish(tmp / bucket, manifest, bucket_report(bucket, bucket_rows, held, keep, k, len(rows)))
        pq.write_table(rollouts, tmp / ROLLOUTS, compression="zstd")
        own = {key: value for key, value in run.items() if key not in ("config", "config_hash", "inputs")}
        manifest = step.manifest(**core, counts=counts, **own,
                                 **{key: value for key, value in summary.items() if key != "counts"})
        step.finish(tmp, manifest, filter_report(tmp, rows, rollouts, buckets, counts, keep, manifest))
    return StepResult(out=step.out, manifest=manifest, counts=counts)


BUCKET_MEANING = {
    "all_pass": "every sample passed: too easy for this policy, no GRPO signal",
    "learnable": "some samples passed and some failed, with a pass rate inside the keep band: train on these",
    "all_fail": "no sample passed: too hard for this policy now (try again after training)",
    "unscored": "no reward scored any sample (every reward was None: a missing gold answer or tests)",
    "constant": "every sample got the same reward, neither 0 nor 1 (or, with normalize_then_sum, rewards that "
                "cancel out): no GRPO signal",
    "outside_band": "some passed and some failed, but the pass rate is outside the keep band",
}


def bucket_report(bucket: str, rows: list[dict], holdout_rows: int, keep: str, k: int, total: int) -> str:
    """The report.md of one bucket folder: what its prompts are, per label, and what is next."""
    per_label: dict[str, list] = {}
    for row in rows:
        per_label.setdefault(str(row.get("label")), []).append(row[PASS_RATE])
    table = [[label, len(rates), _mean([r for r in rates if r is not None])] for label, rates in sorted(per_label.items())]
    lines = [
        f"# rufus-data filter: `{bucket}/`",
        "",
        (f"{len(rows):,} of {total:,} prompts: {BUCKET_MEANING[bucket]} ({k} samples per prompt, keep band `{keep}`). "
        "The whole run: [../report.md](../report.md)."),
        "",
        markdown_table(["label", "prompts", "mean pass rate"], table) if table else "No prompts.\n",
    ]
    if bucket == HOLDOUT_BUCKET:
        lines += [
            (f"The input's `holdout` split ({holdout_rows:,} rows, mix's held-out prompts) passes through here unfiltered "
            "(`data/holdout-*.parquet`), so it travels on with the prompts you train on."),
            "",
        ]
    return "\n".join(lines)


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


def filter_report(folder: Path, rows, rollouts: pa.Table, buckets, counts: dict, keep: str, manifest: dict) -> str:
    """The text of report.md (and its figure, pass_rate_hist.png, written beside it)."""
    labels = sorted({str(r.get("label")) for r in rows})
    per_label = Counter((str(r.get("label")), buckets[str(r["id"])][0]) for r in rows)
    shown = [b for b in BUCKETS + EXTRA_BUCKETS if b in BUCKETS or counts[b]]
    table_rows = [[label, *(per_label[(label, b)] for b in shown), sum(per_label[(label, b)] for b in shown)] for label in labels]
    table_rows.append(["**all**", *(counts[b] for b in shown), len(rows)])
    gen = manifest.get("generation") or {}
    finish = Counter(rollouts.column("finish_reason").to_pylist())
    lines = [
        "# rufus-data filter",
        "",
        (
            f"Policy `{rollouts.column('model')[0].as_py() if rollouts.num_rows else '?'}`, "
            f"{rollouts.num_rows // max(len(rows), 1)} samples per prompt, keep band `{keep}` for `learnable/`"
            f"{_aggregation_note(manifest.get('aggregation'))}."
        ),
        "",
        _rewards_line(manifest.get("rewards")),
        "",
        _scoring_line(manifest.get("scoring")),
        "",
        _inputs_line(len(rows), (manifest.get("config") or {}).get("limit"), manifest.get("holdout_rows", 0)),
        "",
        "## Buckets per label",
        "",
        markdown_table(["label", *shown, "total"], table_rows),
        "## Pass rates",
        "",
        "![pass rate histogram](pass_rate_hist.png)",
        "",
        "## Generation",
        "",
        markdown_table(
            ["prompts", "resumed", "generated", "generated tokens", "tokens/s", "finish=length", "max_model_len check"],
            [[gen.get("prompts_total", len(rows)), gen.get("prompts_resumed", "-"), gen.get("prompts_generated", "-"),
              gen.get("generated_tokens", "-"), gen.get("tokens_per_s", "-"), finish.get("length", 0),
              manifest.get("max_model_len_check", "-")]],
        ),
    ]
    rates = [p for _, p in buckets.values() if p is not None]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(rates, bins=[i / 20 for i in range(21)], color="#4c72b0", edgecolor="white")
    ax.set_xlabel("pass rate (mean reward over k samples)")
    ax.set_ylabel("prompts")
    ax.set_title(f"pass rates of {len(rates)} scored prompts")
    fig.tight_layout()
    fig.savefig(folder / "pass_rate_hist.png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return "\n".join(lines) + "\n"


def _rewards_line(rewards) -> str:
    """Which rewards scored, and where they came from (older manifests list only names)."""
    if isinstance(rewards, dict):
        specs = ", ".join(f"`{json.dumps(spec, sort_keys=True)}`" for spec in rewards.get("specs", []))
        return f"Rewards from {rewards.get('from')}: {specs}."
    return f"Rewards: {', '.join(rewards or []) or '-'}."


def _scoring_line(scoring: dict | None) -> str:
    """What each reward could not score: the LLM judge's failed requests and unparsable answers."""
    if not scoring:
        return "Scoring: not recorded."
    return "Scoring: " + "; ".join(
        f"`{name}` {c['answers'] - c['unscored']:,} of {c['answers']:,} answers scored ({c['unscored']:,} unscored: "
        f"{c['failed']:,} failed requests, {c['unparsable']:,} unparsable)" for name, c in scoring.items()) + "."


def _aggregation_note(aggregation: str | None) -> str:
    """Said only when the rewards are not simply summed (TRL's default)."""
    if aggregation in (None, "sum_then_normalize"):
        return ""
    return f"; several rewards are normalised one by one, then summed (`{aggregation}`), as the GRPO run will"


def _inputs_line(prompts: int, limit: int | None, holdout_rows: int) -> str:
    sample = f"a seeded sample of {prompts:,} prompts (--limit {limit})" if limit else f"{prompts:,} prompts"
    held = (f"; the input's holdout split ({holdout_rows:,} rows) passes through unfiltered into `learnable/`"
            if holdout_rows else "; the input had no holdout split")
    return f"Input: {sample}{held}."


def rebucket(rollouts_dir: str | Path, out: str | Path, keep: str, overwrite: bool = False,
             aggregation: str | None = None) -> StepResult:
    """Re-bucket a finished filter output from its stored rewards (no generation); `aggregation`
    None: the earlier run's."""
    step = OutputStep("rufus-data filter --from-rollouts", out, overwrite=overwrite)
    src = Path(rollouts_dir)
    path = src / ROLLOUTS
    if not path.exists():
        raise RufusError(f"{src} has no {ROLLOUTS}: --from-rollouts takes the --out folder of an earlier `rufus-data filter`")
    parse_band(keep)
    rollouts = pq.read_table(path)
    previous = json.loads((src / MANIFEST).read_text()) if (src / MANIFEST).exists() else {}
    tables = [read_shards(src / b) for b in BUCKETS + EXTRA_BUCKETS if (src / b / DATA_DIR).exists()]
    if not tables:
        raise RufusError(f"{src} has no bucket folders ({', '.join(BUCKETS)}): is it a `rufus-data filter` output?")
    table = pa.concat_tables(tables, promote_options="permissive").drop_columns([PASS_RATE])
    rows, schema = table.to_pylist(), table.schema
    order = {pid: i for i, pid in enumerate(dict.fromkeys(rollouts.column("prompt_id").to_pylist()))}
    missing = set(order) - {str(r["id"]) for r in rows}
    if missing:
        raise RufusError(f"{src}: {len(missing)} prompts of {ROLLOUTS} have no row in its bucket folders (e.g. {sorted(missing)[:3]})")
    rows.sort(key=lambda r: order[str(r["id"])])
    k = previous.get("k") or rollouts.num_rows // max(len(order), 1)
    run = {key: previous.get(key) for key in ("config", "config_hash", "inputs", "seed", "generation", "rewards", "scoring")}
    run.update(from_rollouts=str(src), max_model_len_check="n/a (no generation)")
    aggregation = aggregation or previous.get("aggregation") or FilterConfig.model_fields["aggregation"].default
    return write_filter_output(step, rows, schema, rollouts, k, keep, aggregation, run,
                               holdout=read_holdout([src / HOLDOUT_BUCKET]))
