"""The offline embedder of the semantic decontam stage: wordllama's wheel model, loaded without
the hub, and Rufus's fast path over normalised words agreeing with wordllama's own `embed`."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from rufus_data.base.paths import atomic_file, data_root
from rufus_data.similarity.embedding import (
    WORDLLAMA_CONFIG,
    WORDLLAMA_DIM,
    WordLlamaEmbedder,
    _wordllama_files,
    load_embedder,
)
from rufus_data.similarity.ngram_hash import TokenHasher
from rufus_data.similarity.textnorm import tokenize_array, words


@pytest.fixture(scope="module")
def embedder() -> WordLlamaEmbedder:
    return load_embedder()


def gsm8k_texts(n: int = 60) -> list[str]:
    with open(data_root() / "gsm8k" / "test.jsonl") as fh:
        rows = [json.loads(line) for _, line in zip(range(n), fh)]
    return [r["question"] for r in rows] + [r["answer"] for r in rows]


def test_loads_offline_from_the_wheel(monkeypatch, embedder):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights, tokenizer = _wordllama_files()
    assert weights.exists() and tokenizer.parent.name == "tokenizers"
    vectors = embedder.embed(["How many apples does Janet have?", ""])
    assert vectors.shape == (2, 256) and vectors.dtype == np.float32
    assert np.isclose(np.linalg.norm(vectors[0]), 1.0) and not vectors[1].any()


def test_matches_wordllamas_own_embed_on_normalised_text(embedder, tmp_path):
    """The reference is wordllama's own loader and `embed`, given a cache folder where its 0.4
    loader finds the tokenizer the wheel ships (`<cache>/tokenizers/<file>`)."""
    from wordllama import WordLlama

    _, tokenizer = _wordllama_files()
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / "tokenizers" / tokenizer.name).write_bytes(tokenizer.read_bytes())
    model = WordLlama.load(WORDLLAMA_CONFIG, cache_dir=tmp_path, dim=WORDLLAMA_DIM, disable_download=True)
    assert np.array_equal(model.embedding, embedder.table)
    texts = gsm8k_texts()
    reference = np.stack([model.embed(" ".join(words(t)), norm=True)[0] for t in texts])
    cosine = (reference * embedder.embed(texts)).sum(axis=1)
    assert cosine.min() >= 0.9995


def test_spans_are_the_embeddings_of_their_words(embedder):
    text = " ".join(gsm8k_texts(3))
    flat, offsets = tokenize_array(pa.array([text], pa.large_string()))
    start, stop = np.array([0, 10, 25]), np.array([40, 50, int(offsets[-1])])  # overlapping windows
    spans = embedder.embed_spans(flat, TokenHasher()(flat), start, stop)
    all_words = flat.to_pylist()
    joined = embedder.embed([" ".join(all_words[a:b]) for a, b in zip(start, stop)])
    assert np.allclose(spans, joined, atol=1e-5)


@pytest.mark.spawn
def test_loading_the_embedder_leaves_logging_alone():
    """wordllama calls logging.basicConfig(level=INFO) on import; the embedder reads the wheel's
    files without importing it, so a fresh process's logging stays as it was."""
    script = ("import logging, sys; from rufus_data.similarity.embedding import load_embedder; load_embedder().embed(['a b c']); "
              "root = logging.getLogger(); print(len(root.handlers), root.level, 'wordllama' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", str(logging.WARNING), "False"]


def test_a_full_word_cache_gives_the_same_vectors(embedder):
    """Past `max_cached_words`, the remaining words of a batch are computed for that batch only."""
    texts = gsm8k_texts(20)
    small = WordLlamaEmbedder(max_cached_words=50)
    assert np.allclose(small.embed(texts[:5]), embedder.embed(texts[:5]), atol=1e-6)
    assert np.allclose(small.embed(texts), embedder.embed(texts), atol=1e-6)
    assert len(small._keys) == 50


def test_word_cache_lookup_survives_slot_collisions():
    cache = WordLlamaEmbedder(max_cached_words=10, cache_vocabulary=False)
    keys = np.array([5, 5 + (1 << 21), 5 + (1 << 22), 7], np.uint64)  # three share their low 21 bits
    cache._cache(keys, np.eye(4, cache.dim, dtype=np.float32), np.ones(4, np.float32))
    cache._cache(np.array([5 + (1 << 23)], np.uint64), np.zeros((1, cache.dim), np.float32), np.ones(1, np.float32))
    probe = np.array([5 + (1 << 22), 7, 9, 5, 5 + (1 << 23), 5 + (1 << 21)], np.uint64)
    assert cache._find(probe).tolist() == [2, 3, -1, 0, 4, 1]


def test_vocabulary_words_are_cached_at_load(embedder, tmp_path, monkeypatch):
    """Whole-word tokens of the vocabulary are in the cache before any text is embedded (forked
    workers inherit them), with the vectors tokenising them would give; they are worked out once
    and read back from $RUFUS_CACHE by the next process, unchanged."""
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    first = WordLlamaEmbedder()
    stored = list((tmp_path / "wordllama").rglob("*.npz"))
    assert len(stored) == 1 and not list(tmp_path.rglob("*.tmp*"))
    second = WordLlamaEmbedder()
    assert np.array_equal(first._keys, second._keys) and np.array_equal(first._sums, second._sums)
    probe = ["the", "apple", "money", "each", "dollars"]  # whole-word tokens of the vocabulary
    found = second._find(second._hasher(pa.array(probe)))
    assert (found >= 0).all() and len(second._keys) > 5000
    sums, counts = second._word_vectors(probe)
    assert np.allclose(second._sums[found], sums, atol=1e-6) and (second._counts[found] == counts).all()


def test_cache_files_are_written_whole_or_not_at_all(tmp_path):
    """atomic_file (the word and eval-side caches, adapter configs): the new content replaces the
    file only when the write finished; a write that raises leaves the old file and no temporary."""
    path = tmp_path / "cache" / "words.npz"
    with atomic_file(path) as tmp:
        assert tmp.suffix == ".npz" and tmp.parent == path.parent
        np.savez(tmp, a=np.arange(3))
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        np.savez(tmp, a=np.arange(5))
        raise RuntimeError("killed mid-write")
    with np.load(path) as saved:
        assert saved["a"].tolist() == [0, 1, 2]
    assert [p.name for p in path.parent.iterdir()] == ["words.npz"]


def test_word_vectors_equal_tokenising_each_word_alone(embedder):
    """Words are tokenised a chunk at a time; the sums must equal tokenising each word alone."""
    pieces = words(" ".join(gsm8k_texts(40))) + ["<<48/2=24>>24", "½", "٣", "🙂", "中文", "x^2+1", "a b", "y ", "#1d1e27",
                                                  "3rd", "0", "007", "a1b2c3", "٣4", "1 2", "$1,000.50", "2x", "x2"]
    vocab = sorted(set(pieces))
    sums, counts = embedder._word_vectors(vocab)
    for word, total, count in zip(vocab, sums, counts):
        ids = embedder.tokenizer.encode(word, add_special_tokens=False).ids
        assert count == len(ids), word
        assert np.allclose(total, embedder.table[ids].sum(axis=0), atol=1e-5), word
