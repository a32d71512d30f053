"""Ways of planting an eval item into a training row, shared by the decontam tests and bench.

Each function takes the eval text (and a seeded random.Random) and returns the leaked text as a
careless or adversarial data pipeline would have written it."""

from __future__ import annotations

import random
import re

from rufus_data.similarity.ngram_hash import TokenHasher, gram_hashes
from rufus_data.similarity.textnorm import words

# Small hand-made synonym table for rewording (common words of math and coding prompts).
SYNONYMS = {
    "how": "in what way", "many": "numerous", "much": "a lot", "what": "which", "is": "equals", "are": "happen to be",
    "the": "this", "a": "one", "of": "from", "and": "plus", "has": "owns", "have": "own", "each": "every",
    "total": "overall", "find": "determine", "if": "when", "he": "the man", "she": "the woman", "they": "the people",
    "buys": "purchases", "bought": "purchased", "sells": "vends", "sold": "vended", "makes": "earns",
    "number": "count", "value": "amount", "write": "create", "function": "routine", "given": "provided",
    "returns": "gives back", "return": "give back", "list": "array", "in": "inside", "for": "to serve",
    "on": "upon", "to": "toward", "with": "alongside", "there": "over there", "day": "daily period",
    "week": "seven days", "then": "after that", "at": "located at", "his": "the man's", "her": "the woman's",
    "can": "is able to", "will": "shall", "be": "become", "that": "which", "by": "through", "all": "every one of",
    "compute": "calculate", "let": "suppose", "such": "so", "than": "compared to", "integer": "whole number",
    "positive": "greater-than-zero", "real": "actual", "point": "spot", "points": "spots", "numbers": "counts",
}


def verbatim(text: str, rng: random.Random) -> str:
    return text


def recased_respaced(text: str, rng: random.Random) -> str:
    out = []
    for word in text.split(" "):
        choice = rng.random()
        word = word.upper() if choice < 0.3 else word.title() if choice < 0.6 else word.lower()
        out.append(word + rng.choice(["  ", " ", "\n", " \t "]))
    return re.sub(r"([.,?!])(?=\s|$)", r" \1", "".join(out)).strip()


INTROS = [
    "You are a helpful tutor. Read the task below carefully and answer it step by step, then give the final result.",
    "Here is an exercise from my homework, can you help me with it and explain every step in simple words?",
]


def embedded(text: str, rng: random.Random) -> str:
    return f"{rng.choice(INTROS)}\n\nProblem: {text}\n\nPlease put the final answer in a box at the end."


def number_changed(text: str, rng: random.Random) -> str:
    numbers = list(re.finditer(r"\d+", text))
    if not numbers:
        return text + " 7"
    m = rng.choice(numbers)
    new = str(int(m.group()) + rng.randint(1, 9))
    return text[: m.start()] + new + text[m.end() :]


def sentence_reworded(text: str, rng: random.Random) -> str:
    sentences = re.split(r"(?<=[.?!])\s+", text)
    longest = max(range(len(sentences)), key=lambda i: len(sentences[i]))
    ws = sentences[longest].split(" ")
    reworded = [SYNONYMS.get(w.lower(), w) if i % 2 == 0 else w for i, w in enumerate(ws)]
    if reworded == ws:  # no synonym: reorder the clause instead
        half = len(ws) // 2
        reworded = ws[half:] + ws[:half]
    sentences[longest] = " ".join(reworded)
    return " ".join(sentences)


def no_ngram_survives(text: str, rng: random.Random, n: int = 8) -> str:
    """Change one word in every run of 5 (synonym if known, else a plural/singular flip), so that
    no n-gram of the original survives for n >= 6."""
    ws = text.split(" ")
    for block in range(0, len(ws), 5):
        span = list(range(block, min(block + 5, len(ws))))
        known = [i for i in span if ws[i].lower().strip(".,?!") in SYNONYMS]
        i = known[0] if known else span[len(span) // 2]
        core = ws[i].strip(".,?!$")
        tail = ws[i][len(ws[i].rstrip(".,?!")) :]
        if core.lower() in SYNONYMS:
            ws[i] = SYNONYMS[core.lower()] + tail
        elif core.isdigit():
            ws[i] = ws[i].replace(core, str(int(core) + 1))
        else:
            ws[i] = ws[i] + "-like"
    return " ".join(ws)


def shared_ngrams(a: str, b: str, n: int = 8) -> int:
    """How many word n-grams (Rufus normalisation) of `a` occur in `b`."""
    hasher = TokenHasher()
    ga = set(gram_hashes(hasher(words(a)), n).tolist())
    gb = set(gram_hashes(hasher(words(b)), n).tolist())
    return len(ga & gb)


KINDS = {
    "verbatim": verbatim,
    "recased_respaced": recased_respaced,
    "embedded": embedded,
    "number_changed": number_changed,
    "sentence_reworded": sentence_reworded,
}


NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")


def paraphrased(text: str, rng: random.Random) -> str:
    """A reworded leak that neither n-grams nor MinHash can see: the question moved to the front,
    every known word swapped for its synonym and one other word in three dropped or changed, small
    numbers written out and hours given in minutes (the quantities stay the same quantities)."""
    text = re.sub(r"\b(\d+) hours\b", lambda m: f"{int(m.group(1)) * 60} minutes", text)
    sentences = re.split(r"(?<=[.?!])\s+", text.strip())
    if len(sentences) > 1:
        sentences = [sentences[-1], *sentences[:-1]]
    out = []
    for sentence in sentences:
        words_out = []
        for i, word in enumerate(sentence.split(" ")):
            core = word.strip(".,?!")
            tail = word[len(word.rstrip(".,?!")):]
            if core.isdigit() and int(core) < len(NUMBER_WORDS):
                words_out.append(NUMBER_WORDS[int(core)] + tail)
            elif core.lower() in SYNONYMS:
                words_out.append(SYNONYMS[core.lower()] + tail)
            elif (i % 3 == 2 and not any(ch.isdigit() for ch in core) and core[:1].islower()
                  and core.lower() not in NUMBER_WORDS):
                words_out.append(rng.choice(["really", "then", "also"]) + tail)
            else:
                words_out.append(word)
        out.append(" ".join(words_out))
    return "Here is a question I got: " + " ".join(out)
