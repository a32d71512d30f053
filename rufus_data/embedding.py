"""Text embedders for the semantic decontam stage (and semantic dedup), usable offline.

Default: `wordllama`, the 256-dimension static model (`l2_supercat`) that ships inside the
wordllama wheel, so it works after a plain `pip install` with no hub access. A static model is a
table of token vectors; a text's vector is the mean of its tokens' vectors. Two things make it
fast here:
- texts go through Rufus's normalisation (rufus_data/textnorm.py: NFKC, lowercase, no sentence
  punctuation) and are split into words by Arrow kernels, as in the exact and MinHash stages;
- each distinct word is tokenised once by the model's tokenizer and its token-vector sum and
  token count are cached, so a text's vector is a sparse (texts x words) count matrix times the
  word sums, divided by the token counts. On the normalised text this is wordllama's own
  `embed` up to the rare BPE merge across a space (cosine >= 0.9998 on GSM8K questions and
  worked answers; tests/test_embedding.py checks it).

Any sentence-transformers model can be named instead (a hub id in the local cache, or a
folder); sentence-transformers is imported only then (an optional, heavy library)."""

from __future__ import annotations

import logging
import shutil
from importlib import metadata
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
from scipy import sparse

from rufus_data.errors import RufusError
from rufus_data.paths import cache_dir
from rufus_data.textnorm import TokenHasher, tokenize_array

DEFAULT_MODEL = "wordllama"
WORDLLAMA_CONFIG = "l2_supercat"
WORDLLAMA_DIM = 256
# wordllama releases whose wheel layout this loader was checked against (see _wordllama_files)
WORDLLAMA_CHECKED = ("0.4.0.post1",)


class Embedder(Protocol):
    """Unit-length float32 vectors, one row per text."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def _import_wordllama():
    """wordllama, imported only when a semantic stage runs: importing it calls
    `logging.basicConfig(level=INFO)`, which would make every library's INFO lines print in
    every Rufus command; the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    except ImportError:
        raise RufusError("the semantic stage's default embedder needs wordllama: pip install 'wordllama>=0.4' "
                         "(or pass --semantic-model with a sentence-transformers model)") from None
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return wordllama


def _wordllama_files() -> tuple[Path, Path]:
    """The weights and tokenizer files inside the installed wordllama wheel, checked by path,
    not by version: wordllama 0.4's loader looks for the tokenizer in `wordllama/tokenizer/`
    while the wheel ships it in `wordllama/tokenizers/`; a later release that moves either
    file is reported here rather than sent to the hub."""
    package = Path(_import_wordllama().__file__).parent
    weights = package / "weights" / f"{WORDLLAMA_CONFIG}_{WORDLLAMA_DIM}.safetensors"
    tokenizer = package / "tokenizers" / f"{WORDLLAMA_CONFIG}_tokenizer_config.json"
    for path in (weights, tokenizer):
        if not path.exists():
            version = metadata.version("wordllama")
            raise RufusError(
                f"wordllama {version} has no {path.relative_to(package.parent)} (checked with "
                f"{', '.join(WORDLLAMA_CHECKED)}): install wordllama=={WORDLLAMA_CHECKED[-1]} or pass "
                f"--semantic-model with a sentence-transformers model")
    return weights, tokenizer


def _wordllama_cache(tokenizer: Path) -> Path:
    """A cache folder laid out as wordllama's loader expects (`<dir>/tokenizers/<file>`), so that
    `WordLlama.load(cache_dir=..., disable_download=True)` finds the wheel's tokenizer offline."""
    folder = cache_dir() / "wordllama" / metadata.version("wordllama")
    target = folder / "tokenizers" / tokenizer.name
    if not target.exists() or target.stat().st_size != tokenizer.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(tokenizer, tmp)
        tmp.replace(target)
    return folder


class WordLlamaEmbedder:
    """wordllama's static model over Rufus-normalised words, with a per-word cache."""

    name = DEFAULT_MODEL

    def __init__(self, max_cached_words: int = 200_000):
        _, tokenizer_file = _wordllama_files()
        model = _import_wordllama().WordLlama.load(WORDLLAMA_CONFIG, cache_dir=_wordllama_cache(tokenizer_file),
                                                   dim=WORDLLAMA_DIM, disable_download=True)
        self.tokenizer = model.tokenizer
        self.tokenizer.no_padding()
        self.table = np.ascontiguousarray(model.embedding, dtype=np.float32)
        self.dim = self.table.shape[1]
        self.version = metadata.version("wordllama")
        self.max_cached_words = max_cached_words
        self._hasher = TokenHasher()
        self._keys = np.empty(0, np.uint64)  # sorted word hashes
        self._sums = np.empty((0, self.dim), np.float32)  # token-vector sum of each cached word
        self._counts = np.empty(0, np.float32)  # its token count

    def _word_vectors(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token-vector sum and token count of each word (a sparse words x vocabulary product:
        no (tokens x dim) array is ever gathered)."""
        encoded = self.tokenizer.encode_batch(words, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encoded), np.int64, len(encoded))
        ids = np.fromiter((i for e in encoded for i in e.ids), np.int64, int(lengths.sum()))
        np.clip(ids, 0, len(self.table) - 1, out=ids)
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        tokens = sparse.csr_matrix((np.ones(len(ids), np.float32), ids, indptr), shape=(len(words), len(self.table)))
        return np.asarray(tokens @ self.table, dtype=np.float32), lengths.astype(np.float32)

    def _lookup(self, flat: pa.Array, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sums, counts) of the batch's distinct words and each word's index into them."""
        distinct, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        where = np.searchsorted(self._keys, distinct)
        known = where < len(self._keys)
        known[known] = self._keys[where[known]] == distinct[known]
        sums = np.empty((len(distinct), self.dim), np.float32)
        counts = np.empty(len(distinct), np.float32)
        sums[known], counts[known] = self._sums[where[known]], self._counts[where[known]]
        new = np.flatnonzero(~known)
        if len(new):
            new_sums, new_counts = self._word_vectors(flat.take(pa.array(first[new])).to_pylist())
            sums[new], counts[new] = new_sums, new_counts
            room = self.max_cached_words - len(self._keys)
            if room > 0:  # beyond the cap, rare words are computed per batch (a Zipf tail)
                add = new[:room]
                keys = np.concatenate((self._keys, distinct[add]))
                order = np.argsort(keys, kind="stable")
                self._keys = keys[order]
                self._sums = np.concatenate((self._sums, sums[add]))[order]
                self._counts = np.concatenate((self._counts, counts[add]))[order]
        return sums, counts, inverse.ravel()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), np.float32)
        flat, offsets = tokenize_array(pa.array(texts, pa.large_string()))
        return self.embed_spans(flat, self._hasher(flat), offsets[:-1], offsets[1:])

    def embed_spans(self, words: pa.Array, hashes: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """Vectors of the word spans `[start[i], stop[i])` of a flat array of normalised words and
        their `TokenHasher` hashes (spans may overlap: windows of one field)."""
        lengths = np.maximum(np.asarray(stop) - np.asarray(start), 0)
        if not lengths.sum():
            return np.zeros((len(lengths), self.dim), np.float32)
        used = np.zeros(len(hashes), bool)
        owner = np.repeat(np.arange(len(lengths)), lengths)
        position = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(start, lengths)
        used[position] = True
        kept = np.flatnonzero(used)
        sums, counts, word = self._lookup(words.take(pa.array(kept)), hashes[kept])
        column = np.empty(len(hashes), np.int64)
        column[kept] = word
        bag = sparse.csr_matrix((np.ones(len(owner), np.float32), (owner, column[position])),
                                shape=(len(lengths), len(sums)))
        vectors = bag @ sums
        vectors /= np.maximum(bag @ counts, 1.0)[:, None]
        return _unit(vectors)


class SentenceTransformerEmbedder:
    """Any sentence-transformers model by hub id (from the local cache) or folder."""

    def __init__(self, name: str, batch_size: int = 64):
        try:
            from sentence_transformers import SentenceTransformer  # optional and heavy (torch)
        except ImportError:
            raise RufusError(f"--semantic-model {name} needs sentence-transformers: pip install sentence-transformers "
                             f"(or use the default, {DEFAULT_MODEL}, which ships in its wheel)") from None
        try:
            self.model = SentenceTransformer(name, device="cpu")
        except Exception as err:  # noqa: BLE001 -- not found, offline, bad folder: all mean the same to the user
            raise RufusError(f"sentence-transformers could not load `{name}` ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''}); pass a folder that holds the model, "
                             f"or a hub id already in the local cache (HF_HUB_OFFLINE=1 never downloads)") from None
        self.name = name
        self.dim = int(self.model.get_sentence_embedding_dimension())
        self.batch_size = batch_size
        self.version = metadata.version("sentence-transformers")

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), np.float32)
        vectors = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
        return _unit(np.asarray(vectors, dtype=np.float32))


_EMBEDDERS: dict[str, Embedder] = {}


def load_embedder(name: str = DEFAULT_MODEL) -> Embedder:
    """The embedder called `name` (one per process: the word cache is worth keeping)."""
    if name not in _EMBEDDERS:
        _EMBEDDERS[name] = WordLlamaEmbedder() if name == DEFAULT_MODEL else SentenceTransformerEmbedder(name)
    return _EMBEDDERS[name]
