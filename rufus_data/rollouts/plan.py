"""`rufus-data filter --dry-run` and `pairs --dry-run`: the generation a run would do, with no
model loaded and nothing written. Per input source: its prompts and the reward that scores them;
then prompts (after --limit) x samples x --max-tokens, the token budget of each model that
samples, on the backend `auto` picks (ModelAccess.backend_choice) and into which output folder.

A shard folder is read as far as its footers and its `source`, `label` and `reward_spec` columns;
a catalog input is counted with mix's own plan (mix/plan.py), never mixed to disk. Every refusal
the run makes before it generates (a bad --reward, a model that cannot load, a folder that holds
no RL prompts, rows without a reward where one is needed, an existing --out) is made here too."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from rufus_data.base.console import print_result, print_rows
from rufus_data.base.errors import RufusError
from rufus_data.folders.output_step import check_output
from rufus_data.folders.shards import shard_files, shard_row_counts
from rufus_data.generate.backends import check_model, generator_thinking, model_to_load
from rufus_data.mix.plan import mix_plan
from rufus_data.rewards.data_rewards import REWARD_COLUMN, declares_rewards, encode_specs, scoring_specs
from rufus_data.rollouts.filter import ROLLOUTS, parse_band
from rufus_data.rollouts.options import FilterConfig, GenerationOptions, PairsConfig
from rufus_data.rollouts.prompts import DEFAULT_RL_CATALOG, check_prompt_columns, default_out
from rufus_data.rollouts.scoring import Scorer
from rufus_data.sources.inputs import DataInput, data_inputs


@dataclass
class SourcePrompts:
    """The prompts one input holds of one source and label, and the reward they declare (JSON text)."""

    input: str
    source: str
    label: str
    prompts: int
    reward: str | None


@dataclass
class GenerationPlan:
    """What a filter or pairs run would generate: `roles` (role, model, samples per prompt)."""

    command: str
    out: Path
    sources: list[SourcePrompts]
    prompts: int  # after --limit
    roles: list[tuple[str, str, int]]
    max_tokens: int
    backend: str
    why: str
    rewards_from: str
    specs: list = field(default_factory=list)
    method: str | None = None  # pairs' way of building them

    @property
    def prompts_in(self) -> int:
        return sum(s.prompts for s in self.sources)

    def budget(self, samples: int) -> int:
        """Generated tokens at most: prompts x samples x max tokens."""
        return self.prompts * samples * self.max_tokens


def filter_plan(inputs: list[str | Path] | None, out: str | Path | None, config: FilterConfig,
                overwrite: bool = False) -> GenerationPlan:
    """The plan of `filter_prompts` with the same arguments."""
    entries = data_inputs(inputs, DEFAULT_RL_CATALOG)
    out = Path(out) if out is not None else default_out(entries, "filtered")
    check_output("rufus-data filter", out, overwrite=overwrite)
    parse_band(config.keep)
    if config.reward:
        Scorer.from_specs(config.reward)
    backend, why = _checked_models(config, [(config.policy, config.base_urls)])
    sources = _input_sources(entries)
    specs, rewards_from = scoring_specs(config.reward, _declared_rows(sources))
    Scorer.from_specs(specs)
    return GenerationPlan("filter", out, sources, _limited(sources, config), [("policy", config.policy, config.k)],
                          config.max_tokens, backend, why, rewards_from, specs)


def pairs_plan(inputs: list[str | Path] | None, out: str | Path | None, config: PairsConfig,
               overwrite: bool = False) -> GenerationPlan:
    """The plan of `build_pairs` with the same arguments."""
    entries = data_inputs(inputs, DEFAULT_RL_CATALOG)
    out = Path(out) if out is not None else default_out(entries, "pairs")
    check_output("rufus-data pairs", out, overwrite=overwrite)
    config.method(data_rewards=True)
    if config.reward:
        Scorer.from_specs(config.reward)
    roles = [(role, model, n) for role, model, n in (("policy", config.policy, config.k), ("strong", config.strong, 1),
                                                       ("weak", config.weak, 1)) if model]
    urls = {"policy": config.base_urls, "strong": config.strong_base_urls, "weak": config.weak_base_urls}
    backend, why = _checked_models(config, [(model, urls[role]) for role, model, _ in roles])
    sources = _input_sources(entries)
    rows = _declared_rows(sources)
    specs, rewards_from = scoring_specs(config.reward, rows) if config.reward or declares_rewards(rows) else ([], "none")
    method = config.method(data_rewards=bool(specs))
    if config.require_verified and not specs:
        raise RufusError("--require-verified needs a reward to verify that chosen passes and rejected fails: pass "
                         "--reward SPEC, or give the rows' sources a `reward:` in their catalog")
    if specs:
        Scorer.from_specs(specs)
    return GenerationPlan("pairs", out, sources, _limited(sources, config), roles, config.max_tokens, backend, why,
                          rewards_from, specs, method)


def _checked_models(config: GenerationOptions, models: list[tuple[str, list[str]]]) -> tuple[str, str]:
    """(backend, why) as the run resolves them, after refusing a model that cannot load (nothing loads)."""
    backend, why = config.backend_choice()
    resolved = config.model_copy(update={"backend": backend})
    for model, urls in models:
        loadable = model_to_load(model, resolved.access(urls))
        check_model(loadable, resolved.access(urls))
        generator_thinking(loadable, resolved.access(urls), config.thinking)  # its tokenizer only
    return backend, why


def _input_sources(entries: list[DataInput]) -> list[SourcePrompts]:
    """The prompts of each input by source and label: a catalog's from mix's plan, a folder's
    from its rows' `source`, `label` and `reward_spec` columns."""
    found = []
    for entry in entries:
        if entry.catalog:
            plan = mix_plan(entry.path, check_out=False)
            found += [SourcePrompts(entry.given, s["name"], s["label"], s["rows_out"],
                                    encode_specs(s["reward"]) if s["reward"] else None) for s in plan.sources]
            continue
        files = shard_files(entry.path)
        names = pq.read_schema(files[0]).names
        check_prompt_columns(entry.path, names)
        columns = [c for c in ("source", "label", REWARD_COLUMN) if c in names]
        if not columns:
            found.append(SourcePrompts(entry.given, "-", "-", sum(shard_row_counts(files)), None))
            continue
        table = pq.ParquetDataset(files).read(columns=columns).to_pylist()
        groups = Counter((r.get("source"), r.get("label"), r.get(REWARD_COLUMN)) for r in table)
        found += [SourcePrompts(entry.given, str(source), str(label), count, reward)
                  for (source, label, reward), count in groups.items()]
    return found


def _declared_rows(sources: list[SourcePrompts]) -> list[dict]:
    """One row per source with what it declares: enough for the run's own reward checks."""
    return [{"label": s.label, REWARD_COLUMN: s.reward} for s in sources]


def _limited(sources: list[SourcePrompts], config: GenerationOptions) -> int:
    total = sum(s.prompts for s in sources)
    if not total:
        raise RufusError(f"no prompts in {', '.join(sorted({s.input for s in sources}))}: nothing to generate from")
    return min(total, config.limit) if config.limit else total


def print_generation_plan(plan: GenerationPlan) -> None:
    """The plan on stdout: prompts per source with their reward, then each model's token budget."""
    limit = f" (a seeded sample of {plan.prompts_in:,}: --limit)" if plan.prompts < plan.prompts_in else ""
    reward_of = (lambda s: "--reward") if plan.rewards_from == "--reward" else (lambda s: _reward_text(s.reward))
    print_rows(["input", "source", "label", "prompts", "reward"],
               [(s.input, s.source, s.label, f"{s.prompts:,}", reward_of(s)) for s in plan.sources],
               title=f"{plan.command} plan: {plan.prompts:,} prompts{limit}")
    if plan.rewards_from == "--reward":
        print_result(f"rewards (--reward, every row): {'; '.join(map(spec_text, plan.specs))}", highlight=False)
    rows = [(role, model, f"{plan.prompts:,}", str(n), f"{plan.max_tokens:,}", f"{plan.budget(n):,}")
            for role, model, n in plan.roles]
    if len(rows) > 1:
        rows.append(("total", "", "", str(sum(n for *_, n in plan.roles)), "",
                     f"{sum(plan.budget(n) for *_, n in plan.roles):,}"))
    if rows:
        print_rows(["role", "model", "prompts", "samples", "max tokens", "token budget"], rows,
                   title=f"generation: backend {plan.backend} ({plan.why})")
    else:
        print_result("generation: none (the rows' reference answers, perturbed)", highlight=False)
    if plan.method:
        print_result(f"pairs: {plan.method}", highlight=False)
    print_result(f"dry run: nothing loaded, generated or written (drop --dry-run to write {plan.out})", highlight=False)


def _reward_text(encoded: str | None) -> str:
    """A source's declared reward (`-`: none)."""
    return "-" if encoded is None else "; ".join(map(spec_text, json.loads(encoded)))


def spec_text(spec: str | dict) -> str:
    """A reward spec on one line: `string_match: extractor=last_number, answer_column=expected_output`."""
    if isinstance(spec, str):
        return spec
    params = ", ".join(f"{key}={value}" for key, value in spec.items() if key != "name")
    return f"{spec.get('name')}: {params}" if params else str(spec.get("name"))


def rebucket_plan(rollouts_dir: str | Path, out: str | Path, keep: str, overwrite: bool = False) -> None:
    """`filter --from-rollouts DIR --dry-run`: what a re-bucketing would read and write (no generation)."""
    check_output("rufus-data filter --from-rollouts", Path(out), overwrite=overwrite)
    parse_band(keep)
    path = Path(rollouts_dir) / ROLLOUTS
    if not path.exists():
        raise RufusError(f"{rollouts_dir} has no {ROLLOUTS}: --from-rollouts takes the --out folder of an earlier "
                         "`rufus-data filter`")
    completions = pq.ParquetFile(path).metadata.num_rows
    print_result(f"re-buckets the {completions:,} scored completions of {path} with --keep {keep!r}; no generation",
                 highlight=False)
    print_result(f"dry run: nothing written (drop --dry-run to write {out})", highlight=False)
