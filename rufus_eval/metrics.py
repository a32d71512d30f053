"""Rufus metrics inside lm-evaluation-harness: every one of the k samples is scored.

lm-eval clones a request `repeats` times and, unless a task names its filters, keeps only the
first response (`take_first`). Rufus tasks name one filter, `rufus_strip_reasoning`, which keeps
ALL k responses and strips the reasoning of each with the rewards package's rule
(`rufus_data.rewards.extract.strip_reasoning`: the text after `</think>`; a reasoning block that
never closes leaves an empty answer, scored 0 and counted as `unclosed_think`). The metrics
`rufus_avg`, `rufus_pass` and `rufus_maj` then receive the k answers of a document and score each
with the task's scorer: a registry reward spec (rufus_data/rewards/registry.py, the specs train and
filter take), with the document's gold fields as the reward's dataset columns; so `avg@k` is the
mean over all k samples. maj@ votes on what that reward extracts (`answer_extractor`).

A sample the reward cannot score (None: a judge that failed or wrote no parsable score, a row with
no usable gold) is excluded, never counted as 0.0, and counted in `unscored` (the fraction of
samples). A document with no scored sample (or fewer than `at` for pass@at) reports no value for
the metric, so lm-eval averages over the documents that have one; a task where no document has
one reports no number at all (results.json: value null), never 0.0."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections import Counter
from functools import lru_cache

import lm_eval.api.metrics  # noqa: F401 - registers lm-eval's aggregations (`mean`) first
from lm_eval.api.filter import Filter
from lm_eval.api.registry import register_filter, register_metric

from rufus_data.rewards.contract import RewardFunction
from rufus_data.rewards.extract import THINK_CLOSE, normalise_answer, strip_reasoning
from rufus_data.rewards.registry import build_reward
from rufus_eval.stats import pass_at_k


class Answer(str):
    """A sample's answer after reasoning stripping; `closed` is False when `<think>` never closed."""

    closed: bool = True

    def __new__(cls, text: str, closed: bool = True) -> Answer:  # noqa: PYI034
        obj = super().__new__(cls, text)
        obj.closed = closed
        return obj


def answer_of(response: str, think_end_token: str = THINK_CLOSE) -> Answer:
    """The rewards package's rule, with a model-specific end-of-reasoning token mapped onto it."""
    if think_end_token != THINK_CLOSE:
        response = response.replace(think_end_token, THINK_CLOSE)
    text, closed = strip_reasoning(response)
    return Answer(text.strip(), closed)


@register_filter("rufus_strip_reasoning")
class StripReasoningFilter(Filter):
    """Keep all k responses of a document; replace each by its answer (reasoning removed)."""

    def __init__(self, think_end_token: str = THINK_CLOSE, **kwargs) -> None:
        self.think_end_token = think_end_token
        super().__init__(**kwargs)

    def apply(self, resps, docs):
        return [[answer_of(r, self.think_end_token) for r in doc_resps] for doc_resps in resps]


# ---------------------------------------------------------------- the task's reward


@lru_cache(maxsize=64)
def _built(spec_json: str) -> RewardFunction:
    return build_reward(json.loads(spec_json))


def scorer_reward(scorer: str | dict) -> RewardFunction:
    """The reward a task's scorer spec names, built once per process (lm-eval calls a metric per document)."""
    return _built(json.dumps(scorer, sort_keys=True))


def score_answers(scorer: str | dict, answers: list[str], gold: dict, prompt: str = "") -> list[float | None]:
    """One score per answer (None: unscorable) by the reward the scorer spec names; the gold fields are
    the reward's dataset columns, as TRL would pass them."""
    reward = scorer_reward(scorer)
    k = len(answers)
    columns = {field: [value] * k for field, value in gold.items() if field != "rufus_prompt"}
    scores = reward(prompts=[prompt] * k, completions=list(answers), **columns)
    return asyncio.run(scores) if inspect.isawaitable(scores) else scores


# ---------------------------------------------------------------- the registered metrics


def scored_samples(predictions, references, scorer: str | dict) -> tuple[list[Answer], list[float | None], dict]:
    """(answers, per-sample scores: unclosed reasoning = 0.0, unscorable = None, extra per-document counts)."""
    answers = [a if isinstance(a, Answer) else Answer(a) for a in predictions[0]]
    gold = json.loads(references[0])
    raw = score_answers(scorer, answers, gold, gold.get("rufus_prompt", ""))
    scores = [0.0 if not a.closed else None if s is None else float(s) for a, s in zip(answers, raw)]
    extra = {
        "unclosed_think": sum(not a.closed for a in answers) / len(answers),
        "unscored": sum(s is None for s in scores) / len(answers),
    }
    return answers, scores, extra


@register_metric(metric="rufus_avg", higher_is_better=True, aggregation="mean")
def rufus_avg(references, predictions, scorer: str | dict, k: int, also: str | dict | None = None, **_) -> dict:
    """avg@k: the mean score of the k samples of one document (lm-eval then averages documents);
    with `also` (the task's also_scored_by), the same answers' mean under that reward as `also_avg@k`."""
    _, scores, extra = scored_samples(predictions, references, scorer)
    _check_k(scores, k)
    if also is not None:
        _, also_scores, _ = scored_samples(predictions, references, also)
        also_scored = [s for s in also_scores if s is not None]
        if also_scored:
            extra[f"also_avg@{k}"] = sum(also_scored) / len(also_scored)
    scored = [s for s in scores if s is not None]
    if not scored:
        return extra  # no avg@k for this document: excluded from the mean, counted in `unscored`
    return {f"avg@{k}": sum(scored) / len(scored), **extra}


@register_metric(metric="rufus_pass", higher_is_better=True, aggregation="mean")
def rufus_pass(references, predictions, scorer: str | dict, k: int, at: int, **_) -> dict:
    """pass@at from k samples (a sample passes with score 1)."""
    _, scores, extra = scored_samples(predictions, references, scorer)
    _check_k(scores, k)
    scored = [s for s in scores if s is not None]
    if len(scored) < at:
        return extra  # too few scored samples for pass@at: excluded, counted in `unscored`
    return {f"pass@{at}": pass_at_k(len(scored), sum(s >= 1.0 for s in scored), at), **extra}


@register_metric(metric="rufus_maj", higher_is_better=True, aggregation="mean")
def rufus_maj(references, predictions, scorer: str | dict, k: int, at: int, **_) -> dict:
    """maj@at: the score of the most frequent extracted answer among the first `at` samples."""
    answers, scores, extra = scored_samples(predictions, references, scorer)
    _check_k(scores, k)
    extract = scorer_reward(scorer).answer_extractor
    if extract is None:
        raise ValueError(f"maj@{at} needs an answer to vote on; the reward {scorer} extracts none")
    votes = {}
    for i, answer in enumerate(answers[:at]):
        value = extract(answer) if answer.closed else None
        if value is not None:
            votes.setdefault(normalise_answer(value), []).append(i)
    if not votes:
        return {f"maj@{at}": 0.0, **extra}
    counts = Counter({key: len(idx) for key, idx in votes.items()})
    winner = counts.most_common(1)[0][0]
    score = scores[votes[winner][0]]
    return extra if score is None else {f"maj@{at}": score, **extra}


def _check_k(scores: list[float], k: int) -> None:
    if len(scores) != k:
        raise ValueError(f"expected k={k} samples per document, got {len(scores)}: is `repeats` set to k?")
