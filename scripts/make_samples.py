"""Write the small sample sources behind catalogs/sft.yaml, rl.yaml and preference.yaml.

Everything here is generated from templates with a fixed seed (nothing is copied from any
dataset), so the README's main job runs offline. Re-run to regenerate:
    python scripts/make_samples.py
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "catalogs" / "samples"
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena"]
ITEMS = [("apples", "apple"), ("stickers", "sticker"), ("marbles", "marble"), ("books", "book"), ("pencils", "pencil")]
TOPICS = {
    "tea": "Green and black tea come from the same plant; black tea is oxidised longer.",
    "rain": "Rain forms when water vapour condenses into droplets heavy enough to fall.",
    "bikes": "Keeping bike tyres at the printed pressure makes rides easier and safer.",
    "sleep": "Most adults feel best with seven to nine hours of sleep.",
    "bread": "Bread rises because yeast turns sugar into carbon dioxide gas.",
    "moon": "The Moon shows phases because we see different parts of its lit half.",
    "coffee": "Coffee beans are the roasted seeds of a cherry-like fruit.",
    "bees": "Bees pollinate many crops while collecting nectar and pollen.",
    "maps": "Most flat maps stretch areas far from the equator.",
    "salt": "Salt lowers the freezing point of water, which is why roads get salted.",
    "owls": "Owls can turn their heads much further than people can.",
    "glass": "Glass is mostly made from melted sand that cools without crystallising.",
}
# The coding sample's functions: a filter, a transformation and a result, each combination once
# (8 x 8 x 3 = 192 distinct functions), so no two rows are the same task reworded.
KEEPS = [("even", "n % 2 == 0", lambda n: n % 2 == 0), ("odd", "n % 2 == 1", lambda n: n % 2 == 1),
         ("positive", "n > 0", lambda n: n > 0), ("negative", "n < 0", lambda n: n < 0),
         ("greater than 10", "n > 10", lambda n: n > 10), ("less than 5", "n < 5", lambda n: n < 5),
         ("divisible by 3", "n % 3 == 0", lambda n: n % 3 == 0), ("not zero", "n != 0", lambda n: n != 0)]
MAPS = [("square", "n * n", lambda n: n * n), ("double", "2 * n", lambda n: 2 * n), ("negate", "-n", lambda n: -n),
        ("add one to", "n + 1", lambda n: n + 1), ("subtract one from", "n - 1", lambda n: n - 1),
        ("cube", "n ** 3", lambda n: n**3), ("take the absolute value of", "abs(n)", abs),
        ("halve (rounding down)", "n // 2", lambda n: n // 2)]
RESULTS = [("return the results as a list", "list", "[{map} for n in nums if {keep}]", list),
           ("return the sum of the results", "sum", "sum({map} for n in nums if {keep})", sum),
           ("return the largest result (0 when none is left)", "max", "max(({map} for n in nums if {keep}), default=0)",
            lambda values: max(values, default=0))]
WORDS = ["river", "lantern", "pepper", "orbit", "meadow", "violin", "harbor", "cactus", "glacier", "pixel",
         "saddle", "tundra", "walnut", "zephyr", "biscuit", "compass", "falcon", "granite", "hammock", "igloo",
         "jasmine", "kettle", "lobster", "marble", "nutmeg", "oyster", "parrot", "quartz", "rocket", "spindle"]
UNITS = [("minutes", "hours", 60), ("seconds", "minutes", 60), ("hours", "days", 24), ("days", "weeks", 7),
         ("centimetres", "metres", 100), ("grams", "kilograms", 1000), ("millilitres", "litres", 1000),
         ("months", "years", 12)]


def word_problem(rng: random.Random) -> tuple[str, str, int]:
    name, other = rng.sample(NAMES, 2)
    plural, _ = rng.choice(ITEMS)
    a, b, c = rng.randint(3, 40), rng.randint(2, 25), rng.randint(1, 9)
    kind = rng.randrange(3)
    if kind == 0:
        q = f"{name} has {a} {plural}. {other} gives {name} {b} more. How many {plural} does {name} have now?"
        steps, answer = f"{name} starts with {a} {plural} and gets {b} more: {a} + {b} = {a + b}.", a + b
    elif kind == 1:
        a = a + b
        q = f"{name} had {a} {plural} and gave {b} of them to {other}. How many {plural} are left?"
        steps, answer = f"Giving away {b} of {a} leaves {a} - {b} = {a - b}.", a - b
    else:
        q = f"{name} buys {c} bags with {b} {plural} in each bag. How many {plural} is that in total?"
        steps, answer = f"{c} bags of {b} {plural} make {c} * {b} = {c * b}.", c * b
    return q, f"{steps}\nThe answer is {answer}.\n#### {answer}", answer


def problem_key(problem: tuple) -> str:
    """A word problem without its people's names: two that differ only in them are the same problem."""
    return re.sub(r"\b(" + "|".join(NAMES) + r")\b", "_", problem[0])


def arithmetic_sft(rng: random.Random, n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a, _ in distinct(lambda: word_problem(rng), n, problem_key)]


def chats(rng: random.Random, n: int) -> list[dict]:
    """Short two-turn chats in ShareGPT layout (from/value): each asks something of its own (a fact,
    a unit conversion, a word's letters, a clock time, an ordering), and no two ask the same."""
    kinds = [_unit_chat, _letters_chat, _clock_chat, _order_chat]
    facts = list(TOPICS.items())
    rng.shuffle(facts)
    chats = [_fact_chat(*fact) for fact in facts] + distinct(lambda: rng.choice(kinds)(rng), n - len(facts))
    rng.shuffle(chats)
    return [{"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": text} for i, text in enumerate(turns)]}
            for turns in chats]


def distinct(draw, n: int, key=json.dumps) -> list:
    """n draws, no two with the same `key`: a template filled at random repeats itself now and then."""
    drawn, seen = [], set()
    while len(drawn) < n:
        item = draw()
        key_of = key(item)
        if key_of not in seen:
            seen.add(key_of)
            drawn.append(item)
    return drawn


def _fact_chat(topic: str, fact: str) -> list[str]:
    return [f"Tell me one fact about {topic}.", fact, "Can you say that in a few words?",
            f"In short: {fact.split(';')[0].rstrip('.').lower()}."]


def _unit_chat(rng: random.Random) -> list[str]:
    small, big, per = rng.choice(UNITS)
    a, b = rng.sample(range(2, 31), 2)
    return [f"How many {small} are in {a} {big}?", f"{a} {big} is {a} x {per} = {a * per} {small}.",
            f"And in {b} {big}?", f"{b} x {per} = {b * per} {small}."]


def _letters_chat(rng: random.Random) -> list[str]:
    word = rng.choice(WORDS)
    return [f"How many letters does the word '{word}' have?", f"'{word}' has {len(word)} letters.",
            f"And how is '{word}' spelt backwards?", f"Backwards, '{word}' is '{word[::-1]}'."]


def _clock_chat(rng: random.Random) -> list[str]:
    start, later, more = rng.randint(0, 23), rng.randint(1, 30), rng.randint(1, 12)
    first, second = (start + later) % 24, (start + later + more) % 24
    return [f"It is {start:02d}:00 now. What time will it be in {later} hours?",
            f"{later} hours after {start:02d}:00 it will be {first:02d}:00.",
            f"And {more} hours after that?", f"Then it will be {second:02d}:00."]


def _order_chat(rng: random.Random) -> list[str]:
    picked = rng.sample(WORDS, 4)
    ordered = sorted(picked)
    return [f"Put these words in alphabetical order: {', '.join(picked)}.", ", ".join(ordered) + ".",
            "Which one comes last?", f"'{ordered[-1]}' comes last."]


def coding(rng: random.Random, n: int) -> list[dict]:
    """Small coding tasks in Alpaca layout (instruction/input/output), each a different function."""
    styles = [
        "Write a Python function that keeps the {keep} integers of a list; {verb} each of them and {result}.",
        "Implement `{name}(nums)`: from a list of integers, keep those that are {keep}, {verb} each, and {result}.",
        "In Python: given integers `nums`, {verb} every number that is {keep}, then {result}.",
        "I need a short Python function. Input: a list of numbers. Keep the {keep} numbers, {verb} them, {result}.",
    ]
    inputs = ["", "Name it `{name}`.", "Keep it to one line in the body.", "Add no imports."]
    combos = [(k, m, r) for k in KEEPS for m in MAPS for r in RESULTS]
    rng.shuffle(combos)
    rows = []
    for (keep, keep_code, kept), (verb, map_code, mapped), (result, kind, body, gather) in combos[:n]:
        name = f"{kind}_{verb.split()[0]}_{keep.split()[0]}"
        code = f"def {name}(nums):\n    return {body.format(map=map_code, keep=keep_code)}\n"
        nums = [rng.randint(-6, 15) for _ in range(5)]
        value = gather([mapped(x) for x in nums if kept(x)])
        rows.append({"instruction": rng.choice(styles).format(keep=keep, verb=verb, result=result, name=name),
                     "input": rng.choice(inputs).format(name=name),
                     "output": f"```python\n{code}```\nFor example, `{name}({nums})` returns `{value}`."})
    return rows


def long_reasoning(rng: random.Random, n: int) -> list[dict]:
    """A handful of rows with long step-by-step reasoning (the SmolLM3 lesson: few rows, many tokens)."""
    rows = []
    for _ in range(n):
        numbers = [rng.randint(10, 99) for _ in range(20)]
        lines, total = [], 0
        for x in numbers:
            lines.append(f"Running total {total} plus {x} gives {total + x}.")
            total += x
        question = "Add these numbers one by one and give the sum: " + ", ".join(map(str, numbers)) + "."
        answer = "<think>\n" + "\n".join(lines) + "\n</think>\n\n" + f"The sum is {total}."
        rows.append({"question": question, "answer": answer})
    return rows


def rl_prompts(rng: random.Random, n: int) -> list[dict]:
    """Small-number arithmetic with gold answers, no question twice: prompts a tiny model sometimes solves."""
    questions = [(a, op, b) for a in range(1, 21) for b in range(1, 10) for op in "+*-"]
    rows = []
    for a, op, b in rng.sample(questions, n):
        value = {"+": a + b, "*": a * b, "-": a - b}[op]
        rows.append({"question": f"What is {a} {op} {b}? Answer with the number only.", "answer": str(value),
                     "solution": f"#### {value}"})
    return rows


def preference(rng: random.Random, n: int) -> list[dict]:
    """Correct worked answers (chosen) against the same reasoning ending in a wrong number (rejected)."""
    rows = []
    for q, good, answer in distinct(lambda: word_problem(rng), n, problem_key):
        wrong = answer + rng.choice([-3, -2, -1, 1, 2, 3])
        bad = good.replace(f"The answer is {answer}.", f"The answer is {wrong}.").replace(f"#### {answer}", f"#### {wrong}")
        rows.append({"prompt": q, "chosen": good, "rejected": bad})
    return rows


def write(name: str, rows: list[dict]) -> None:
    path = OUT / name
    with open(path, "w") as fh:
        fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    print(f"{path.relative_to(OUT.parents[1])}: {len(rows)} rows")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261129)
    write("arithmetic_sft.jsonl", arithmetic_sft(rng, 600))
    write("chats_sharegpt.jsonl", chats(rng, 180))
    write("coding_alpaca.jsonl", coding(rng, 192))
    write("long_reasoning.jsonl", long_reasoning(rng, 12))
    write("rl_arithmetic.jsonl", rl_prompts(rng, 300))
    write("preference_arithmetic.jsonl", preference(rng, 240))


if __name__ == "__main__":
    main()
