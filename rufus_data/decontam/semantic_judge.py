"""The optional LLM judge of the semantic stage (`--judge-url`, `--judge-model`): a strong model
reads each pair the semantic stage found and says whether the training text restates the eval
item. It runs in the parent once every batch is scanned, through the rewards package's judge
client (rufus_data/rewards/llm_judge.py: the same connection rules, concurrency, retries, and
the same `Score: N` scale and pass threshold), so its verdict is a reward of 1.0 ("yes") or
0.0 ("no"); a request that fails or an answer without a score leaves the evidence rule to
decide ("failed"). Pairs that the exact or MinHash stage flags are not sent."""

from __future__ import annotations

import asyncio

from rufus_data.decontam.candidates import Candidate
from rufus_data.decontam.index import EvalIndex
from rufus_data.rewards.llm_judge import LLMJudgeReward

DECONTAM_JUDGE_PROMPT = """You are checking a training set for leaked benchmark items. A leak can be reworded: \
other words, other sentence order, numbers written out or in other units, extra text around it.

[Benchmark item]
{prompt}

[Training text (lowercased, punctuation removed)]
{answer}

Does the training text contain the benchmark item itself, restated: the same problem with the same \
quantities, asking for the same thing? A different problem on the same topic, or the same problem \
with other numbers, is not the item.

Reply with a short justification, then a final line of the form "Score: N" where N is an integer from 1 \
(a different problem) to 10 (certainly the benchmark item restated)."""


def judge_candidates(cands: list[Candidate], index: EvalIndex, flagged: set[tuple[int, int]]) -> dict[str, int]:
    """Ask the judge about every semantic pair not in `flagged` (the (row, item) pairs that the
    exact or MinHash stage flags); sets `Candidate.judge`. Returns the count of each verdict."""
    config = index.config
    asked = [c for c in cands if c.evidence is not None and (c.row, c.item) not in flagged]
    counts = {"yes": 0, "no": 0, "failed": 0}
    if not asked:
        return counts
    judge = LLMJudgeReward(base_url=config.judge_url, model=config.judge_model, prompt_template=DECONTAM_JUDGE_PROMPT)
    judge.strip_think = False  # a training text with <think> is data here, not a model's reasoning
    prompts = ["\n".join(index.items[c.item].problems) for c in asked]
    scores = asyncio.run(judge(prompts=prompts, completions=[c.semantic_text for c in asked]))
    for c, score in zip(asked, scores):
        c.judge = "failed" if score is None else "yes" if score >= 1.0 else "no"
        counts[c.judge] += 1
    return counts
