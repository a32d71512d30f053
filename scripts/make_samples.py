"""Write the small sample sources behind catalogs/sft.yaml, rl.yaml and preference.yaml.

Everything here is generated from templates with a fixed seed (nothing is copied from any
dataset), so the README's main job runs offline. Re-run to regenerate:
    python scripts/make_samples.py
"""

from __future__ import annotations

import json
import random
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
FUNCS = [
    ("add two numbers", "add", "a, b", "return a + b", "add(2, 3) == 5"),
    ("return the largest item of a list", "largest", "items", "return max(items)", "largest([3, 9, 2]) == 9"),
    ("reverse a string", "reverse", "text", "return text[::-1]", "reverse('abc') == 'cba'"),
    ("count the vowels in a string", "count_vowels", "text", "return sum(c in 'aeiou' for c in text.lower())",
     "count_vowels('Rufus') == 2"),
    ("check whether a number is even", "is_even", "n", "return n % 2 == 0", "is_even(4) is True"),
    ("square every number of a list", "squares", "nums", "return [n * n for n in nums]", "squares([1, 2]) == [1, 4]"),
    ("join words with spaces", "join_words", "words", "return ' '.join(words)", "join_words(['a', 'b']) == 'a b'"),
    ("sum the digits of a number", "digit_sum", "n", "return sum(int(d) for d in str(abs(n)))", "digit_sum(123) == 6"),
    ("keep only the positive numbers", "positives", "nums", "return [n for n in nums if n > 0]",
     "positives([-1, 2]) == [2]"),
    ("compute a factorial", "factorial", "n", "return 1 if n < 2 else n * factorial(n - 1)", "factorial(4) == 24"),
    ("check whether a word is a palindrome", "is_palindrome", "word", "return word == word[::-1]",
     "is_palindrome('level') is True"),
    ("count the words in a sentence", "word_count", "text", "return len(text.split())", "word_count('a b c') == 3"),
]


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


def arithmetic_sft(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        q, a, _ = word_problem(rng)
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    return rows


def chats(rng: random.Random, n: int) -> list[dict]:
    """Short multi-turn chats in ShareGPT layout (from/value), each one distinct."""
    openers = ["Tell me something about {t}.", "What is one fact about {t}?", "I'm curious about {t}. Any tip?",
               "Share a quick note on {t}, please."]
    follows = [
        ("Can you say that in one short sentence?", "In short: {short}."),
        ("Why does that matter?", "Knowing it helps you make better everyday choices about {t}."),
        ("Thanks! Anything else?", "Happy to help. Ask me anything else about {t}."),
        ("Is that always true?", "Mostly, though details can vary; it is a good rule of thumb for {t}."),
    ]
    combos = [(t, f, o, fu) for t, f in TOPICS.items() for o in openers for fu in follows]
    rng.shuffle(combos)
    rows = []
    for topic, fact, opener, (follow, reply) in combos[:n]:
        short = fact.split(";")[0].rstrip(".")
        rows.append({"conversations": [
            {"from": "human", "value": opener.format(t=topic)},
            {"from": "gpt", "value": fact},
            {"from": "human", "value": follow},
            {"from": "gpt", "value": reply.format(t=topic, short=short)},
        ]})
    return rows


def coding(rng: random.Random, n: int) -> list[dict]:
    """Small coding tasks in Alpaca layout (instruction/input/output)."""
    styles = ["Write a Python function to", "Implement a function that should", "In Python, write code to",
              "Give me a short Python function to"]
    inputs = ["", "Name it `{name}`.", "Keep it to one line in the body.", "Add no imports."]
    combos = [(f, s, i) for f in FUNCS for s in styles for i in inputs]
    rng.shuffle(combos)
    rows = []
    for (task, name, args, body, check), style, extra in combos[:n]:
        code = f"def {name}({args}):\n    {body}\n"
        rows.append({"instruction": f"{style} {task}.", "input": extra.format(name=name),
                     "output": f"```python\n{code}```\nFor example, `{check}`."})
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
    """Single-digit arithmetic with gold answers: prompts a tiny model sometimes solves."""
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        op = rng.choice(["+", "*", "-"])
        value = {"+": a + b, "*": a * b, "-": a - b}[op]
        rows.append({"question": f"What is {a} {op} {b}? Answer with the number only.", "answer": str(value),
                     "solution": f"#### {value}"})
    return rows


def preference(rng: random.Random, n: int) -> list[dict]:
    """Correct worked answers (chosen) against the same reasoning ending in a wrong number (rejected)."""
    rows = []
    for _ in range(n):
        q, good, answer = word_problem(rng)
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
