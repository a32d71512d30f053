"""What a paraphrase of an eval item keeps, measured on a (training text, eval item) pair.

An embedding says two texts are about the same thing; it cannot tell a restated benchmark item
from another problem of the same kind ("a bakery sells cupcakes..."). A paraphrase changes the
wording but keeps what makes the item *that* item:

- its quantities, weighted by how rare each number is among the eval items (a `2` says little,
  a `64` much): `3 inch heels` and `three inches`, `$1,000` and `1000 dollars`, `2 hours` and
  `120 minutes` are the same quantity (numbers are read from digits, from written-out words,
  fractions and percentages, and a number followed by a unit also counts in the unit's base);
- its rare content words: the words of the item weighted by how rare they are among all the
  eval items loaded (`skeins`, `bumper`, `cupcakes` weigh much more than `total` or `many`);
- its entities: capitalised words that the eval corpus never writes in lower case (`Martha`,
  `Instagram`).

Each share is the part of the *eval item's* evidence found in the training text (containment,
not similarity: a leaked item usually sits inside a longer row)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rufus_data.similarity.textnorm import tokenize_array

# A short English stopword list: function words carry no identity of an item.
STOPWORDS = frozenset((
    "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any", "are",
    "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by",
    "can", "could", "did", "do", "does", "doing", "down", "during", "each", "either", "else", "ever",
    "every", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers",
    "herself", "him", "himself", "his", "how", "however", "i", "if", "in", "into", "is", "it", "its",
    "itself", "just", "least", "less", "let", "like", "made", "make", "many", "may", "me", "might",
    "more", "most", "much", "must", "my", "myself", "neither", "no", "nor", "not", "now", "of", "off",
    "often", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves", "out", "over",
    "own", "per", "rather", "same", "shall", "she", "should", "since", "so", "some", "such", "than",
    "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this",
    "those", "through", "thus", "to", "too", "under", "until", "up", "upon", "us", "very", "was", "we",
    "were", "what", "whatever", "when", "where", "whether", "which", "while", "who", "whom", "whose",
    "why", "will", "with", "within", "without", "would", "yet", "you", "your", "yours", "yourself",
    "yourselves", "one", "ones", "another", "s", "t", "don", "doesn", "didn", "isn", "aren", "wasn",
    "weren", "won",
))

_UNITS: dict[str, tuple[str, float]] = {}


def _units(dimension: str, factor: float, *names: str) -> None:
    for name in names:
        _UNITS[name] = (dimension, factor)


# unit word -> (dimension, factor to the dimension's base unit)
_units("time", 1, "second", "seconds", "sec", "secs")
_units("time", 60, "minute", "minutes", "min", "mins")
_units("time", 3600, "hour", "hours", "hr", "hrs")
_units("time", 86400, "day", "days")
_units("time", 604800, "week", "weeks")
_units("time", 31536000, "year", "years")
_units("length", 0.0254, "inch", "inches")
_units("length", 0.3048, "foot", "feet")
_units("length", 0.9144, "yard", "yards")
_units("length", 1609.344, "mile", "miles")
_units("length", 0.001, "mm", "millimeter", "millimeters", "millimetre", "millimetres")
_units("length", 0.01, "cm", "centimeter", "centimeters", "centimetre", "centimetres")
_units("length", 1, "meter", "meters", "metre", "metres")
_units("length", 1000, "km", "kilometer", "kilometers", "kilometre", "kilometres")
_units("mass", 1, "g", "gram", "grams")
_units("mass", 1000, "kg", "kilogram", "kilograms", "kilo", "kilos")
_units("mass", 28.349523125, "ounce", "ounces", "oz")
_units("mass", 453.59237, "pound", "pounds", "lb", "lbs")
_units("volume", 1, "ml", "milliliter", "milliliters", "millilitre", "millilitres")
_units("volume", 1000, "l", "liter", "liters", "litre", "litres")
_units("volume", 236.5882365, "cup", "cups")
_units("volume", 473.176473, "pint", "pints")
_units("volume", 946.352946, "quart", "quarts")
_units("volume", 3785.411784, "gallon", "gallons")
_units("money", 1, "cent", "cents")
_units("money", 100, "dollar", "dollars", "$")

_SMALL = {w: i for i, w in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"))}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"))}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
# words that are a number on their own ("half of the apples", "twice as many", "a dozen eggs")
_STANDALONE = {"half": 0.5, "quarter": 0.25, "twice": 2, "double": 2, "thrice": 3, "triple": 3, "dozen": 12,
               "dozens": 12}

NUMBER_WORDS = frozenset((*_SMALL, *_TENS, *_STANDALONE))  # every word that is a number on its own


def may_hold_quantities(tokens: pa.Array, ids: np.ndarray, number_word_ids: np.ndarray) -> np.ndarray:
    """Per normalised word (its `TokenHasher` id in `ids`), whether it can begin a quantity: a
    word of other than ASCII letters (digits, "twenty-five", "one's", ...) or a number word
    (`number_word_ids`: the ids of NUMBER_WORDS). A superset of the words `quantity_keys` reads
    a quantity from, in one Arrow kernel, so spans without any can skip the semantic stage."""
    letters_only = pc.ascii_is_alpha(tokens).to_numpy(zero_copy_only=False)
    return ~letters_only | np.isin(ids, number_word_ids)


# numbers (thousands separators only before groups of 3 digits: "3,4" is a list), words, "$"
_TOKEN = re.compile(r"\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?|\$?\d+(?:\.\d+)?(?:/\d+)?%?|[a-z]+(?:-[a-z]+)*|\$")


def _digits(token: str) -> float | None:
    core = token.lstrip("$").rstrip("%")
    if "/" in core:
        top, bottom = core.split("/", 1)
        return float(top) / float(bottom) if float(bottom) else None
    return float(core.replace(",", ""))


@lru_cache(maxsize=100_000)
def _key(value: float) -> str:
    return f"{value:.6g}"


# What a word holds for the quantity parser: ("num", value, money), ("word", value) (a number
# word below a hundred), ("scale", factor), ("alone", value) (half, twice, dozen), ("unit",
# dimension, factor), ("and",); OTHER for a word with none of these.
OTHER: tuple = ()


@lru_cache(maxsize=500_000)
def word_info(word: str) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
    """(content stems, quantity parts) of one normalised word (textnorm.py), cached:
    a batch repeats the same few thousand words."""
    stems, parts = [], []
    for token in _TOKEN.findall(word):
        if token[0].isdigit() or (token[0] == "$" and len(token) > 1):
            value = _digits(token)
            if value is not None:
                parts.append(("num", value, token[0] == "$"))
            continue
        for piece in token.split("-"):
            if piece in _SMALL or piece in _TENS:
                parts.append(("word", _SMALL.get(piece, 0) + _TENS.get(piece, 0)))
            elif piece in _SCALES:
                parts.append(("scale", _SCALES[piece]))
            elif piece in _STANDALONE:
                parts.append(("alone", _STANDALONE[piece]))
            else:
                if piece in _UNITS:
                    parts.append(("unit", *_UNITS[piece]))
                elif piece == "and":
                    parts.append(("and",))
                if piece.isalpha() and len(piece) >= 3 and piece not in STOPWORDS:
                    stems.append(stem(piece))
    return tuple(stems), tuple(parts) or (OTHER,)


def _parts(words: list[str]) -> list[tuple]:
    return [part for w in words for part in word_info(w)[1]]


def _quantities(parts: list[tuple]):
    """Yield (value key, unit key or None) for every quantity in a stream of word parts; the unit
    key is `<dimension>:<value in base units>` when a unit follows within two words."""
    i, n = 0, len(parts)
    while i < n:
        kind = parts[i][0] if parts[i] else ""
        money = False
        if kind == "num":
            value, money = parts[i][1], parts[i][2]
            i += 1
            if i < n and parts[i] and parts[i][0] == "scale":  # "2.5 million"
                value *= parts[i][1]
                i += 1
        elif kind == "word":
            value, current = 0.0, 0.0
            # a run of number words: "one hundred and twenty-five", "two thousand"
            while i < n and parts[i] and parts[i][0] in ("word", "scale", "and"):
                if parts[i][0] == "and":
                    if not (i + 1 < n and parts[i + 1] and parts[i + 1][0] == "word"):
                        break
                elif parts[i][0] == "scale":
                    current = max(current, 1) * parts[i][1]
                    if parts[i][1] >= 1000:
                        value, current = value + current, 0.0
                else:
                    current += parts[i][1]
                i += 1
            value += current
        elif kind == "alone":
            value = parts[i][1]
            i += 1
        else:
            i += 1
            continue
        unit = ("money", 100) if money else next((p[1:] for p in parts[i : i + 2] if p and p[0] == "unit"), None)
        yield _key(value), (None if unit is None else f"{unit[0]}:{_key(value * unit[1])}")


def quantity_keys(words: list[str]) -> set[str]:
    """Every quantity of a training text (its normalised words) as keys to look eval quantities
    up in: `v:<value>`, and `u:<dimension>:<base value>` for a number with a unit."""
    keys = set()
    for value, unit in _quantities(_parts(words)):
        keys.add(f"v:{value}")
        if unit:
            keys.add(f"u:{unit}")
    return keys


def item_quantities(words: list[str]) -> tuple[tuple[str, frozenset[str]], ...]:
    """An eval item's distinct quantities: (value key, the keys that count as keeping it)."""
    found: dict[str, set[str]] = {}
    for value, unit in _quantities(_parts(words)):
        keys = found.setdefault(value, {f"v:{value}"})
        if unit:
            keys.add(f"u:{unit}")
    return tuple((value, frozenset(keys)) for value, keys in found.items())


_WORD = re.compile(r"[A-Za-z][A-Za-z']+")


def stem(word: str) -> str:
    """A crude English stem so that `skein`/`skeins`, `knit`/`knitting` meet."""
    w = word.lower().rstrip("'")
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: len(w) - len(suffix)] + keep
            break
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
        w = w[:-1]  # knitting -> knitt -> knit, stuff and stuffed -> stuf
    return w.rstrip("e")


def content_words(words: list[str]) -> set[str]:
    """Stems of the normalised words that can carry an item's identity (no stopwords, no numbers)."""
    return {s for w in words for s in word_info(w)[0]}


def capitalised_words(text: str) -> set[str]:
    """Stems of words written with a capital letter in raw text (entity candidates)."""
    return {stem(w) for w in _WORD.findall(text) if w[0].isupper() and w.lower() not in STOPWORDS}


@dataclass(frozen=True)
class ItemEvidence:
    """What one eval item brings to a comparison (computed once per item)."""

    quantities: tuple[tuple[str, frozenset[str], float], ...]  # (value, keys that keep it, rarity)
    words: dict[str, float]  # content stem -> weight (rarity)
    entities: frozenset[str]
    total_weight: float  # of all its content words
    quantity_weight: float  # of all its quantities


class EvidenceModel:
    """Word and number rarities and entity detection learned from the eval items themselves."""

    def __init__(self, texts: list[str]):
        self.docs = len(texts)
        self.df: Counter[str] = Counter()  # content stems and quantity values (`#<value>`)
        self._words = normalised_words(texts)
        self._quantities = [item_quantities(words) for words in self._words]
        lower_seen: set[str] = set()
        for text, words, quantities in zip(texts, self._words, self._quantities):
            self.df.update(content_words(words))
            self.df.update(f"#{value}" for value, _ in quantities)
            lower_seen.update(stem(w) for w in _WORD.findall(text) if w[0].islower())
        self._lower_seen = lower_seen

    def weight(self, key: str) -> float:
        """Inverse document frequency over the eval corpus (an unseen word is as rare as can be)."""
        return math.log((self.docs + 1) / (self.df.get(key, 0) + 1))

    def items(self, texts: list[str]) -> list[ItemEvidence]:
        """The evidence of each eval text (the texts the model was made from, in order)."""
        out = []
        for text, words, found in zip(texts, self._words, self._quantities):
            weights = {w: self.weight(w) for w in content_words(words)}
            entities = frozenset(w for w in capitalised_words(text) if w not in self._lower_seen and w in weights)
            quantities = tuple((value, keys, self.weight(f"#{value}")) for value, keys in found)
            out.append(ItemEvidence(quantities, weights, entities, sum(weights.values()), sum(q[2] for q in quantities)))
        return out


def normalised_words(texts: list[str]) -> list[list[str]]:
    """The normalised words of each text, in one Arrow batch."""
    flat, offsets = tokenize_array(pa.array(texts, pa.large_string()))
    words = flat.to_pylist()
    return [words[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


@dataclass(slots=True)
class Evidence:
    """Shares of one eval item's evidence found in a training text; None where the item has none."""

    quantities_kept: int
    quantities_total: int
    quantity_share: float  # rarity-weighted share of the item's quantities found (0 when it has none)
    word_share: float  # rarity-weighted share of the item's content words found
    entities_kept: int
    entities_total: int
    shared_words: tuple[str, ...]  # the rarest shared content words, for a reader


def word_share(item: ItemEvidence, row_words: set[str]) -> float:
    """The rarity-weighted share of `item`'s content words found in a text's `content_words` (the
    cheap half of the evidence: a pair that fails on it needs no quantities read)."""
    if not item.total_weight:
        return 0.0
    return round(sum(item.words[w] for w in row_words.intersection(item.words)) / item.total_weight, 4)


def compare(item: ItemEvidence, row_quantities: set[str], row_words: set[str]) -> Evidence:
    """How much of `item`'s evidence a training text keeps, given the text's `quantity_keys` and
    `content_words`."""
    kept = [weight for _, keys, weight in item.quantities if not keys.isdisjoint(row_quantities)]
    quantity_share = sum(kept) / item.quantity_weight if item.quantity_weight else 0.0
    shared = sorted(row_words.intersection(item.words), key=item.words.__getitem__, reverse=True)
    share = word_share(item, row_words)
    entities = len(item.entities.intersection(row_words))
    return Evidence(len(kept), len(item.quantities), round(quantity_share, 4), share, entities,
                    len(item.entities), tuple(shared[:8]))
