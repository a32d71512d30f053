"""`--dry-run` means one thing in every rufus-data command: validate, resolve and print the plan,
load no model (the `no_model_loads` guard) and write nothing (no output folder, lock or work
folder). Each plan is checked against what the run does on the same small data: mix's rows and
shares against a real mix, filter's and pairs' prompts against the mix of their catalog and the
arithmetic of the token budget, decontam's and dedup's reads and settings against the folder, the
benchmarks and a --config file under the options. Decontam's and dedup's old "scan and write
nothing" mode is --report-only (tests/test_decontam_options.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.benchmarks import load_benchmarks
from rufus_data.cli import app
from rufus_data.folders.shards import write_shards
from rufus_data.generate.backend_config import ModelAccess
from rufus_data.mix import mix
from rufus_data.rewards.data_rewards import REWARD_COLUMN, encode_specs

SFT_SOURCES = ("arithmetic", "chats", "coding", "long_reasoning")


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every rich table in `text`, as lists of cell texts."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def by_first(rows: list[list[str]]) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in rows}


def plain(text: str) -> str:
    """Text as one line of words, without the frame of rich's error box."""
    return " ".join(text.replace("│", " ").split())


def wrote_nothing(folder: Path, out_name: str) -> bool:
    """Neither the output nor anything beside it (lock, temporary, partial or work folder)."""
    return not (folder / out_name).exists() and not list(folder.glob(f".{out_name}*"))


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_mix_plan_is_what_the_mix_writes(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "mixed"
    plan = invoke("mix", "catalogs/sft.yaml", "--out", str(out), "--holdout", "4", "--on_bad_row", "skip", "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert wrote_nothing(tmp_path, "mixed") and list(tmp_path.iterdir()) == []
    assert f"dry run: nothing written (drop --dry-run to write {out})" in plain(plan.stdout)
    shown = by_first(table_rows(plan.stdout))
    # --holdout 4 reached the plan; long_reasoning's own `holdout: 0` wins over it, as in the run
    assert [shown[name][1] for name in SFT_SOURCES] == ["4", "4", "4", "0"]
    manifest = mix("catalogs/sft.yaml", out, {"holdout": 4, "on_bad_row": "skip"}).manifest
    for source in manifest["sources"]:
        assert shown[source["name"]] == [
            f"{source['rows_in']:,}", f"{source['rows_holdout']:,}", f"{source['rows_out']:,}",
            f"{source['tokens']['basis']:,}", f"{source['share_requested']:.3f}", f"{source['share_realised']:.4f}",
            f"{source['repeat_factor']:.2f}", "0"], source["name"]
    assert shown["total"][1:4] == [f"{manifest['rows']['holdout']:,}", f"{manifest['rows']['train']:,}",
                                   f"{sum(s['tokens']['basis'] for s in manifest['sources']):,}"]
    assert float(shown["long_reasoning"][6]) > 1  # upsampled: repeated whole, plus a seeded remainder


def test_mix_refuses_a_bad_choice_and_an_existing_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = invoke("mix", "catalogs/sft.yaml", "--on-bad-row", "maybe", "--dry-run")
    assert bad.exit_code == 2 and "'error', 'skip'" in plain(bad.output)
    (tmp_path / "outputs" / "sft").mkdir(parents=True)
    exists = invoke("mix", "catalogs/sft.yaml", "--dry-run")
    assert exists.exit_code == 2 and "already exists: pass --overwrite" in plain(exists.output)


def test_filter_plan_counts_the_catalog_without_mixing_it(tmp_path, monkeypatch, no_model_loads):
    """The headline filter command: the default RL catalog is counted (not mixed to disk), each
    source with its catalog reward, and 16 prompts x 4 samples x 64 tokens on the backend `auto` picks."""
    monkeypatch.chdir(tmp_path)
    res = invoke("filter", "--policy", "smollm2-135m", "--limit", "16", "--k", "4", "--max_tokens", "64", "--dry-run")
    assert res.exit_code == 0, res.output
    assert list(tmp_path.iterdir()) == []  # no outputs/, no .rl-filtered.partial with a mixed input
    said = plain(res.stdout)
    assert "filter plan: 16 prompts (a seeded sample of" in said
    backend, why = ModelAccess().backend_choice()
    assert f"generation: backend {backend} ({why})" in said
    assert "drop --dry-run to write outputs/rl-filtered" in said
    rows = table_rows(res.stdout)
    assert ["policy", "smollm2-135m", "16", "4", "64", "4,096"] in rows
    by_source = {row[1]: row for row in rows if row[0] == "catalogs/rl.yaml"}
    manifest = mix("catalogs/rl.yaml", tmp_path / "rl").manifest
    assert {s["name"]: f"{s['rows_out']:,}" for s in manifest["sources"]} == {
        name: row[3] for name, row in by_source.items()}
    assert "extractor=last_number" in by_source["arithmetic"][4]
    assert "gold_extractor=gsm8k" in by_source["word_problems"][4]


def test_filter_dry_run_refuses_what_the_run_refuses(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = arithmetic_rows(4)
    rows += [{**row, "id": f"x-{i}", "label": "other"} for i, row in enumerate(arithmetic_rows(2))]
    for row in rows[:4]:
        row[REWARD_COLUMN] = encode_specs([NUMBER_REWARD])
    shards = write_rl_shards(tmp_path / "prompts", rows)
    res = invoke("filter", str(shards), "--policy", "smollm2-135m", "--dry-run")
    assert res.exit_code == 2 and "rows of label(s) other declare no reward" in plain(res.output)
    res = invoke("filter", str(shards), "--policy", "smollm2-135m", "--reward", "no_such_reward", "--dry-run")
    assert res.exit_code == 2 and "no_such_reward" in res.output and "Traceback" not in res.output
    res = invoke("filter", str(shards), "--policy", "no-such-org/no-such-model", "--reward", "string_match:last_number",
                 "--dry-run")
    assert res.exit_code == 2 and "model 'no-such-org/no-such-model' cannot be loaded" in plain(res.output)
    res = invoke("filter", str(shards), "--policy", "smollm2-135m", "--reward", "string_match:last_number", "--k", "2",
                 "--max-tokens", "8", "--dry-run")
    assert res.exit_code == 0, res.output
    assert ["policy", "smollm2-135m", "6", "2", "8", "96"] in table_rows(res.stdout)
    assert "rewards (--reward, every row): string_match:last_number" in plain(res.stdout)
    assert wrote_nothing(tmp_path / "outputs", "prompts-filtered")


def test_rebucketing_plan_reads_the_rollouts_and_writes_nothing(tmp_path, no_model_loads):
    earlier = tmp_path / "filtered"
    earlier.mkdir()
    pq.write_table(pa.table({"prompt_id": ["a", "a", "b", "b"], "reward": [1.0, 0.0, 0.0, 0.0]}), earlier / "rollouts.parquet")
    args = ["filter", "--from-rollouts", str(earlier), "--out", str(tmp_path / "again"), "--dry-run"]
    res = invoke(*args, "--keep", "0.1<p<0.9")
    assert res.exit_code == 0, res.output
    assert "re-buckets the 4 scored completions" in plain(res.stdout) and wrote_nothing(tmp_path, "again")
    res = invoke(*args, "--keep", "0.9<p<0.1")
    assert res.exit_code == 2 and "is empty" in plain(res.output)


def test_pairs_plan_per_role(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.chdir(tmp_path)
    rows = arithmetic_rows(6)
    for row in rows:
        row[REWARD_COLUMN] = encode_specs([NUMBER_REWARD])
    shards = write_rl_shards(tmp_path / "prompts", rows)
    out = tmp_path / "pairs"
    res = invoke("pairs", str(shards), "--strong", "smollm2-135m", "--weak", "smollm2-135m", "--limit", "4",
                 "--max_tokens", "32", "--out", str(out), "--dry-run")
    assert res.exit_code == 0, res.output
    shown = by_first(table_rows(res.stdout))
    assert shown["strong"] == shown["weak"] == ["smollm2-135m", "4", "1", "32", "128"]
    assert shown["total"][-1] == "256" and "pairs: strong_vs_weak" in plain(res.stdout)
    assert shown[str(shards)][:3] == ["generated/addition", "arithmetic", "6"]  # per source, before --limit
    assert "extractor=last_number" in shown[str(shards)][3]  # the rows' own reward
    # on-policy: k samples per prompt, scored by the rows' reward (none given: the rows declare one)
    res = invoke("pairs", str(shards), "--policy", "smollm2-135m", "--k", "3", "--max-tokens", "16", "--dry-run")
    assert res.exit_code == 0, res.output
    assert by_first(table_rows(res.stdout))["policy"] == ["smollm2-135m", "6", "3", "16", "288"]
    assert "pairs: on_policy" in plain(res.stdout)
    res = invoke("pairs", str(shards), "--perturb-answer", "--dry-run")
    assert res.exit_code == 0 and "generation: none" in plain(res.stdout)
    res = invoke("pairs", str(shards), "--policy", "smollm2-135m", "--weak", "smollm2-135m", "--dry-run")
    assert res.exit_code == 2 and "not both" in res.output
    assert wrote_nothing(tmp_path, "pairs") and not (tmp_path / "outputs").exists()


def write_mix(folder: Path, train: int = 3, holdout: int = 2) -> Path:
    def rows(n: int, split: str) -> pa.Table:
        return pa.Table.from_pylist([{"id": f"{split}-{i}", "source": "s", "label": "s", "num_tokens": 5,
                                      "messages": [{"role": "user", "content": f"Write a poem number {i}."}]}
                                     for i in range(n)])

    write_shards(rows(train, "train"), folder)
    write_shards(rows(holdout, "holdout"), folder, split="holdout")
    return folder


def test_decontam_plan_reads_the_folder_and_counts_the_benchmarks(tmp_path, monkeypatch, no_model_loads):
    from rufus_data.decontam import run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(run, "decontam", lambda *a, **k: pytest.fail("a dry run scanned"))
    shards = write_mix(tmp_path / "mix")
    config = tmp_path / "decontam.yaml"
    config.write_text("ngram: 13\nsemantic: true\nworkers: 2\ncontainment: 0.6\n")
    out = tmp_path / "clean"
    res = invoke("decontam", str(shards), "--against", "gsm8k", "--against_suite", "quick", "--config", str(config),
                 "--containment", "0.7", "--no-semantic", "--out", str(out), "--dry-run")
    assert res.exit_code == 0, res.output
    assert wrote_nothing(tmp_path, "clean")
    shown = by_first(table_rows(res.stdout))
    assert shown["train"] == ["1", "3"] and shown["holdout"] == ["1", "2"]
    loaded = load_benchmarks(["gsm8k"], suites=["quick"])
    counts = {name: sum(item.benchmark == name for item in loaded.items) for name in loaded.sources}
    assert set(counts) == {"gsm8k", "math500", "ifeval", "humaneval"}
    for name, count in counts.items():
        assert shown[name] == [f"{count:,}", "checked"], name
    # the file under the options: its ngram and workers, the options' containment and --no-semantic
    assert shown["exact"][1].startswith("13-word n-grams") and "containment >= 0.7" in shown["minhash"][1]
    assert shown["semantic"][0] == "no (--semantic)"
    said = plain(res.stdout)
    assert "engine: local, 2 processes" in said and f"drop --dry-run to write {out}" in said


def test_decontam_plan_names_what_cannot_be_loaded(tmp_path, monkeypatch, no_model_loads):
    shards = write_mix(tmp_path / "mix")
    (tmp_path / "items.jsonl").write_text(json.dumps({"id": "q1", "question": "What is the capital of France?"}) + "\n")
    registry = tmp_path / "registry.yaml"
    registry.write_text(json.dumps({"benchmarks": {
        "mine": {"path": str(tmp_path / "items.jsonl"), "id_field": "id", "problem_fields": ["question"]},
        "gone": {"path": str(tmp_path / "nope.jsonl"), "problem_fields": ["question"]}}}))
    args = ["decontam", str(shards), "--against", "mine", "--against", "gone", "--benchmarks", str(registry),
            "--report_only", "--dry-run"]
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert "the run stops" in by_first(table_rows(res.stdout))["gone"][1]
    assert "the run would stop: 1 benchmark(s) cannot be loaded here (gone)" in plain(res.output)
    res = invoke(*args, "--skip_missing")
    assert res.exit_code == 0, res.output
    shown = by_first(table_rows(res.stdout))
    assert shown["mine"] == ["1", "checked"] and shown["gone"] == ["-", "skipped (--skip-missing)"]
    assert "drop --dry-run to print the summary (--report-only)" in plain(res.stdout)
    bad = invoke("decontam", str(shards), "--against", "mine", "--engine", "spark", "--dry-run")
    assert bad.exit_code == 2 and "'local', 'ray'" in plain(bad.output)


def test_dedup_plan(tmp_path, no_model_loads):
    shards = write_mix(tmp_path / "mix", train=4, holdout=1)
    config = tmp_path / "dedup.yaml"
    config.write_text("threshold: 0.95\nsemantic: true\nnumbers_must_match: false\n")
    res = invoke("dedup", str(shards), "--config", str(config), "--no-semantic", "--measure", "jaccard",
                 "--workers", "1", "--out", str(tmp_path / "dd"), "--dry-run")
    assert res.exit_code == 0, res.output
    assert wrote_nothing(tmp_path, "dd")  # no output, lock or .dd.dedup-work
    shown = by_first(table_rows(res.stdout))
    assert shown["train"] == ["1", "4"] and shown["holdout"] == ["1", "1"]
    assert shown["minhash"][1].startswith("jaccard >= 0.95; 3-word shingles")  # numbers_must_match: false kept
    assert shown["semantic"][0] == "no (--semantic)"
    said = plain(res.stdout)
    assert "engine: local, 1 process;" in said and "token shares counted on num_tokens" in said
    bad = invoke("dedup", str(shards), "--measure", "cosine", "--dry-run")
    assert bad.exit_code == 2 and "'containment', 'jaccard'" in plain(bad.output)
    needs_out = invoke("dedup", str(shards), "--dry-run")
    assert needs_out.exit_code == 2 and "needs --out DIR (or --report-only" in plain(needs_out.output)
