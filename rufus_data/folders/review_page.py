"""The one way Rufus writes a page for a person to review rows in a browser: a self-contained
HTML file (inline CSS and script, nothing fetched), cards that filter by the values of some
select boxes, and `<mark>` spans for text two sides share. decontam's hits.html
(rufus_data/decontam/hits_page.py) and `rufus-eval vibe`'s side-by-side page use it."""

from __future__ import annotations

import html
import re

import pyarrow as pa

from rufus_data.similarity.textnorm import tokenize_array

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .3em; }
.bar { position: sticky; top: 0; background: #fafafa; padding: .5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
.bar label { margin-right: 1.2em; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; margin: 1em 0; padding: .8em 1em; }
.card[hidden] { display: none; }
.meta { color: #555; margin-bottom: .5em; }
.meta b { color: #222; }
.sides { display: grid; grid-template-columns: repeat(var(--sides, 2), minmax(0, 1fr)); gap: 1em; }
.side h3 { font-size: 1em; margin: 0 0 .3em; color: #444; }
.text { white-space: pre-wrap; word-break: break-word; background: #f6f6f6; border-radius: 4px; padding: .5em;
        font: 13px/1.4 ui-monospace, monospace; max-height: 32em; overflow: auto; }
mark { background: #ffd54f; color: #000; padding: 0 1px; border-radius: 2px; }
.tag { display: inline-block; padding: 0 .5em; border-radius: 9px; background: #e3e8f0; margin-right: .4em; }
"""

SCRIPT = """
(function () {
  var selects = document.querySelectorAll('select[data-filter]');
  var cards = document.querySelectorAll('.card');
  function apply() {
    var shown = 0;
    cards.forEach(function (card) {
      var keep = true;
      selects.forEach(function (select) {
        if (select.value && card.dataset[select.dataset.filter] !== select.value) keep = false;
      });
      card.hidden = !keep;
      if (keep) shown += 1;
    });
    document.getElementById('shown').textContent = shown + ' of ' + cards.length + ' shown';
  }
  selects.forEach(function (select) { select.addEventListener('change', apply); });
  apply();
})();
"""

_WORD = re.compile(r"\S+")


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def words_with_spans(texts: list[str]) -> list[list[tuple[str, int, int]]]:
    """Each text's normalised words (textnorm's rules, as decontam compares them), each with the
    character span of the whitespace-separated token it came from; one Arrow pass for all the
    texts, since a page of a thousand cards made a pass per text cost a second."""
    tokens = [[(m.group(), m.start(), m.end()) for m in _WORD.finditer(text or "")] for text in texts]
    flat_tokens = [token for spans in tokens for token, _, _ in spans]
    if not flat_tokens:
        return [[] for _ in texts]
    flat, offsets = tokenize_array(pa.array(flat_tokens, pa.large_string()))
    words, bounds = flat.to_pylist(), offsets.tolist()
    out, k = [], 0
    for spans in tokens:
        out.append([(word, start, end) for i, (_, start, end) in enumerate(spans, k) for word in words[bounds[i]:bounds[i + 1]]])
        k += len(spans)
    return out


def shared_positions(words: list[str], other: set[tuple[str, ...]], n: int) -> set[int]:
    """Positions of `words` covered by an n-gram that is also in `other`."""
    marked: set[int] = set()
    for i in range(len(words) - n + 1):
        if tuple(words[i:i + n]) in other:
            marked.update(range(i, i + n))
    return marked


def grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def marked_html(text: str, spans: list[tuple[int, int]]) -> str:
    """The text, escaped, with each (start, end) character span in a <mark>."""
    out, at = [], 0
    for start, end in sorted(spans):
        if start < at:
            continue
        out += [escape(text[at:start]), "<mark>", escape(text[start:end]), "</mark>"]
        at = end
    return "".join(out) + escape(text[at:])


def word_spans(words: list[tuple[str, int, int]], marked: set[int]) -> list[tuple[int, int]]:
    """Runs of marked words as character spans (the space between two marked words included)."""
    spans: list[tuple[int, int]] = []
    for i in sorted(marked):
        _, start, end = words[i]
        if spans and (i - 1) in marked:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def highlight_shared(left: str, right: list[str], n: int, only: set[str] | None = None,
                     words: dict[str, list[tuple[str, int, int]]] | None = None) -> tuple[str, list[str]]:
    """`left` and each text of `right` as HTML, the runs of n or more words they share marked
    (`only`: mark single words of this set instead, e.g. the semantic stage's shared words).
    `words`: text -> its words_with_spans, computed once for a whole page (else here)."""
    if words is None:
        words = dict(zip([left, *right], words_with_spans([left, *right])))
    left_words = words[left]
    right_words = [words[text] for text in right]
    if only is not None:
        mark = [{i for i, (w, _, _) in enumerate(ws) if w in only} for ws in [left_words, *right_words]]
    else:
        left_grams = grams([w for w, _, _ in left_words], n)
        right_grams = set().union(*(grams([w for w, _, _ in ws], n) for ws in right_words)) if right_words else set()
        mark = [shared_positions([w for w, _, _ in left_words], right_grams, n),
                *(shared_positions([w for w, _, _ in ws], left_grams, n) for ws in right_words)]
    left_html = marked_html(left, word_spans(left_words, mark[0]))
    right_html = [marked_html(text, word_spans(ws, m)) for text, ws, m in zip(right, right_words, mark[1:])]
    return left_html, right_html


def select_box(label: str, key: str, values: list[str]) -> str:
    options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values)
    return (f'<label>{escape(label)} <select data-filter="{escape(key)}"><option value="">all</option>'
            f"{options}</select></label>")


def page(title: str, intro: str, filters: dict[str, tuple[str, list[str]]], cards: list[str]) -> str:
    """The whole page. `filters`: data key -> (label, values); each card is a `card()`."""
    boxes = "".join(select_box(label, key, values) for key, (label, values) in filters.items())
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
            f"<body><h1>{escape(title)}</h1><p>{intro}</p>"
            f'<div class="bar">{boxes}<span id="shown"></span></div>'
            f'{"".join(cards)}<script>{SCRIPT}</script></body></html>\n')


def card(data: dict[str, str], meta: str, sides: list[tuple[str, str]]) -> str:
    """One card: `data` (the values the filters select on), a line of metadata (HTML), and the
    sides shown next to each other, each (heading, HTML of its text)."""
    attributes = " ".join(f'data-{key}="{escape(value)}"' for key, value in data.items())
    columns = "".join(f'<div class="side"><h3>{escape(head)}</h3><div class="text">{body}</div></div>'
                      for head, body in sides)
    return (f'<section class="card" {attributes}><div class="meta">{meta}</div>'
            f'<div class="sides" style="--sides: {len(sides)}">{columns}</div></section>')

