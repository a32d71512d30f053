"""Chat templates rendered many conversations per call, for token counting.

transformers' `render_jinja_template` renders one conversation per template call; each call
builds a jinja context, copies the conversation and starts the generation tracker, about half of
the rendering time of a short chat. Here the template runs inside one loop over a group of
conversations (`{% for messages in rows %}...{% endfor %}`, through the same function, so the
same sandbox, filters and `{% generation %}` tracking), a separator after each; the output is
cut at the separators and each `{% generation %}` span moved to its row.

The result is the per-conversation rendering's, checked, not assumed: the first group of every
renderer is also rendered one conversation at a time and compared (a template that reads
`loop` at its top level, say, renders differently inside the loop and is then always rendered
one conversation at a time), and a group whose output does not cut into one piece per row (the
separator inside a message), or whose template raises, is rendered one conversation at a time
(which raises the template's own error for the row at fault)."""

from __future__ import annotations

import re
from bisect import bisect_right

ROWS_PER_CALL = 32  # the generation tracker re-joins the output so far at every span: keep calls short
SEPARATOR = "\x00rufus:end-of-row\x00"
_NEWLINE_AT_END = re.compile(r"(\r\n|\r|\n)\Z")


def render_each(conversations: list[list[dict]], template: str, tracked: bool, **kwargs) -> tuple[list[str], list]:
    """transformers' rendering, one template call per conversation: (texts, generation spans of each)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template(conversations=conversations, chat_template=template,
                                 return_assistant_tokens_mask=tracked, **kwargs)


class ChatRenderer:
    """Renders conversations with one chat template, many per template call where that renders
    what one call per conversation renders (the module docstring)."""

    def __init__(self, template: str, tracked: bool):
        self.template, self.tracked = template, tracked
        # jinja drops one newline at the end of a template's source; inside the loop it would be
        # output, so it goes here. trim_blocks eats the newline after the loop's opening tag, so
        # the template's own first line is kept as it is.
        body = _NEWLINE_AT_END.sub("", template)
        self.looped = "{% for messages in rufus_rows %}\n" + body + "{{ rufus_separator }}{% endfor %}"
        self.batched: bool | None = None  # None until the first group has been checked

    def render(self, conversations: list[list[dict]], **kwargs) -> tuple[list[str], list]:
        """(rendered texts, per text its `{% generation %}` spans (empty lists when untracked))."""
        texts: list[str] = []
        spans: list = []
        for lo in range(0, len(conversations), ROWS_PER_CALL):
            group = conversations[lo : lo + ROWS_PER_CALL]
            found = self._render_group(group, kwargs) if self.batched is not False else None
            if self.batched is None:
                self.batched = found is not None and found == self._each(group, kwargs)
                found = found if self.batched else None
            if found is None:
                found = self._each(group, kwargs)
            texts += found[0]
            spans += found[1]
        return texts, spans

    def _each(self, group: list[list[dict]], kwargs: dict) -> tuple[list[str], list]:
        texts, spans = render_each(group, self.template, self.tracked, **kwargs)
        return texts, [[tuple(s) for s in row] for row in spans] if self.tracked else [[] for _ in texts]

    def _render_group(self, group: list[list[dict]], kwargs: dict) -> tuple[list[str], list] | None:
        try:
            # each conversation's reasoning fields aliased as transformers does it per conversation; a
            # private helper, so a transformers without it renders one conversation at a time instead
            from transformers.utils.chat_template_utils import _alias_reasoning_fields

            rows = [_alias_reasoning_fields(c) for c in group]
            if is_plain(rows) and is_plain(kwargs):
                [text], found = self._render_plain(rows, kwargs)
            else:
                [text], found = render_each([[]], self.looped, self.tracked, rufus_rows=rows, rufus_separator=SEPARATOR,
                                            **kwargs)
        except Exception:  # noqa: BLE001 - rendered one at a time instead, which raises the template's error
            return None
        pieces = text.split(SEPARATOR)
        if len(pieces) != len(group) + 1 or pieces[-1]:
            return None
        starts, at = [], 0
        for piece in pieces[:-1]:
            starts.append(at)
            at += len(piece) + len(SEPARATOR)
        spans: list[list[tuple[int, int]]] = [[] for _ in group]
        for start, end in found[0] if self.tracked else ():
            row = bisect_right(starts, start) - 1
            if end > starts[row] + len(pieces[row]):
                return None
            spans[row].append((start - starts[row], end - starts[row]))
        return pieces[:-1], spans

    def _render_plain(self, rows: list[list[dict]], kwargs: dict) -> tuple[list[str], list]:
        """The looped template rendered as render_each renders it, less the copy of every value into
        plain types (`_plain_template_data`, a sixth of the time): the values are plain already."""
        from transformers.utils.chat_template_utils import (
            _compile_jinja_template,
            _render_with_assistant_indices,
        )

        compiled = _compile_jinja_template(self.looped)
        values = {"messages": [], "documents": None, "tools": None, "add_generation_prompt": False, **kwargs,
                  "rufus_rows": rows, "rufus_separator": SEPARATOR}
        if self.tracked:
            text, spans = _render_with_assistant_indices(compiled, **values)
            return [text], [spans]
        return [compiled.render(**values)], [[]]


PLAIN_SCALARS = (str, int, float, bool, type(None))


def is_plain(value) -> bool:
    """JSON-shaped data of exactly the built-in types (rows read from parquet or JSON are): what
    transformers' `_plain_template_data` returns unchanged. Anything else (a numpy value, a
    dataclass, an image) goes through transformers' own copy, which the sandbox relies on."""
    kind = type(value)
    if kind in PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(key) is str and (type(item) in PLAIN_SCALARS or is_plain(item)) for key, item in value.items())
    if kind is list:
        return all(type(item) in PLAIN_SCALARS or is_plain(item) for item in value)
    return False
