"""The search agent's corpora: a JSONL or parquet file of documents, or a folder of them laid out
as a Wikipedia dump (the hub's wikimedia/wikipedia parquet files, WikiExtractor's JSON lines),
optionally cut into passages; and the default corpus, GSM8K train's worked solutions, indexed
offline from $RUFUS_DATA_ROOT."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rufus_data.base.errors import RufusError
from rufus_train.config_loading import load_stage_config
from rufus_train.grpo.search_index import SearchIndex, build_index, read_corpus
from rufus_train.grpo.stage import search_index_path
from rufus_train.stages import get_stage

ARTICLES = [
    {"id": "12", "url": "https://en.wikipedia.org/wiki?curid=12", "title": "Anarchism",
     "text": "Anarchism is a political philosophy. " + "It is sceptical of authority. " * 30},
    {"id": "25", "url": "https://en.wikipedia.org/wiki?curid=25", "title": "Autism",
     "text": "Autism is a neurodevelopmental condition."},
]


def test_wikipedia_parquet_and_wikiextractor_folders_index_alike(tmp_path):
    hub_dump = tmp_path / "wikipedia" / "20231101.en"
    hub_dump.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ARTICLES), hub_dump / "train-00000-of-00001.parquet")
    extracted = tmp_path / "extracted" / "AA"
    extracted.mkdir(parents=True)
    (extracted / "wiki_00").write_text("".join(json.dumps(a) + "\n" for a in ARTICLES))
    for folder in (tmp_path / "wikipedia", tmp_path / "extracted"):
        docs = list(read_corpus(folder, ["title", "text"]))
        assert [d["id"] for d in docs] == ["12", "25"]
        assert docs[1]["text"] == "Autism\nAutism is a neurodevelopmental condition."  # title, then text
    passages = list(read_corpus(tmp_path / "wikipedia", ["title", "text"], passage_words=100))
    assert [p["id"] for p in passages] == ["12#0", "12#1", "25#0"]  # 1 + 5 + 30 * 5 words: two passages
    assert len(passages[0]["text"].split()) == 100
    index = SearchIndex(build_index(iter(passages), tmp_path / "wiki.duckdb", batch_size=2))  # streamed in batches
    assert index.size() == 3 and index.search("neurodevelopmental condition")[0]["id"] == "25#0"


def test_corpus_errors_name_what_to_change(tmp_path):
    with pytest.raises(RufusError, match="does not exist"):
        list(read_corpus(tmp_path / "nope.jsonl", ["text"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RufusError, match="holds no .jsonl, .parquet or WikiExtractor"):
        list(read_corpus(tmp_path / "empty", ["text"]))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "q", "answer": "a", "id": 7}) + "\n")
    with pytest.raises(RufusError, match=r"no record has any of the text fields \['title', 'text'\]; set search_text_fields"):
        list(read_corpus(rows, ["title", "text"]))
    # unnamed fields: a record without `text` is its string fields but the id (a GSM8K row: question, answer)
    assert list(read_corpus(rows)) == [{"id": "7", "text": "q\na"}]


def test_default_corpus_is_gsm8k_train_solutions_built_offline(tmp_path):
    config = load_stage_config("search_agent", get_stage("search_agent").config_class,
                               overrides={"output_dir": str(tmp_path / "run")})
    assert config.search_corpus.endswith("gsm8k/train.jsonl") and config.search_text_fields is None
    index = SearchIndex(search_index_path(config, tmp_path / "run"))
    assert index.size() == 7473  # every GSM8K train problem with its worked solution
    hit = index.search("Natalia sold clips to 48 of her friends in April")[0]
    assert hit["id"] == "train-0" and "#### 72" in hit["text"]
