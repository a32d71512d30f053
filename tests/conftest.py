"""Shared fixtures: the data root (a missing one fails, never skips) and the built-in model,
converted once per test session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """`slow` tests are opt-in: RUFUS_SLOW=1 (see README)."""
    if os.environ.get("RUFUS_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow end-to-end run: set RUFUS_SLOW=1 to include it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_root() -> Path:
    value = os.environ.get("RUFUS_DATA_ROOT")
    assert value, "RUFUS_DATA_ROOT must point at the shared data folder (make test sets it)"
    path = Path(value)
    assert (path / "gsm8k" / "train.jsonl").exists(), f"RUFUS_DATA_ROOT={value} does not hold gsm8k/train.jsonl"
    return path


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    rows = []
    with open(path) as fh:
        for line in fh:
            rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    return rows


@pytest.fixture(scope="session")
def builtin_model() -> str:
    """Folder of the converted built-in SmolLM2-135M (converted once, cached in $RUFUS_CACHE)."""
    from rufus_data.models import pull

    return str(pull("smollm2-135m"))


@pytest.fixture(scope="session")
def builtin_tokenizer(builtin_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model)
