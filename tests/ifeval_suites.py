"""Suite files for the eval tests: rufus tasks scored by IFEval's checker over a few local rows,
the cheapest tasks a tiny model can be evaluated on. Written as YAML, as a user writes a suite."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def no_comma_rows(prompts: list[str]) -> list[dict]:
    """One IFEval row per prompt, each asking for an answer without commas."""
    return [{"key": i, "prompt": p, "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
            for i, p in enumerate(prompts)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ifeval_task(name: str, data: Path, role: str = "validation", **fields) -> dict:
    """A rufus task over the rows in `data`, each prompt as it is, scored by IFEval."""
    return {"name": name, "kind": "rufus", "role": role, "data": {"path": str(data)}, "prompt": "{prompt}",
            "gold_fields": ["instruction_id_list", "kwargs"], "scorer": {"name": "ifeval"}, **fields}


def write_suite(path: Path, tasks: list[dict], repeats: int, max_tokens: int) -> Path:
    """A suite named after the file, sampling at temperature 1 (its k samples differ)."""
    suite = {"name": path.stem, "repeats": repeats,
             "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens}, "tasks": tasks}
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path
