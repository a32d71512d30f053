"""`rufus-data mix` on real data: token shares recounted independently, determinism, ids,
upsampling, holdout, and the canonical-row rules of each catalog kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import read_jsonl

from rufus_data.folders.shards import KIND_COLUMNS, ORIGIN_COLUMN, ROW_COLUMNS, read_shards, shard_files
from rufus_data.mix import mix


def write_catalog(folder: Path, body: dict) -> Path:
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def real_catalog(data_root: Path, **overrides) -> dict:
    body = {
        "kind": "sft",
        "name": "real",
        "tokenizer": "smollm2-135m",
        "seed": 7,
        "basis": "total",
        "sources": [
            {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "format": "question_answer", "share": 0.5,
             "rows": [0, 2999]},  # 3,000 of 7,473: every rule meets them, and each mix here takes a third less
            {"name": "code_alpaca", "path": str(data_root / "code_alpaca_2k/code_alpaca_2k.jsonl"), "share": 0.3},
            {
                "name": "mbpp",
                "path": str(data_root / "mbpp_sanitized/sanitized-mbpp.jsonl"),
                "format": "prompt_completion",
                "fields": {"completion": "code"},
                "share": 0.2,
            },
        ],
    }
    body.update(overrides)
    return body


@pytest.fixture(scope="module")
def real_mix(tmp_path_factory, data_root):
    folder = tmp_path_factory.mktemp("realmix")
    catalog = write_catalog(folder, real_catalog(data_root))
    result = mix(catalog, folder / "out", {"on_bad_row": "skip"})
    return catalog, result


def test_realised_token_shares_recounted_independently(real_mix, tiny_tokenizer):
    _, result = real_mix
    table = read_shards(result.out).to_pylist()
    tokens: dict[str, int] = {}
    for row in table:
        # Recount with the tokenizer and its chat template directly, not through Rufus's counter.
        ids = tiny_tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)["input_ids"]
        assert len(ids) == row["num_tokens"]
        tokens[row["source"]] = tokens.get(row["source"], 0) + len(ids)
    total = sum(tokens.values())
    for source, share in {"gsm8k": 0.5, "code_alpaca": 0.3, "mbpp": 0.2}.items():
        assert abs(tokens[source] / total - share) < 0.01, (source, tokens[source] / total)
    recorded = {s["name"]: s["share_realised"] for s in result.manifest["sources"]}
    for source, count in tokens.items():
        assert recorded[source] == pytest.approx(count / total, abs=1e-5)


def test_ids_unique_and_stable(real_mix):
    _, result = real_mix
    ids = read_shards(result.out).column("id").to_pylist()
    assert len(ids) == len(set(ids))
    assert all(i.split("-")[0] in {"gsm8k", "code_alpaca", "mbpp"} for i in ids)


def test_same_catalog_and_seed_give_byte_identical_shards(real_mix, tmp_path):
    catalog, result = real_mix
    again = mix(catalog, tmp_path / "again", {"on_bad_row": "skip"})
    first = [p.read_bytes() for p in shard_files(result.out)]
    second = [p.read_bytes() for p in shard_files(again.out)]
    assert first == second


def test_small_shards_hold_the_same_shuffled_rows(real_mix, tmp_path):
    """Pass 3 routes rows to one bucket per output shard: many small shards, read in order, are
    the same rows in the same order as one big shard."""
    catalog, result = real_mix
    body = yaml.safe_load(Path(catalog).read_text())
    small = write_catalog(tmp_path, {**body, "shard_rows": 97})
    again = mix(small, tmp_path / "small", {"on_bad_row": "skip"})
    files = shard_files(again.out)
    assert len(files) == -(-result.manifest["rows"]["train"] // 97) and all(pq.read_metadata(f).num_rows <= 97 for f in files)
    assert read_shards(again.out).to_pylist() == read_shards(result.out).to_pylist()


def test_other_seed_changes_selection(real_mix, tmp_path, data_root):
    _, result = real_mix
    other = mix(write_catalog(tmp_path, real_catalog(data_root, seed=8)), tmp_path / "o", {"on_bad_row": "skip"})
    assert set(read_shards(other.out).column("id").to_pylist()) != set(read_shards(result.out).column("id").to_pylist())


def test_manifest_and_report(real_mix):
    _, result = real_mix
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["catalog"]["sha256"]
    gsm = next(s for s in manifest["sources"] if s["name"] == "gsm8k")
    assert gsm["fingerprint"]["sha256"] == "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"
    assert gsm["rows_in"] == 3000  # the catalog's slice, rows [0, 2999] of the file's 7,473
    assert {"transformers", "tokenizers"} <= set(manifest["versions"])
    report = (result.out / "report.md").read_text()
    assert "| gsm8k |" in report and "shares.png" in report
    assert (result.out / "shares.png").stat().st_size > 1000
    # the shards load with the datasets library
    import datasets

    ds = datasets.load_dataset("parquet", data_files=[str(p) for p in shard_files(result.out)], split="train")
    assert ds.num_rows == manifest["rows"]["train"]
    assert set(ds.column_names) >= {"id", "source", "label", "messages", "num_tokens", "num_trainable_tokens"}


def test_mbpp_passthrough_columns_and_union(real_mix):
    _, result = real_mix
    table = read_shards(result.out)
    rows = table.to_pylist()
    mbpp = next(r for r in rows if r["source"] == "mbpp")
    gsm = next(r for r in rows if r["source"] == "gsm8k")
    assert len(mbpp["test_list"]) >= 1 and all(t.startswith("assert") for t in mbpp["test_list"])
    assert gsm["test_list"] is None  # union of columns, missing ones null
    assert mbpp["messages"][-1]["role"] == "assistant" and "def " in mbpp["messages"][-1]["content"]


def test_small_source_with_long_answers_gets_its_token_share(tmp_path, data_root):
    """The SmolLM3 lesson: under 1% of the rows, but its share of the tokens."""
    long_rows = tmp_path / "long.jsonl"
    with open(long_rows, "w") as fh:
        fh.writelines(
            json.dumps({"question": f"Explain step {i}.", "answer": " ".join(["Reasoning step."] * 2000)}) + "\n"
            for i in range(12)
        )
    catalog = write_catalog(tmp_path, {
        "kind": "sft", "name": "lesson", "seed": 1,
        "sources": [
            {"name": "short", "path": str(data_root / "gsm8k/train.jsonl"), "format": "question_answer", "share": 0.8},
            {"name": "long", "path": str(long_rows), "format": "question_answer", "share": 0.2},
        ],
    })
    result = mix(catalog, tmp_path / "out")
    rows = read_shards(result.out).to_pylist()
    long_share_rows = sum(r["source"] == "long" for r in rows) / len(rows)
    assert long_share_rows < 0.01
    shares = {s["name"]: s["share_realised"] for s in result.manifest["sources"]}
    assert abs(shares["long"] - 0.2) < 0.01


def test_upsampling_repeats_and_unique_ids(tmp_path):
    small = tmp_path / "small.jsonl"
    big = tmp_path / "big.jsonl"
    small.write_text("".join(json.dumps({"instruction": f"Say {i}.", "output": f"{i} " * 30}) + "\n" for i in range(5)))
    big.write_text("".join(json.dumps({"instruction": f"Echo {i}.", "output": f"echo {i}"}) + "\n" for i in range(400)))
    body = {"kind": "sft", "name": "up", "sources": [
        {"name": "big", "path": str(big), "share": 0.5},
        {"name": "small", "path": str(small), "share": 0.5},
    ]}
    catalog = write_catalog(tmp_path, {**body, "sources": [body["sources"][0], {**body["sources"][1], "upsample": True}]})
    result = mix(catalog, tmp_path / "out")
    small_info = next(s for s in result.manifest["sources"] if s["name"] == "small")
    assert small_info["repeat_factor"] > 2
    rows = read_shards(result.out).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    repeats = [r for r in rows if "#rep" in r["id"]]
    assert repeats and all(r["origin_id"] == r["id"].split("#")[0] for r in repeats)
    # without upsample the same budget is refused with the shortfall
    refused = write_catalog(tmp_path, {**body, "budget": int(result.manifest["budget"]["used"])})
    from rufus_data.base.errors import RufusError

    with pytest.raises(RufusError, match=r"source 'small' has .* short by .*upsample: true"):
        mix(refused, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_holdout_rows_never_in_the_mix(tmp_path, data_root):
    catalog = write_catalog(tmp_path, {
        "kind": "sft", "name": "ho", "sources": [
            {"name": "alpaca", "path": str(data_root / "code_alpaca_2k/code_alpaca_2k.jsonl"), "share": 1.0},
        ],
    })
    result = mix(catalog, tmp_path / "out", {"holdout": 25, "on_bad_row": "skip"})
    train = set(read_shards(result.out).column("id").to_pylist())
    held = set(read_shards(result.out, split="holdout").column("id").to_pylist())
    assert len(held) == 25 and not train & held
    assert len(train) + len(held) == 2017 - 2  # two Code Alpaca rows have an empty output


def test_rl_catalog_rules(tmp_path, data_root):
    """messages -> prompt before the last assistant turn + expected_output; prompt_only drops the
    reference; a row without an assistant turn gets expected_output null; solution passes through."""
    convs = tmp_path / "convs.jsonl"
    convs.write_text(
        json.dumps({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                                 {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}],
                    "solution": "6"}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "no answer here"}], "solution": "x"}) + "\n"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}) + "\n")
    # an rl shard mixed again: rows that already hold prompt + expected_output keep their answer
    reshard = tmp_path / "reshard.jsonl"
    reshard.write_text(json.dumps({"prompt": [{"role": "user", "content": "5+5?"}], "expected_output": "10"}) + "\n"
                       + json.dumps({"prompt": "7+1?", "expected_output": None}) + "\n")
    catalog = write_catalog(tmp_path, {
        "kind": "rl", "name": "rl", "sources": [
            {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "format": "question_answer",
             "fields": {"answer": "answer"}, "share": 0.5},
            {"name": "math", "path": str(data_root / "math500/test.jsonl"), "share": 0.4},
            {"name": "convs", "path": str(convs), "format": "messages", "share": 0.04, "upsample": True},
            {"name": "prompts", "path": str(prompts), "format": "prompt_only", "fields": {"prompt": "messages"},
             "share": 0.03, "upsample": True},
            {"name": "reshard", "path": str(reshard), "share": 0.03, "upsample": True},
        ],
        "budget": 4000,
    })
    result = mix(catalog, tmp_path / "out")
    rows = {r["id"]: r for r in read_shards(result.out).to_pylist()}
    conv = rows["convs-0"]
    assert [m["content"] for m in conv["prompt"]] == ["2+2?", "4", "and 3+3?"]
    assert conv["expected_output"] == "6" and conv["solution"] == "6"
    assert rows["convs-1"]["expected_output"] is None and rows["convs-1"]["solution"] == "x"
    assert rows["prompts-0"]["prompt"] == [{"role": "user", "content": "1+1?"}]
    assert rows["prompts-0"]["expected_output"] is None
    gsm = next(r for r in rows.values() if r["source"] == "gsm8k")
    assert gsm["expected_output"].split("####")[-1].strip().replace(",", "").lstrip("-").isdigit()
    assert gsm["label"] == str(data_root / "gsm8k/train.jsonl")
    assert gsm["answer"] == gsm["expected_output"]  # the gold column stays for the rewards
    math = next(r for r in rows.values() if r["source"] == "math")
    assert next(s for s in result.manifest["sources"] if s["name"] == "math")["format"] == "question_answer"
    assert math["expected_output"] == math["answer"] and "\\boxed" in math["solution"]  # solution untouched
    assert rows["reshard-0"]["prompt"] == [{"role": "user", "content": "5+5?"}]
    assert rows["reshard-0"]["expected_output"] == "10"
    assert rows["reshard-1"]["prompt"] == [{"role": "user", "content": "7+1?"}]
    assert rows["reshard-1"]["expected_output"] is None
    assert "orig_expected_output" not in rows["reshard-0"]


def test_preference_catalog_from_hh_transcripts(tmp_path, data_root):
    catalog = write_catalog(tmp_path, {
        "kind": "preference", "name": "pref", "sources": [
            {"name": "hh", "path": str(data_root / "hh_rlhf_harmless_base/test.jsonl"), "share": 1.0},
        ],
    })
    result = mix(catalog, tmp_path / "out")
    row = read_shards(result.out).to_pylist()[0]
    assert row["prompt"][0]["role"] == "user"
    assert row["chosen"][0]["role"] == "assistant" and row["rejected"][0]["role"] == "assistant"
    assert row["num_trainable_tokens"] > 0  # the chosen reply


def test_system_prompt_and_past_reasoning(tmp_path, tiny_tokenizer):
    src = tmp_path / "think.jsonl"
    src.write_text(json.dumps({"messages": [
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>old</think>\n\na1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>new</think>\n\na2"},
    ]}) + "\n")
    catalog = write_catalog(tmp_path, {"kind": "sft", "name": "t", "sources": [
        {"name": "t", "path": str(src), "share": 1.0, "system": "/think"}]})
    row = read_shards(mix(catalog, tmp_path / "out").out).to_pylist()[0]
    assert row["messages"][0] == {"role": "system", "content": "/think"}
    assert row["messages"][2]["content"] == "a1"
    assert row["messages"][4]["content"].startswith("<think>new</think>")
    kept = write_catalog(tmp_path, {"kind": "sft", "name": "t", "sources": [
        {"name": "t", "path": str(src), "share": 1.0, "strip_past_reasoning": False}]})
    row = read_shards(mix(kept, tmp_path / "kept").out).to_pylist()[0]
    assert row["messages"][1]["content"] == "<think>old</think>\n\na1"  # opted out: earlier reasoning stays


def test_max_tokens_per_example_drops_and_counts(tmp_path, data_root, tiny_tokenizer):
    """Rows longer than the limit (in total tokens, as rendered) are dropped and counted."""
    catalog = write_catalog(tmp_path, {"kind": "sft", "name": "t", "sources": [
        {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "share": 1.0,
         "max_tokens_per_example": 200}]})
    result = mix(catalog, tmp_path / "out")
    source = result.manifest["sources"][0]
    rows = read_shards(result.out).to_pylist()
    assert max(r["num_tokens"] for r in rows) <= 200
    rendered = [tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}], tokenize=False)
        for r in read_jsonl(data_root / "gsm8k/train.jsonl")]  # rendered, then tokenized in one batch
    recount = [len(ids) for ids in tiny_tokenizer(rendered, add_special_tokens=False)["input_ids"]]
    assert source["rows_dropped"]["too_long"] == sum(n > 200 for n in recount) > 0
    assert source["rows_out"] == sum(n <= 200 for n in recount)


def test_trainable_tokens_equal_trl_assistant_masks(tmp_path, tiny_model, real_mix):
    """mix's trainable count equals TRL's `assistant_masks` for the same rows."""
    import datasets
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    _, result = real_mix
    rows = read_shards(result.out).slice(0, 40).to_pylist()
    dataset = datasets.Dataset.from_list([{"messages": r["messages"]} for r in rows])
    args = SFTConfig(output_dir=str(tmp_path / "trl"), assistant_only_loss=True, max_length=None,
                     report_to=[], use_cpu=True, dataset_num_proc=None)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), args=args, train_dataset=dataset)
    # TRL folds its `assistant_masks` into the labels: tokens outside them are -100.
    labels = trainer.train_dataset["labels"]
    assert [sum(t != -100 for t in lab) for lab in labels] == [r["num_trainable_tokens"] for r in rows]
    assert all(r["num_trainable_tokens"] > 0 for r in rows)


def test_sample_catalogs_run(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    for name in ("sft", "rl", "preference"):
        result = mix(repo / "catalogs" / f"{name}.yaml", tmp_path / name)
        assert result.manifest["rows"]["train"] > 100
        assert not result.manifest["notes"], result.manifest["notes"]
        assert pq.read_metadata(shard_files(result.out)[0]).num_rows > 0


@pytest.mark.spawn
def test_the_headline_command_mixes_the_sft_catalog_from_a_fresh_folder(tmp_path, data_root):
    """`rufus-data mix catalogs/sft.yaml` as the README writes it, from a folder that is not the
    repository: the shipped catalog is found, outputs/sft is written, the table goes to stdout."""
    cli = Path(sys.executable).with_name("rufus-data")
    env = {**os.environ, "RUFUS_DATA_ROOT": str(data_root)}
    run = subprocess.run([str(cli), "mix", "catalogs/sft.yaml"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((tmp_path / "outputs" / "sft" / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"].endswith("catalogs/sft.yaml") and manifest["rows"]["train"] > 100
    for source in manifest["sources"]:
        assert abs(source["share_error_pp"]) <= 1.0, source
        assert source["name"] in run.stdout
    assert "wrote outputs/sft" in run.stderr and "wrote" not in run.stdout


def test_smollm3_recipe_catalog_validates():
    from rufus_data.sources.catalog import load_catalog

    repo = Path(__file__).resolve().parents[1]
    catalog = load_catalog(repo / "catalogs/recipes/smollm3_sft.yaml")
    assert {s.system for s in catalog.sources} == {"/think", "/no_think"}
    assert all(s.hub for s in catalog.sources)


def _counted(catalog, sizes: dict[str, list[int]]):
    from rufus_data.mix import SourceCounts

    return [SourceCounts(spec=s, total=list(sizes[s.name]), trainable=list(sizes[s.name])) for s in catalog.sources]


def test_derived_budget_never_leaves_the_limiting_source_short():
    """Without `budget:`, the source that sets the budget gets exactly its tokens: share x
    (have / share) can land one float step above `have`, which once raised 'short by 0 tokens'."""
    from rufus_data.mix import select_rows
    from rufus_data.sources.catalog import MixtureCatalog

    hits = 0
    for have in range(100, 400, 3):
        catalog = MixtureCatalog(kind="sft", name="t", sources=[
            {"name": "a", "path": "a.jsonl", "share": 0.6}, {"name": "b", "path": "b.jsonl", "share": 0.4}])
        hits += have / 0.6 * 0.6 > have
        selections = select_rows(catalog, _counted(catalog, {"a": [have], "b": [10] * 1000}), None)
        assert selections[0].tokens == have and selections[0].repeat_factor == 1.0
    assert hits > 10  # the rounding case is really exercised


def test_holdout_precedence():
    """A source's own `holdout:` wins; `--holdout` replaces the catalog-level default."""
    from rufus_data.mix import select_rows
    from rufus_data.sources.catalog import MixtureCatalog

    catalog = MixtureCatalog(kind="sft", name="t", holdout=2, sources=[
        {"name": "a", "path": "a.jsonl", "share": 0.5, "holdout": 0},
        {"name": "b", "path": "b.jsonl", "share": 0.5}])
    sizes = {"a": [10] * 20, "b": [10] * 20}
    assert [len(s.holdout) for s in select_rows(catalog, _counted(catalog, sizes), None)] == [0, 2]
    assert [len(s.holdout) for s in select_rows(catalog, _counted(catalog, sizes), 5)] == [0, 5]


def test_template_without_generation_markers_counts_by_prefixes(tmp_path, data_root, tiny_model, capsys):
    """A `chat_template:` file without {% generation %} blocks that TRL does not know (SmolLM2's own
    ChatML): it renders prefixes as prefixes, so `basis: trainable` counts each reply from where
    the prompt's rendering (with the generation prompt) ends; the route is said and recorded."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copy(Path(tiny_model) / "original_chat_template.jinja", tmp_path / "plain.jinja")
    body = {"kind": "sft", "name": "plain", "chat_template": "plain.jinja", "basis": "trainable", "sources": [
        {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "share": 1.0}], "budget": 3000}
    result = mix(write_catalog(tmp_path, body), tmp_path / "out")
    assert "rendering each conversation's prefixes" in " ".join(capsys.readouterr().err.split())
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["loss_mask"]["route"] == "prefixes" and manifest["loss_mask"]["chat_template"].startswith("custom")
    text = (tmp_path / "plain.jinja").read_text()
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for row in read_shards(result.out).to_pylist()[:5]:  # counted with the override, not the built-in Rufus template
        whole = tok.apply_chat_template(row["messages"], chat_template=text, tokenize=True)["input_ids"]
        prompt = tok.apply_chat_template(row["messages"][:-1], chat_template=text, tokenize=True,
                                         add_generation_prompt=True)["input_ids"]
        assert whole[: len(prompt)] == prompt  # one reply at the end: its tokens are the rest
        assert row["num_tokens"] == len(whole) and row["num_trainable_tokens"] == len(whole) - len(prompt)


def test_template_no_route_serves(tmp_path, data_root, capsys):
    """A template with no markers, unknown to TRL (Qwen3's, edited), that rewrites earlier turns (it
    drops the empty <think> block of replies before the last question): no tokens can be told
    trainable, so `basis: trainable` is refused before counting, naming it and what to set, and
    `basis: total` warns and counts total tokens."""
    from rufus_data.base.errors import RufusError
    from rufus_data.models.chat_template import shipped_templates

    (tmp_path / "edited.jinja").write_text(shipped_templates()["qwen3"] + "{#- edited here -#}")
    body = {"kind": "sft", "name": "edited", "chat_template": "edited.jinja", "basis": "trainable", "sources": [
        {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "share": 1.0}], "budget": 3000}
    with pytest.raises(RufusError, match="custom .*does not render prefixes as prefixes.*rufus_chatml.*basis: total"):
        mix(write_catalog(tmp_path, body), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    result = mix(write_catalog(tmp_path, {**body, "basis": "total"}), tmp_path / "out")
    assert "num_trainable_tokens will be 0" in capsys.readouterr().err
    assert {row["num_trainable_tokens"] for row in read_shards(result.out).to_pylist()} == {0}


def test_rl_and_preference_shares_recounted_independently(tmp_path, data_root, tiny_tokenizer):
    """rl shares count prompt tokens (with the generation prompt); preference shares count prompt
    plus chosen. Both recounted here with the chat template directly. Each kind's rows carry
    the columns the shard contract names for it."""
    rl = write_catalog(tmp_path, {"kind": "rl", "name": "rl", "budget": 60000, "sources": [
        {"name": "gsm8k", "path": str(data_root / "gsm8k/train.jsonl"), "share": 0.7},
        {"name": "math", "path": str(data_root / "math500/test.jsonl"), "share": 0.3}]})
    result = mix(rl, tmp_path / "rl")
    assert {*ROW_COLUMNS, *KIND_COLUMNS["rl"], ORIGIN_COLUMN} <= set(read_shards(result.out).column_names)
    tokens: dict[str, int] = {}
    for row in read_shards(result.out).to_pylist():
        n = len(tiny_tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"])
        assert n == row["num_tokens"]
        tokens[row["source"]] = tokens.get(row["source"], 0) + n
    total = sum(tokens.values())
    assert abs(total - 60000) / 60000 < 0.01
    assert abs(tokens["gsm8k"] / total - 0.7) < 0.01 and abs(tokens["math"] / total - 0.3) < 0.01

    pref = write_catalog(tmp_path, {"kind": "preference", "name": "pref", "budget": 40000, "sources": [
        {"name": "hh", "path": str(data_root / "hh_rlhf_harmless_base/test.jsonl"), "share": 1.0}]})
    result = mix(pref, tmp_path / "pref")
    assert {*ROW_COLUMNS, *KIND_COLUMNS["preference"], ORIGIN_COLUMN} <= set(read_shards(result.out).column_names)
    total = 0
    for row in read_shards(result.out).to_pylist():
        n = len(tiny_tokenizer.apply_chat_template(row["prompt"] + row["chosen"], tokenize=True,
                                                      return_dict=True)["input_ids"])
        assert n == row["num_tokens"]
        total += n
    assert abs(total - 40000) / 40000 < 0.01


def test_question_answer_with_reasoning_trace(tmp_path):
    """`fields: {reasoning: ...}` puts the trace in a <think> block before the answer (the s1K map)."""
    src = tmp_path / "s1k.jsonl"
    src.write_text(json.dumps({"question": "What is 2+3?", "deepseek_thinking_trajectory": "2 and 3 make 5.",
                               "deepseek_attempt": "**5**", "solution": "5"}) + "\n")
    fields = {"question": "question", "reasoning": "deepseek_thinking_trajectory", "answer": "deepseek_attempt"}
    catalog = write_catalog(tmp_path, {"kind": "sft", "name": "t", "sources": [
        {"name": "s1k", "path": str(src), "format": "question_answer", "fields": fields, "share": 1.0,
         "system": "/think"}]})
    row = read_shards(mix(catalog, tmp_path / "out").out).to_pylist()[0]
    assert row["messages"][0] == {"role": "system", "content": "/think"}
    assert row["messages"][2]["content"] == "<think>\n2 and 3 make 5.\n</think>\n\n**5**"
    assert row["solution"] == "5"  # unmapped columns pass through
    assert row["num_trainable_tokens"] > 10


def test_tiny_catalog_says_why_a_share_is_off(tmp_path):
    """Whole rows cannot hit a 1-pp share when one row outweighs the target: the manifest says so."""
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_text("".join(json.dumps({"instruction": f"Say {i}.", "output": f"{i}."}) + "\n" for i in range(40)))
    big.write_text(json.dumps({"instruction": "Write a long text.", "output": "word " * 800}) + "\n")
    catalog = write_catalog(tmp_path, {"kind": "sft", "name": "tiny", "budget": 400, "sources": [
        {"name": "small", "path": str(small), "share": 0.5, "upsample": True},
        {"name": "big", "path": str(big), "share": 0.5, "upsample": True}]})
    result = mix(catalog, tmp_path / "out")
    notes = " ".join(result.manifest["notes"])
    assert "source 'big'" in notes and "tiny catalog" in notes and "raise `budget`" in notes
