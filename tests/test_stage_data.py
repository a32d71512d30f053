"""Every stage trains on real data by default: each stage YAML names a catalog under
catalogs/data/ that pins its hub revisions, loads offline from $RUFUS_DATA_ROOT (or from data a
declared builder step makes from it), has the columns the stage reads, and holds no eval set."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks import load_benchmarks, load_registry
from rufus_data.rewards.ifeval import IFEvalReward
from rufus_data.sources.builders import BUILDERS, SEED_CONSTRAINTS, build_rows
from rufus_data.sources.canonical import open_source
from rufus_data.sources.catalog import SourceRows, load_catalog
from rufus_data.sources.dataset_source import load_rows
from rufus_data.sources.inputs import data_input
from rufus_train.data import check_columns
from rufus_train.stages import all_stages

REPO = Path(__file__).resolve().parents[1]
STAGES = REPO / "catalogs" / "stages"
COMMIT = re.compile(r"[0-9a-f]{40}")


def default_catalogs() -> dict[str, list[str]]:
    """stage YAML name -> the data entries it names (a recipe's YAML beside the stages, e.g.
    big_math_no_think.yaml, names its stage with `stage:`)."""
    return {p.stem: yaml.safe_load(p.read_text())["data"] for p in sorted(STAGES.glob("*.yaml"))}


def stage_of(name: str) -> str:
    return yaml.safe_load((STAGES / f"{name}.yaml").read_text()).get("stage", name)


# hub sources no commit could be found for offline: loading them warns (UnpinnedRevision)
UNPINNED = {"big_math_no_think.yaml/big_math"}


def catalog_files() -> list[Path]:
    return sorted({data_input(e).path for entries in default_catalogs().values() for e in entries})


def places(rows: SourceRows):
    """The places one source (or its fallback) loads from, without its builder step."""
    return rows.model_copy(update={"build": None})


def test_every_stage_names_a_default_catalog_with_its_columns():
    stages = all_stages()
    assert {stage_of(name) for name in default_catalogs()} == set(stages)
    for name, entries in default_catalogs().items():
        assert entries and all(e.startswith("catalogs/data/") for e in entries), name
        check_columns(entries, stages[stage_of(name)].required_columns, stage_of(name))


def test_default_catalogs_pin_every_hub_revision():
    for path in catalog_files():
        for source in load_catalog(path).sources:
            for rows in (source, source.fallback):
                if rows is not None and rows.hub is not None and f"{path.name}/{source.name}" not in UNPINNED:
                    assert COMMIT.fullmatch(rows.hub.revision or ""), f"{path.name}/{source.name}: {rows.hub}"
            assert source.hub is not None, f"{path.name}/{source.name}: a default names the public set by hub id"


def test_default_catalogs_load_offline(hub_offline, data_root):
    """Without the hub every source loads: its local copy, or its fallback (said in the provenance)."""
    for path in catalog_files():
        for source in load_catalog(path).sources:
            opened = open_source(source)
            first = next(opened.rows)
            assert first, f"{path.name}/{source.name}"
            if source.local is None:
                assert opened.provenance["fallback"]["used"], f"{path.name}/{source.name}"


def test_default_data_holds_no_eval_set(hub_offline, data_root):
    """By place (no benchmark file, no benchmark hub split, id ranges disjoint) and by content (no
    row text equals an eval problem) for every place each default source may load from."""
    registry, _ = load_registry()
    evals = load_benchmarks(["all"], skip_missing=True)
    eval_files = {s["sha256"]: name for name, s in evals.sources.items() if "sha256" in s}
    problems = {normalise(t) for item in evals.items for t in item.problems if len(t.strip()) > 20}
    checked = 0
    for path in catalog_files():
        for source in load_catalog(path).sources:
            for rows in filter(None, (source, source.fallback)):
                if rows.hub is not None:
                    for name, bench in registry.benchmarks.items():
                        if bench.hub and bench.hub.id.lower() == rows.hub.id.lower() and bench.hub.config == rows.hub.config:
                            shared = set(rows.hub.split.split("+")) & set(bench.hub.split.split("+"))
                            assert not shared, f"{path.name}/{source.name} trains on {name}'s eval split {shared}"
                if rows.local is None and rows.path is None:
                    continue
                loaded = load_rows(places(rows).model_copy(update={"hub": None}), source.name)
                train_rows = list(loaded.rows)
                bench = eval_files.get(loaded.provenance["sha256"])
                if bench is not None:  # the eval file itself: only rows outside its eval ids may be used
                    spec = registry.benchmarks[bench]
                    assert spec.id_range and rows.ids, f"{path.name}/{source.name} reads the eval file of {bench}"
                    eval_ids = {i.item_id for i in evals.items if i.benchmark == bench}
                    assert not eval_ids & {str(r[spec.id_field]) for r in train_rows}, f"{path.name}/{source.name}"
                texts = {normalise(v) for r in train_rows for v in r.values() if isinstance(v, str)}
                assert not texts & problems, f"{path.name}/{source.name} holds eval problems"
                checked += 1
    assert checked >= 8  # gsm8k, mbpp, hh-rlhf, code alpaca, seed tasks (twice), gsm8k fallbacks


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def seed_constraint_rows(data_root: Path) -> list[dict]:
    rows = load_rows(SourceRows(local="alpaca_seed_tasks/seed_tasks.jsonl"), "seed tasks").rows
    return list(build_rows("seed_task_constraints", rows, "seed tasks", Counter()))


def ifeval_score(row: dict, response: str) -> float | None:
    prompt = [{"role": "user", "content": row["prompt"]}]
    return IFEvalReward().score_rows([prompt], [response], [True], [row], None)[0]


def test_seed_task_constraints_are_deterministic_and_verifiable(data_root):
    rows = seed_constraint_rows(data_root)
    assert len(rows) == 175 and rows == seed_constraint_rows(data_root)  # the same on every run
    assert {r["instruction_id_list"][0] for r in rows} <= set(SEED_CONSTRAINTS)
    assert len({r["instruction_id_list"][0] for r in rows}) >= 8  # drawn across the menu
    lower = next(r for r in rows if r["instruction_id_list"] == ["change_case:english_lowercase"])
    assert lower["prompt"].endswith("Your entire response should be in English, and in all lowercase letters. "
                                    "No capital letters are allowed.")
    assert ifeval_score(lower, "here is my answer, all in lowercase.") == 1.0
    assert ifeval_score(lower, "Here Is My Answer.") == 0.0
    words = next(r for r in rows if r["instruction_id_list"] == ["length_constraints:number_words"])
    kwargs = json.loads(words["kwargs"])[0]
    n = kwargs["num_words"]
    short, long = " ".join(["word"] * (n - 1)), " ".join(["word"] * (n + 1))
    expected = (1.0, 0.0) if kwargs["relation"] == "less than" else (0.0, 1.0)
    assert (ifeval_score(words, short), ifeval_score(words, long)) == expected


def rlvr_row(func: str, content: str = "Write about the sea.", **truth) -> dict:
    return {"messages": [{"role": "user", "content": content}], "ground_truth": json.dumps({"func_name": func, **truth}),
            "constraint": "..."}


def test_rlvr_ifeval_rows_become_ifeval_instructions():
    counts: Counter = Counter()
    source = [
        rlvr_row("validate_word_constraint", N=5, quantifier="at most"),
        rlvr_row("validate_lowercase", N=None),
        rlvr_row("validate_word_constraint", N=5, quantifier="around"),
        rlvr_row("verify_keyword_frequency", word="sea", N=2),
        {"messages": [{"role": "user", "content": "x"}], "ground_truth": "not json", "constraint": None},
    ]
    rows = list(build_rows("rlvr_ifeval_constraints", iter(source), "rlvr", counts))
    assert [r["instruction_id_list"] for r in rows] == [["length_constraints:number_words"], ["change_case:english_lowercase"]]
    at_most = rows[0]
    assert json.loads(at_most["kwargs"]) == [{"num_words": 6, "relation": "less than"}]  # at most 5 == fewer than 6
    assert ifeval_score(at_most, "one two three four five") == 1.0
    assert ifeval_score(at_most, "one two three four five six") == 0.0
    assert counts["rows_in"] == 5 and counts["rows_out"] == 2
    assert counts["skipped: relation 'around' has no exact IFEval checker"] == 1
    assert counts["skipped: verifier 'verify_keyword_frequency' has no exact IFEval checker"] == 1
    assert counts["skipped: ground_truth is not a JSON object"] == 1
    assert set(BUILDERS) >= {"perturbed_answer_pairs", "seed_task_constraints", "rlvr_ifeval_constraints"}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_a_builder_names_the_column_it_misses(builder):
    with pytest.raises(RufusError, match=rf"builder {builder} reads the column '\w+', which row 0 lacks"):
        list(build_rows(builder, iter([{"unrelated": 1}]), "source 'x'", Counter()))
