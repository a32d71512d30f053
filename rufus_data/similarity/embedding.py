"""Text embedders for the semantic decontam stage (and semantic dedup), usable offline.

Default: `wordllama`, the 256-dimension static model (`l2_supercat`) that ships inside the
wordllama wheel, so it works after a plain `pip install` with no hub access. A static model is a
table of token vectors; a text's vector is the mean of its tokens' vectors. Two things make it
fast here:
- texts go through Rufus's normalisation (textnorm.py: NFKC, lowercase, no sentence
  punctuation) and are split into words by Arrow kernels, as in the exact and MinHash stages;
- each distinct word is tokenised once by the model's tokenizer and its token-vector sum and
  token count are cached, so a text's vector is a sparse (texts x words) count matrix times the
  word sums, divided by the token counts. On the normalised text this is wordllama's own
  `embed` up to the rare BPE merge across a space (cosine >= 0.9998 on GSM8K questions and
  worked answers; tests/test_embedding.py checks it).

Any sentence-transformers model can be named instead (a hub id in the local cache, or a
folder); sentence-transformers is imported only then (an optional, heavy library)."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from safetensors import safe_open
from scipy import sparse
from tokenizers import Tokenizer

from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file, cache_dir
from rufus_data.similarity import DEFAULT_EMBEDDER
from rufus_data.similarity.ngram_hash import TokenHasher
from rufus_data.similarity.textnorm import tokenize_array

DEFAULT_MODEL = DEFAULT_EMBEDDER  # wordllama: it ships in its wheel
WORDLLAMA_CONFIG = "l2_supercat"
WORDLLAMA_DIM = 256
# wordllama releases whose wheel layout this loader was checked against (see _wordllama_files)
WORDLLAMA_CHECKED = ("0.4.0.post1",)
SLOT_MASK = np.uint64((1 << 21) - 1)  # the word cache's direct-address table: 2M slots (8 MB)


class Embedder(Protocol):
    """Unit-length float32 vectors, one row per text."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def _wordllama_files() -> tuple[Path, Path]:
    """The weights and tokenizer files inside the installed wordllama wheel, found without
    importing wordllama: its import costs 0.65 s (requests, its config classes) and calls
    `logging.basicConfig(level=INFO)`, which would make every library's INFO lines print in every
    Rufus command. They are the files `WordLlama.load` reads (a safetensors table under
    `embedding.weight` and a `tokenizers` JSON), checked by path, not by version: wordllama 0.4's
    loader looks for the tokenizer in `wordllama/tokenizer/` while the wheel ships it in
    `wordllama/tokenizers/`, and a later release that moves either file is reported here rather
    than sent to the hub."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise RufusError("the semantic stage's default embedder needs wordllama: pip install 'wordllama>=0.4' "
                         "(or pass --semantic-model with a sentence-transformers model)")
    package = Path(spec.submodule_search_locations[0])
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


class WordLlamaEmbedder:
    """wordllama's static model over Rufus-normalised words, with a per-word cache."""

    name = DEFAULT_MODEL

    def __init__(self, max_cached_words: int = 100_000, cache_vocabulary: bool = True):  # 100 MB of word sums at most
        weights, tokenizer_file = _wordllama_files()
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        with safe_open(weights, framework="np") as f:
            self.table = np.ascontiguousarray(f.get_tensor("embedding.weight"), dtype=np.float32)
        self.dim = self.table.shape[1]
        self._starts_word = np.zeros(len(self.table), bool)  # token ids that begin a word ("▁...")
        for token, i in self.tokenizer.get_vocab().items():
            if i < len(self.table) and token.startswith("\u2581"):
                self._starts_word[i] = True
        self.version = metadata.version("wordllama")
        self.max_cached_words = max_cached_words
        self._hasher = TokenHasher()
        # the stores are allocated once at full size: np.zeros maps zero pages that are touched only
        # as words arrive, so no copy of the cache is ever made (a forked worker fills its own)
        self._key_store = np.zeros(max_cached_words, np.uint64)
        self._sum_store = np.zeros((max_cached_words, self.dim), np.float32)
        self._count_store = np.zeros(max_cached_words, np.float32)
        self._keys = self._key_store[:0]  # cached word hashes, in the order they came
        self._sums = self._sum_store[:0]  # token-vector sum of each cached word
        self._counts = self._count_store[:0]  # its token count
        self._slots = np.full(int(SLOT_MASK) + 1, -1, np.int32)  # hash low bits -> cache row
        self._spill_keys = np.empty(0, np.uint64)  # keys whose slot was taken, sorted
        self._spill_rows = np.empty(0, np.int64)
        if cache_vocabulary:
            keys, sums, counts = self._vocabulary_words()
            self._cache(keys[:max_cached_words], sums[:max_cached_words], counts[:max_cached_words])

    def _vocabulary_words(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hash, token-vector sum, token count) of every whole word of the tokenizer's vocabulary
        (a `▁word` token whose text is already in Rufus's normal form): they are most of the words a
        text holds, and forked scan workers inherit them instead of each tokenising them again.
        Worked out once per wordllama version (0.6 s) and kept in `$RUFUS_CACHE` (11 MB, read in
        0.01 s)."""
        stored = cache_dir() / "wordllama" / self.version / f"{WORDLLAMA_CONFIG}_{WORDLLAMA_DIM}_words.npz"
        if stored.exists():
            with np.load(stored) as saved:
                return saved["keys"], saved["sums"], saved["counts"]
        words = pa.array(sorted({token[1:] for token in self.tokenizer.get_vocab()
                                 if token.startswith("\u2581") and len(token) > 1}), pa.large_string())
        flat, offsets = tokenize_array(words)
        one_word = np.diff(offsets) == 1
        positions = offsets[:-1][one_word]
        unchanged = pc.equal(flat.take(pa.array(positions)), words.filter(pa.array(one_word)))
        positions = positions[np.asarray(unchanged, dtype=bool)]
        keys, first = np.unique(self._hasher(flat)[positions], return_index=True)
        sums, counts = self._word_vectors(flat.take(pa.array(positions[first])).to_pylist())
        with atomic_file(stored) as tmp:
            np.savez(tmp, keys=keys, sums=sums, counts=counts)
        return keys, sums, counts

    def _word_vectors(self, words: list[str], chunk: int = 500) -> tuple[np.ndarray, np.ndarray]:
        """Token-vector sum and token count of each word (a sparse words x vocabulary product: no
        (tokens x dim) array is ever gathered). Words are tokenised a chunk at a time, joined by
        spaces as in a text; the tokenizer turns each space into `▁` and never merges across it,
        so each word's tokens start at the next token that starts with `▁`. The model has no
        pre-tokenizer, so a chunk is one BPE sequence: 500 words tokenise faster than 2,000, and
        `encode_batch_fast` (one chunk a call: no thread pool, so no fork warning) skips the
        offsets; 40% less time on the 41k new words of GSM8K train + Code Alpaca + HH-RLHF."""
        words_in = words
        spaced = [i for i, w in enumerate(words) if " " in w]  # rare: each is tokenised alone
        if spaced:
            words = [w.replace(" ", "_") for w in words]  # a stand-in of one word
        ids = []
        for lo in range(0, len(words), chunk):
            ids += self.tokenizer.encode_batch_fast([" ".join(words[lo : lo + chunk])], add_special_tokens=False)[0].ids
        ids = np.clip(np.asarray(ids, np.int64), 0, len(self.table) - 1)
        owners = np.cumsum(self._starts_word[ids]) - 1
        if spaced:  # drop the stand-ins' tokens, add each spaced word's own
            keep = ~np.isin(owners, spaced)
            ids, owners = ids[keep], owners[keep]
            for i, encoding in zip(spaced, self.tokenizer.encode_batch([words_in[i] for i in spaced], add_special_tokens=False)):
                ids = np.concatenate((ids, np.clip(np.asarray(encoding.ids, np.int64), 0, len(self.table) - 1)))
                owners = np.concatenate((owners, np.full(len(encoding.ids), i)))
        tokens = sparse.csr_matrix((np.ones(len(ids), np.float32), (owners, ids)), shape=(len(words), len(self.table)))
        counts = np.bincount(owners, minlength=len(words)).astype(np.float32)
        return np.asarray(tokens @ self.table, dtype=np.float32), counts

    def _find(self, hashes: np.ndarray) -> np.ndarray:
        """Cache row of each word hash, -1 where the word is not cached: a direct-address table on
        the hash's low bits (one gather per word), and a sorted spill list for the few keys whose
        slot was taken."""
        if not len(self._keys):
            return np.full(len(hashes), -1, np.int64)
        slot = self._slots[(hashes & SLOT_MASK).astype(np.int64)].astype(np.int64)
        hit = (slot >= 0) & (self._keys[np.maximum(slot, 0)] == hashes)
        found = np.where(hit, slot, -1)
        rest = np.flatnonzero(~hit)
        if len(rest) and len(self._spill_keys):
            where = np.minimum(np.searchsorted(self._spill_keys, hashes[rest]), len(self._spill_keys) - 1)
            ok = self._spill_keys[where] == hashes[rest]
            found[rest[ok]] = self._spill_rows[where[ok]]
        return found

    def _cache(self, keys: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
        """Add new words (distinct, none cached yet) to the cache."""
        first_row, size = len(self._keys), len(self._keys) + len(keys)
        self._key_store[first_row:size], self._sum_store[first_row:size], self._count_store[first_row:size] = keys, sums, counts
        self._keys, self._sums, self._counts = self._key_store[:size], self._sum_store[:size], self._count_store[:size]
        slots = (keys & SLOT_MASK).astype(np.int64)
        rows = first_row + np.arange(len(keys))
        free = self._slots[slots] < 0
        self._slots[slots[free]] = rows[free]  # two new keys on one free slot: one of them gets it
        spilled = np.flatnonzero(self._slots[slots] != rows)
        if len(spilled):
            spill_keys = np.concatenate((self._spill_keys, keys[spilled]))
            spill_rows = np.concatenate((self._spill_rows, first_row + spilled))
            order = np.argsort(spill_keys, kind="stable")
            self._spill_keys, self._spill_rows = spill_keys[order], spill_rows[order]

    def _columns(self, words: pa.Array, hashes: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sums, counts, column of each word at `positions` of the flat `words` and their `hashes`):
        the cached words first, then this batch's words that did not fit in the cache (a Zipf tail
        past the cap)."""
        hashes = hashes[positions]
        found = self._find(hashes)
        missing = np.flatnonzero(found < 0)
        if not len(missing):
            return self._sums, self._counts, found
        distinct, first = np.unique(hashes[missing], return_index=True)
        new_sums, new_counts = self._word_vectors(words.take(pa.array(positions[missing[first]])).to_pylist())
        first_row = len(self._keys)
        room = max(0, self.max_cached_words - first_row)
        if room:
            self._cache(distinct[:room], new_sums[:room], new_counts[:room])
        new = np.searchsorted(distinct, hashes[missing])  # distinct word j is cache row first_row + j, if it fit
        found[missing] = np.where(new < room, first_row + new, len(self._keys) + new)
        if room >= len(distinct):
            return self._sums, self._counts, found
        return (np.concatenate((self._sums, new_sums)), np.concatenate((self._counts, new_counts)), found)

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
        position = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(start, lengths)
        used = np.zeros(len(hashes), bool)
        used[position] = True
        kept = np.flatnonzero(used)
        sums, counts, word = self._columns(words, hashes, kept)
        column = np.empty(len(hashes), np.int64)
        column[kept] = word
        # spans are consecutive runs of `position`: the bag of words is a CSR matrix as it stands
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        bag = sparse.csr_matrix((np.ones(len(position), np.float32), column[position], indptr),
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
