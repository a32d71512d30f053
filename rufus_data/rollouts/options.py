"""The settings of the generating commands: `GenerationOptions` (how the model is reached, from
generate/backend_config.py; sampling; the prompt sample) that `filter` and `pairs` share, so a new knob (or a new default) is added in one place
and reaches both, as a field and as a command-line option; the `--reward` specs both take; and
each command's own model, `FilterConfig` and `PairsConfig`.

This module loads no arrow, HTTP client or model library: `rufus-data` builds its command-line
options from these models when it starts, for every command (rufus_data/base/cli_options.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.cli_options import Flag
from rufus_data.base.errors import RufusError, quoted
from rufus_data.base.yaml_config import load_yaml_text
from rufus_data.generate.backend_config import ModelAccess
from rufus_data.generate.sampling import SamplingParams
from rufus_data.models.thinking import THINKING_HELP, ThinkingMode


def parse_reward_option(values: list[str]) -> list[str | dict]:
    """`--reward` values: `name:arg` strings, or YAML/JSON mappings such as
    `{name: string_match, extractor: gsm8k, answer_column: expected_output}`."""
    specs: list[str | dict] = []
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            spec = load_yaml_text(text, f"--reward {quoted(value)}")
            if not isinstance(spec, dict):
                raise RufusError(f"--reward {quoted(value)} must be a mapping like '{{name: string_match, extractor: gsm8k}}'")
            specs.append(spec)
        else:
            specs.append(text)
    return specs


# the reward specs of filter and pairs, and their `--reward` option
RewardSpecs = Annotated[
    list[str | dict],
    Field(description="reward spec, repeatable: 'string_match:gsm8k' or '{name: string_match, answer_column: expected_output}' "
          f"(default: each row's own, from its source's `reward:` in the catalog; {docs_page('filter.md')})"),
    Flag(type=list[str], parse=parse_reward_option, metavar="SPEC"),
]


class GenerationOptions(ModelAccess):
    """How the commands that sample reach their model (ModelAccess: backend, servers, launch
    settings) and how they sample. Each field is also a `rufus-data filter/pairs` option
    (rufus_data/base/cli_options.py), its description the option's help."""

    max_tokens: int = Field(512, ge=1, description="tokens per sample")
    temperature: float = Field(1.0, ge=0, description="sampling temperature; 1.0 = the model's own distribution, as in RL")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of tokens holding this "
                         "probability (1.0 = off)")
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens (0 = off)")
    min_p: float = Field(0.0, ge=0, le=1, description="drop tokens below this fraction of the top token's probability "
                         "(0 = off)")
    repetition_penalty: float = Field(1.0, gt=0, description="penalty on tokens already in the prompt or completion "
                                      "(1.0 = off)")
    seed: int | None = Field(0, description="run seed; per-prompt and per-sample seeds derive from it")
    thinking: ThinkingMode = Field("default", description=THINKING_HELP)
    limit: int | None = Field(
        None, ge=1, description="a seeded sample of this many prompts (default: all); a quick run on CPU"
    )

    def sampling(self, n: int) -> SamplingParams:
        return SamplingParams(
            n=n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )

    def run_hash(self, n: int, inputs: Sequence[dict], **identity) -> str:
        """What makes two runs' samples interchangeable, the key of a resumable journal: `identity`
        (model, rewards, role), the sampling, the backend kind and the inputs by content (not their
        paths: a run resumes from another directory). URLs and concurrency change no sample. Call
        it on resolved settings (`auto` decided)."""
        if self.backend == "auto":
            raise ValueError("resolve the settings first: `auto` samples as the backend it becomes")
        key = {**identity, "backend": "hf" if self.backend == "hf" else "server",
               "sampling": self.sampling(n).to_dict(), "inputs": content_fingerprint(inputs)}
        if self.thinking != "default":  # the prompts render differently; `default` keeps earlier journals' keys
            key["thinking"] = self.thinking
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def content_fingerprint(inputs: Sequence[dict]) -> list[dict[str, str]]:
    """The input part of a run's configuration hash: each input folder's {file name: sha256},
    without its path, so the same shards copied or reached from another directory resume."""
    return [dict(sorted(entry["files"].items())) for entry in inputs]


class FilterConfig(GenerationOptions):
    """`rufus-data filter`: everything that decides the rollouts (hashed for resumption) plus where
    they run (rufus_data/rollouts/filter.py)."""

    policy: str = Field(description="model: built-in name, local folder or hub id")
    reward: RewardSpecs = Field(default_factory=list)
    k: int = Field(8, ge=1, description="samples per prompt")
    keep: str = Field("0<p<1", description="pass-rate band of learnable/, e.g. '0.1<p<0.9'")
    # the values of rufus_data.rewards.groups.AGGREGATIONS (not imported: it loads every reward)
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize", description="how the GRPO run will combine several rewards (its "
        "multi_objective_aggregation): a prompt is learnable when its samples would get different advantages")

    def rollout_hash(self, inputs: list[dict], reward: list | None = None) -> str:
        """The journal key (--keep, --aggregation and --limit do not change a prompt's rollouts and are left out);
        `reward`: the specs that score, when they come from the data rather than --reward."""
        return self.run_hash(self.k, inputs, policy=self.policy, reward=self.reward if reward is None else reward)


class PairsConfig(GenerationOptions):
    """`rufus-data pairs` (rufus_data/rollouts/pairs.py)."""

    strong: str | None = Field(None, description="model whose answers are chosen")
    weak: str | None = Field(None, description="model whose answers are rejected")
    policy: str | None = Field(None, description="on-policy pairs: a passing vs a failing sample of k (needs a reward)")
    k: int = Field(4, ge=1, description="on-policy samples per prompt")
    reward: RewardSpecs = Field(default_factory=list)
    perturb_answer: bool = Field(
        False, description="rejected = chosen with its final number changed (chosen: --strong, a passing --policy "
        "sample, or the row's reference answer: `solution`, else `expected_output`)"
    )
    require_verified: bool = Field(False, description="keep only chosen-passes/rejected-fails")
    pass_threshold: float = Field(1.0, description="a sample passes when its reward is at least this")
    temperature: float = Field(0.7, description="sampling temperature")
    strong_base_urls: Annotated[list[str], Flag("--strong-base-url", metavar="URL")] = Field(
        default_factory=list, description="server backend: URL of --strong (default: --base-url)"
    )
    weak_base_urls: Annotated[list[str], Flag("--weak-base-url", metavar="URL")] = Field(
        default_factory=list, description="server backend: URL of --weak (default: --base-url)"
    )

    def endpoints(self) -> list[str]:
        return [*self.base_urls, *self.strong_base_urls, *self.weak_base_urls]

    def method(self, data_rewards: bool = False) -> str:
        """How the pairs are built; `data_rewards`: the rows declare their own rewards (no --reward needed)."""
        scored = bool(self.reward) or data_rewards
        if self.policy:
            if self.strong or self.weak:
                raise RufusError("give either --policy (on-policy pairs) or --strong/--weak, not both")
            if not scored:
                raise RufusError("on-policy pairs (--policy) need --reward (or rows whose source declares `reward:` "
                                 "in its catalog) to tell passing from failing samples")
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
            return "reference_perturbed"
        raise RufusError(
            "say how to build pairs: --strong A --weak B, --policy M --k 4 --reward SPEC, or --perturb-answer"
        )

    def config_hash(self, role: str, model: str, n: int, inputs: list[dict], reward: list | None = None) -> str:
        return self.run_hash(n, inputs, role=role, model=model, reward=self.reward if reward is None else reward)
