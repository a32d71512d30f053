"""Issue 47 item 8: `--max_steps 0` is refused, an assistant turn whose content is null never
trains as an empty reply (mix refuses or counts it; a stage drops it and says how many), and list
content is read with a newline between its text parts."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.cli import app as data_app
from rufus_data.folders.shards import content_text
from rufus_train.cli import app as train_app
from rufus_train.stage_base import conversational
from rufus_train.stages import get_stage

NULL_REPLY = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}
PARTS = [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_max_steps_zero_is_refused(tmp_path, data_root):
    import example_shards

    sft = example_shards.gsm8k_sft(data_root, tmp_path / "sft", limit=4)
    for steps in ("0", "-2"):
        res = CliRunner().invoke(train_app, ["stage", "sft", "--data", str(sft), "--model", "tiny-random",
                                             "--output_dir", str(tmp_path / "run"), "--max_steps", steps, "--dry-run"])
        assert res.exit_code == 2 and f"max_steps {steps} trains nothing" in flat(res.output), res.output
        assert "Traceback" not in res.output and not (tmp_path / "run").exists()


def test_list_content_is_joined_as_the_chat_layer_joins_text_parts():
    assert content_text(PARTS) == "First part.\nSecond part."
    assert content_text([{"type": "image_url", "image_url": {"url": "x"}}, *PARTS]) == "First part.\nSecond part."
    assert content_text("plain") == "plain" and content_text(None) is None


def test_an_rl_prompt_with_list_content_reaches_the_generator_as_text():
    """filter and pairs read RL prompts through the same rule, never a Python repr of the parts."""
    from rufus_data.rollouts.prompts import normalise_prompt

    assert normalise_prompt([{"role": "user", "content": PARTS}], "row 1") == [
        {"role": "user", "content": "First part.\nSecond part."}]


def mix(tmp_path, rows, *extra):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    catalog = tmp_path / "c.yaml"
    catalog.write_text(f"kind: sft\nname: c\nsources:\n  - name: s\n    path: {src}\n    share: 1.0\n")
    return CliRunner().invoke(data_app, ["mix", str(catalog), "--out", str(tmp_path / "out"), *extra])


def test_mix_refuses_or_counts_a_null_reply_and_joins_list_content(tmp_path):
    good = [{"messages": [{"role": "user", "content": PARTS}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(6)]
    res = mix(tmp_path, [*good, NULL_REPLY])
    assert res.exit_code == 2 and "assistant turn 2 has no text (content null)" in flat(res.output), res.output
    res = mix(tmp_path, [*good, NULL_REPLY], "--on-bad-row", "skip")
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["sources"][0]["rows_dropped"]["bad_row"] == 1
    rows = pa.concat_tables(pa.parquet.read_table(p) for p in sorted((tmp_path / "out" / "data").glob("*.parquet")))
    assert {turn["content"] for row in rows.column("messages").to_pylist() for turn in row if turn["role"] == "user"} \
        == {"First part.\nSecond part."}


def test_a_stage_drops_null_replies_with_a_count_and_never_trains_them(tiny_model, capsys):
    from transformers import AutoTokenizer

    stage = get_stage("sft")
    config = stage.config_class(stage="sft", data=["x"], max_length=64)
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}]
    rows = pa.Table.from_pylist([{"messages": conversation}, NULL_REPLY, {"messages": conversation}])
    dataset = stage.build_dataset(config, rows, AutoTokenizer.from_pretrained(tiny_model))
    assert len(dataset) == 2 and all(row["messages"][1]["content"] == "yes" for row in dataset)
    parts = pa.Table.from_pylist([{"messages": [{"role": "user", "content": PARTS},
                                                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]}])
    assert [turn["content"] for turn in conversational(parts, "messages")[0]] == ["First part.\nSecond part.", "ok"]
    assert "1 of 3 examples dropped before training: an assistant turn in messages has no content" in \
        flat(capsys.readouterr().err)
    with pytest.raises(RufusError, match="no example is left to train on"):
        stage.build_dataset(config, pa.Table.from_pylist([NULL_REPLY]), AutoTokenizer.from_pretrained(tiny_model))
    preference = get_stage("dpo")
    pairs = pa.Table.from_pylist([
        {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
         "rejected": [{"role": "assistant", "content": None}]},
        {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
         "rejected": [{"role": "assistant", "content": "b"}]}])
    assert len(preference.build_dataset(preference.config_class(stage="dpo", data=["x"]), pairs, None)) == 1
