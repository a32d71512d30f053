"""Rewards that travel with the data. An `rl` catalog source may declare its reward
(`reward: string_match:gsm8k`, a mapping, or a list of them); `rufus-data mix` writes it into every
row of that source, as JSON text in the column `reward_spec`, so it survives decontam, dedup and
filter (which pass columns through) and any concatenation of folders.

A command given no reward of its own (`filter`, `pairs` without --reward, an RL stage without
`rewards:`) scores each row with its own source's reward: `label_scoped_specs` turns the
{label: specs} the rows declare into one spec per (label, reward) with `only_label` set to that
label, so each reward scores its own rows and leaves the others None (excluded by TRL's nansum)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.errors import RufusError
from rufus_data.rewards.registry import parse_spec

REWARD_COLUMN = "reward_spec"

Spec = str | dict[str, Any]


def normalise_specs(value: Spec | list[Spec] | None) -> list[Spec]:
    """A source's `reward:` as a list of specs, each checked against the registry (a RufusError
    names the bad one)."""
    if value is None:
        return []
    specs = value if isinstance(value, list) else [value]
    for spec in specs:
        parse_spec(spec)
    return specs


def encode_specs(specs: list[Spec]) -> str:
    """The text stored in a row's `reward_spec` column."""
    return json.dumps(specs, sort_keys=True)


def specs_by_label(labels: Iterable[Any], encoded: Iterable[str | None]) -> dict[str, list[Spec]]:
    """{label: reward specs} declared by rows (their `label` and `reward_spec` columns). Rows of one
    label must agree, and every label must declare one: otherwise a RufusError says which."""
    found: dict[str, str] = {}
    missing: set[str] = set()
    for label, text in zip(labels, encoded, strict=True):
        label = str(label)
        if text is None:
            missing.add(label)
            continue
        if found.setdefault(label, text) != text:
            raise RufusError(
                f"rows of label {label!r} declare two different rewards ({found[label]} and {text}): sources that share "
                "a label must share a reward; give one of them its own `label:` in the catalog, or pass --reward"
            )
    if missing:
        raise RufusError(
            f"rows of label(s) {', '.join(sorted(missing))} declare no reward: pass --reward SPEC, or add "
            f"`reward:` to their source in the catalog ({docs_page('filter.md')}) and mix it again"
        )
    return {label: json.loads(text) for label, text in sorted(found.items())}


def label_scoped_specs(by_label: dict[str, list[Spec]]) -> list[dict[str, Any]]:
    """One mapping spec per (label, reward), with `only_label` of that label (and the spec's weight)."""
    scoped = []
    for label, specs in by_label.items():
        for spec in specs:
            name, params, weight = parse_spec(spec)
            if params.get("only_label") not in (None, label):
                raise RufusError(
                    f"the reward {spec!r} of label {label!r} sets only_label={params['only_label']!r}: a source's "
                    "reward scores its own rows; drop only_label from it"
                )
            scoped.append({"name": name, **params, "only_label": label, "weight": weight})
    return scoped


def data_reward_specs(rows: list[dict]) -> list[dict[str, Any]]:
    """The label-scoped specs the rows declare (RufusError when they declare none, or not for all)."""
    if not declares_rewards(rows):
        raise RufusError(
            "no reward given and the rows declare none: pass --reward SPEC (e.g. 'string_match:gsm8k'), or add "
            f"`reward:` to the sources of the rl catalog ({docs_page('filter.md')}) and mix it again"
        )
    return label_scoped_specs(specs_by_label((r.get("label") for r in rows), (r.get(REWARD_COLUMN) for r in rows)))


def declares_rewards(rows: list[dict]) -> bool:
    return any(row.get(REWARD_COLUMN) is not None for row in rows)


def scoring_specs(explicit: list[Spec], rows: list[dict]) -> tuple[list[Spec], str]:
    """(the specs that score `rows`, where they come from): --reward when given (it overrides),
    else the rows' own (`data_reward_specs`)."""
    if explicit:
        return list(explicit), "--reward"
    return data_reward_specs(rows), f"data ({REWARD_COLUMN} column: each source's `reward:`)"
