"""Builder steps: training rows made from the real rows a catalog source loads, by a small,
deterministic step the catalog names (`build: NAME`), so a reader sees what was built from what.

Each step reads the rows of its source's place (path, local or hub) and yields new rows; the
same input gives the same output on every run (any choice is seeded by the row's own id, or, for a
recipe that draws in row order, by its seed at the first row). Rows
a step cannot use are dropped and counted by reason, and the mix manifest records the step, what
it read and those counts."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from rufus_data.base.errors import RufusError
from rufus_data.rewards.ifeval import instruction_registry
from rufus_data.sources.perturb import perturb_final_answer


class Skip(ValueError):
    """A row the step cannot use; the message is the reason it is counted under."""


@dataclass(frozen=True)
class Builder:
    summary: str
    reads: tuple[str, ...]  # the columns every input row must have
    writes: tuple[str, ...]  # the columns every row it makes has
    make: Callable[[dict, int], Iterable[dict]]  # (row, row number) -> new rows


# --- perturbed_answer_pairs ---------------------------------------------------------------


def _perturbed_pair(row: dict, index: int) -> Iterable[dict]:
    answer = row["answer"]
    rejected = perturb_final_answer(answer, random.Random(f"perturbed_answer_pairs:{index}"))
    if rejected is None:
        raise Skip("no final number to change")
    yield {"prompt": row["question"], "chosen": answer, "rejected": rejected}


# --- seed_task_instances ------------------------------------------------------------------


def _seed_task_instances(row: dict, index: int) -> Iterable[dict]:
    for instance in row["instances"] or []:
        if (instance.get("output") or "").strip():
            yield {"instruction": row["instruction"], "input": instance.get("input") or "",
                   "output": instance["output"], "task": row.get("id") or index}


# --- seed_task_constraints ----------------------------------------------------------------

# IFEval instructions a task can carry whatever its topic, each with the kwargs drawn for it. The
# text the prompt ends with is the instruction's own description from lm-eval's IFEval registry,
# which is also what verifies it (rufus_data.rewards.ifeval). Instructions whose checker needs the
# Punkt tokenizer are left out, so that every row can be scored wherever the reward runs.
SEED_CONSTRAINTS: dict[str, Callable[[random.Random], dict]] = {
    "change_case:english_lowercase": lambda rng: {},
    "change_case:english_capital": lambda rng: {},
    "punctuation:no_comma": lambda rng: {},
    "startend:quotation": lambda rng: {},
    "detectable_format:title": lambda rng: {},
    "detectable_format:number_bullet_lists": lambda rng: {"num_bullets": rng.choice([2, 3, 4, 5])},
    "detectable_format:number_highlighted_sections": lambda rng: {"num_highlights": rng.choice([1, 2, 3])},
    "detectable_content:postscript": lambda rng: {"postscript_marker": rng.choice(["P.S.", "P.P.S"])},
    "detectable_content:number_placeholders": lambda rng: {"num_placeholders": rng.choice([1, 2, 3])},
    "length_constraints:number_paragraphs": lambda rng: {"num_paragraphs": rng.choice([2, 3, 4])},
    "length_constraints:number_words": lambda rng: {"relation": rng.choice(["less than", "at least"]),
                                                    "num_words": rng.choice([30, 50, 100, 150])},
    "startend:end_checker": lambda rng: {"end_phrase": rng.choice(
        ["Is there anything else I can help with?", "Let me know if you have additional questions.",
         "Any other questions?"])},
}


def _task_text(row: dict) -> str:
    instances = row.get("instances") or [{}]
    extra = (instances[0].get("input") or "").strip()
    return f"{row['instruction'].strip()}\n\n{extra}" if extra else row["instruction"].strip()


def _seed_task_constraint(row: dict, index: int) -> Iterable[dict]:
    rng = random.Random(f"seed_task_constraints:{row.get('id', index)}")
    instruction_id = rng.choice(sorted(SEED_CONSTRAINTS))
    kwargs = SEED_CONSTRAINTS[instruction_id](rng)
    checker = instruction_registry()[instruction_id](instruction_id)
    description = checker.build_description(**kwargs)
    yield {"prompt": f"{_task_text(row)} {description}", "instruction_id_list": [instruction_id],
           "kwargs": json.dumps([kwargs]), "task": row.get("id") or index}


# --- rlvr_ifeval_constraints --------------------------------------------------------------

# Tulu 3's RLVR-IFeval rows name an open-instruct verifier (`ground_truth.func_name`); each maps to
# the IFEval instruction that checks the same thing, with its parameters renamed. Verifiers with no
# exact IFEval twin (exact keyword or letter counts, free answer options, "around N") drop the row.
RLVR_TO_IFEVAL: dict[str, tuple[str, dict[str, str]]] = {
    "verify_keywords": ("keywords:existence", {"keyword_list": "keywords"}),
    "validate_forbidden_words": ("keywords:forbidden_words", {"forbidden_words": "forbidden_words"}),
    "validate_response_language": ("language:response_language", {"language": "language"}),
    "verify_paragraph_count": ("length_constraints:number_paragraphs", {"N": "num_paragraphs"}),
    "validate_word_constraint": ("length_constraints:number_words", {"N": "num_words", "quantifier": "relation"}),
    "verify_sentence_constraint": ("length_constraints:number_sentences", {"N": "num_sentences", "quantifier": "relation"}),
    "validate_paragraphs": ("length_constraints:nth_paragraph_first_word",
                            {"N": "num_paragraphs", "i": "nth_paragraph", "first_word": "first_word"}),
    "verify_postscript": ("detectable_content:postscript", {"postscript_marker": "postscript_marker"}),
    "validate_placeholders": ("detectable_content:number_placeholders", {"N": "num_placeholders"}),
    "verify_bullet_points": ("detectable_format:number_bullet_lists", {"N": "num_bullets"}),
    "validate_title": ("detectable_format:title", {}),
    "validate_highlighted_sections": ("detectable_format:number_highlighted_sections", {"N": "num_highlights"}),
    "validate_sections": ("detectable_format:multiple_sections", {"N": "num_sections", "section_splitter": "section_spliter"}),
    "validate_json_format": ("detectable_format:json_format", {}),
    "validate_repeat_prompt": ("combination:repeat_prompt", {"original_prompt": "prompt_to_repeat"}),
    "validate_two_responses": ("combination:two_responses", {}),
    "validate_uppercase": ("change_case:english_capital", {}),
    "validate_lowercase": ("change_case:english_lowercase", {}),
    "validate_frequency_capital_words": ("change_case:capital_word_frequency",
                                         {"N": "capital_frequency", "quantifier": "capital_relation"}),
    "validate_end": ("startend:end_checker", {"end_phrase": "end_phrase"}),
    "validate_quotation": ("startend:quotation", {}),
    "validate_no_commas": ("punctuation:no_comma", {}),
}
RELATION_KEYS = ("relation", "capital_relation")
COUNT_KEYS = {"relation": "num_words", "capital_relation": "capital_frequency"}


def _ifeval_kwargs(func: str, truth: dict) -> tuple[str, dict]:
    instruction_id, names = RLVR_TO_IFEVAL[func]
    kwargs = {ours: truth[theirs] for theirs, ours in names.items() if truth.get(theirs) is not None}
    for key in RELATION_KEYS:
        if key in kwargs:
            count_key = "num_sentences" if instruction_id.endswith("number_sentences") else COUNT_KEYS[key]
            if kwargs[key] == "at most":  # at most N == less than N + 1 (counts are integers)
                kwargs[key], kwargs[count_key] = "less than", int(kwargs[count_key]) + 1
            elif kwargs[key] != "at least":
                raise Skip(f"relation {kwargs[key]!r} has no exact IFEval checker")
    return instruction_id, kwargs


def _rlvr_ifeval(row: dict, index: int) -> Iterable[dict]:
    try:
        truth = json.loads(row["ground_truth"]) if isinstance(row["ground_truth"], str) else dict(row["ground_truth"])
    except (json.JSONDecodeError, TypeError, ValueError):
        raise Skip("ground_truth is not a JSON object") from None
    func = truth.get("func_name")
    if func not in RLVR_TO_IFEVAL:
        raise Skip(f"verifier {func!r} has no exact IFEval checker")
    instruction_id, kwargs = _ifeval_kwargs(func, truth)
    users = [m for m in row["messages"] or [] if m.get("role") == "user"]
    if not users:
        raise Skip("no user turn")
    yield {"prompt": users[-1]["content"], "instruction_id_list": [instruction_id], "kwargs": json.dumps([kwargs]),
           "constraint": row.get("constraint")}


# --- mbpp_task_prompts --------------------------------------------------------------------


def _mbpp_prompt(row: dict, index: int) -> Iterable[dict]:
    tests = list(row["test_list"] or [])
    if not tests:
        raise Skip("no tests")
    # the task and its first test, as the bigcode harness prompts MBPP: the test shows the
    # function's name and signature; the reward runs all of them
    yield {**row, "prompt": f"{row['prompt'].strip()}\n{tests[0]}"}


# --- gsm8k_answer_is, gsm8k_answer_is_pairs -------------------------------------------------

# Tulu 3 mini trains every stage on GSM8K in one answer format: the worked solution with its
# `<<48/2=24>>` calculator notes removed, ending "The answer is N." (N: the gold after `####`,
# without thousands separators), which the system prompt asks for and the verifier reads.
CALCULATOR_NOTE = re.compile(r"<<[^>]*>>")


def answer_is_target(answer: str) -> str:
    """A GSM8K worked answer as Tulu 3 mini's SFT target (see above)."""
    if "####" not in answer:
        raise Skip("no final answer after ####")
    steps, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    if not final:
        raise Skip("no final answer after ####")
    steps = CALCULATOR_NOTE.sub("", steps).strip()
    return f"{steps}\nThe answer is {final}." if steps else f"The answer is {final}."


def _answer_is(row: dict, index: int) -> Iterable[dict]:
    yield {"question": row["question"], "answer": answer_is_target(row["answer"])}


# The notebook's make_pair: N moves by one of these, drawn in row order from Python's random seeded
# with its CFG.seed (42), one draw per integer gold; a gold that is no integer gets a "0" appended.
NOTEBOOK_DELTAS = (-10, -3, -1, 1, 2, 7)
NOTEBOOK_SEED = 42


class NotebookPairs:
    """Tulu 3 mini's DPO pairs as its notebook's make_pair makes them; the draws run in the rows'
    order through one build (restarted at its first row), as the notebook's loop does."""

    def __init__(self) -> None:
        self.rng = random.Random(NOTEBOOK_SEED)

    def __call__(self, row: dict, index: int) -> Iterable[dict]:
        if index == 0:
            self.rng = random.Random(NOTEBOOK_SEED)
        chosen = answer_is_target(row["answer"])
        gold = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        # the notebook's test: digits with at most one '.', after a leading '-'
        if gold.replace(".", "", 1).lstrip("-").isdigit():
            bad = str(int(float(gold)) + self.rng.choice(NOTEBOOK_DELTAS))
        else:
            bad = gold + "0"
        rejected = chosen.rsplit("The answer is", 1)[0] + f"The answer is {bad}."
        yield {"prompt": row["question"], "chosen": chosen, "rejected": rejected}


def _reasoning_trace(row: dict, index: int) -> Iterable[dict]:
    steps, final = _steps_and_final(row["answer"])
    yield {"question": row["question"], "reasoning": steps, "answer": final}


def _steps_and_final(answer: str) -> tuple[str, str]:
    """The target's worked steps and its closing 'The answer is N.' (rows without steps are skipped)."""
    steps, _, final = answer_is_target(answer).rpartition("\n")
    if not steps:
        raise Skip("no worked steps to reason with")
    return steps, final


# --- ifthink_conversations ----------------------------------------------------------------

# IFThink-style rows (SmolLM3's multi-turn instruction following with reasoning): a GSM8K problem
# solved with its worked steps as the first turn's <think> block, then two follow-up turns that
# each ask for the last answer again under one IFEval instruction (its description from lm-eval's
# registry); every assistant turn reasons in a <think> block before it answers. The rewrites are
# exact transformations, and each is verified by the instruction's own IFEval checker.
IFTHINK_REWRITES: dict[str, tuple[Callable[[random.Random], dict], Callable[[str, dict], str], str]] = {
    "change_case:english_lowercase": (lambda rng: {}, lambda text, kw: text.lower(),
                                      "so I write the same answer with every letter in lowercase"),
    "change_case:english_capital": (lambda rng: {}, lambda text, kw: text.upper(),
                                    "so I write the same answer with every letter in capitals"),
    "punctuation:no_comma": (lambda rng: {}, lambda text, kw: text.replace(",", ""),
                             "so I keep the answer and drop every comma"),
    "startend:quotation": (lambda rng: {}, lambda text, kw: f'"{text}"',
                           "so I wrap the whole answer in double quotation marks"),
    "detectable_format:title": (lambda rng: {}, lambda text, kw: f"<<Solution>>\n\n{text}",
                                "so I put a title in double angular brackets first"),
    "startend:end_checker": (
        lambda rng: {"end_phrase": rng.choice(["Is there anything else I can help with?", "Any other questions?"])},
        lambda text, kw: f"{text}\n\n{kw['end_phrase']}", "so I end with exactly the phrase asked for"),
    "detectable_content:postscript": (
        lambda rng: {"postscript_marker": rng.choice(["P.S.", "P.P.S"])},
        lambda text, kw: f"{text}\n\n{kw['postscript_marker']} I checked each step once more.",
        "so I add a postscript with the marker asked for"),
}
IFTHINK_FOLLOW_UPS = 2


def _think(reasoning: str, answer: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def _ifthink(row: dict, index: int) -> Iterable[dict]:
    steps, answer = _steps_and_final(row["answer"])
    rng = random.Random(f"ifthink_conversations:{index}")
    messages = [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": _think(steps, answer)}]
    ids, kwargs_list = [], []
    for instruction_id in rng.sample(sorted(IFTHINK_REWRITES), IFTHINK_FOLLOW_UPS):
        draw, rewrite, plan = IFTHINK_REWRITES[instruction_id]
        kwargs = draw(rng)
        checker = instruction_registry()[instruction_id](instruction_id)
        description = checker.build_description(**kwargs)
        answer = rewrite(answer, kwargs)
        if not checker.check_following(answer):
            raise Skip(f"the {instruction_id} rewrite does not pass its checker")
        reasoning = f"The user wants my last answer again under one instruction: {description.strip()} It asks " \
                    f"for a change of form, not of content, {plan}."
        messages += [{"role": "user", "content": f"Give me your last answer again. {description}"},
                     {"role": "assistant", "content": _think(reasoning, answer)}]
        ids.append(instruction_id)
        kwargs_list.append(kwargs)
    yield {"messages": messages, "instruction_id_list": ids, "kwargs": json.dumps(kwargs_list)}


BUILDERS: dict[str, Builder] = {
    "perturbed_answer_pairs": Builder(
        "question/answer rows -> preference pairs: chosen = the worked answer, rejected = the same answer with its "
        "final number changed (Tulu 3's GSM8K pairs; `rufus-data pairs --perturb-answer`)",
        ("question", "answer"), ("prompt", "chosen", "rejected"), _perturbed_pair),
    "seed_task_instances": Builder(
        "Alpaca seed tasks -> one alpaca row (instruction, input, output) per instance", ("instruction", "instances"),
        ("instruction", "input", "output", "task"), _seed_task_instances),
    "seed_task_constraints": Builder(
        "Alpaca seed tasks -> RL prompts: the task plus one IFEval-style verifiable constraint, with the "
        "instruction_id_list and kwargs the IFEval reward checks (how Tulu 3's RLVR-IFeval prompts were made)",
        ("instruction", "instances"), ("prompt", "instruction_id_list", "kwargs", "task"), _seed_task_constraint),
    "rlvr_ifeval_constraints": Builder(
        "Tulu 3 RLVR-IFeval rows -> the user prompt with the IFEval instruction_id_list and kwargs of its verifier",
        ("messages", "ground_truth"), ("prompt", "instruction_id_list", "kwargs", "constraint"), _rlvr_ifeval),
    "mbpp_task_prompts": Builder(
        "MBPP rows -> the task text plus its first test assert as the prompt; test_list, test_imports and code stay",
        ("prompt", "test_list"), ("prompt", "test_list"), _mbpp_prompt),
    "gsm8k_answer_is": Builder(
        "GSM8K question/answer rows -> the same question, the answer with its <<...>> calculator notes removed and "
        "ending 'The answer is N.' (Tulu 3 mini's SFT targets)", ("question", "answer"), ("question", "answer"),
        _answer_is),
    "gsm8k_answer_is_pairs": Builder(
        "GSM8K question/answer rows -> preference pairs: chosen = the 'The answer is N.' target, rejected = the same "
        "text with only N changed to N + one of -10, -3, -1, 1, 2, 7, drawn in row order from random.Random(42) (Tulu 3 "
        "mini's DPO pairs, as its notebook's make_pair)", ("question", "answer"), ("prompt", "chosen", "rejected"),
        NotebookPairs()),
    "gsm8k_reasoning_trace": Builder(
        "GSM8K question/answer rows -> question, reasoning (the worked steps without calculator notes) and answer "
        "('The answer is N.'): with format question_answer and fields {reasoning: reasoning}, a <think> trace",
        ("question", "answer"), ("question", "reasoning", "answer"), _reasoning_trace),
    "ifthink_conversations": Builder(
        "GSM8K question/answer rows -> IFThink-style conversations: the problem reasoned in <think> and answered, then "
        "two follow-ups each asking for the answer again under one IFEval instruction, each reply reasoned in <think> "
        "and checked by that instruction's IFEval checker (instruction_id_list, kwargs: the follow-ups')",
        ("question", "answer"), ("messages", "instruction_id_list", "kwargs"), _ifthink),
}


def build_rows(name: str, rows: Iterator[dict], what: str, counts: Counter) -> Iterator[dict]:
    """The rows builder `name` makes from `rows`; `counts` gets rows_in, rows_out and skip reasons."""
    builder = BUILDERS[name]
    for index, row in enumerate(rows):
        counts["rows_in"] += 1
        missing = [c for c in builder.reads if c not in row]
        if missing:
            raise RufusError(f"{what}: builder {name} reads the column {missing[0]!r}, which row {index} lacks "
                             f"(columns: {', '.join(sorted(row))}); build from data that has it")
        try:
            for made in builder.make(row, index):
                counts["rows_out"] += 1
                yield made
        except Skip as why:
            counts[f"skipped: {why}"] += 1
