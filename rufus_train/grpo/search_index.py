"""A local full-text search index in duckdb, so the search agent trains offline.

duckdb's `fts` extension cannot be used here: `INSTALL fts` downloads it from duckdb's extension
server (unreachable offline), and the PyPI wheels that carry it (`duckdb-extension-fts`) stop at
duckdb 1.5.5 while Rufus runs duckdb 2.x (an extension loads only into the exact version it was
built for). So the index is the same thing `fts` builds, in plain SQL: an inverted index
(term, doc, term frequency) plus document lengths, scored with Okapi BM25 (k1=1.2, b=0.75, the
`fts` defaults) at query time. Terms are lowercased alphanumeric tokens minus English stopwords
(no stemming).

A corpus is a JSONL or parquet file of documents, or a folder of them: a Wikipedia dump as the
hub's `wikimedia/wikipedia` parquet files (id, url, title, text) or as WikiExtractor's `--json`
output (AA/wiki_00 ... of JSON lines with the same fields). `read_corpus` streams it, optionally
cut into passages of N words; `build_index` indexes a stream in batches (bounded memory)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import read_jsonl

STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he", "her", "his", "i", "in", "is", "it", "its", "of", "on", "or", "she", "that", "the", "their", "them", "there", "these", "they", "this", "to", "was", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"]
)
TOKEN = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def tokenize(text: str) -> list[str]:
    return [t for t in TOKEN.findall(text.lower()) if t not in STOPWORDS]


def build_index(documents: Iterable[dict], path: str | Path, text_key: str = "text", id_key: str = "id",
                batch_size: int = 20_000) -> Path:
    """Write a BM25 index of `documents` ({id, text, ...}) to a duckdb file (replaced if present).
    Documents stream through in batches, so a corpus far larger than memory (a Wikipedia dump)
    indexes in bounded memory; the file appears only once it is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    count = 0
    with duckdb.connect(str(tmp)) as con:
        con.execute("CREATE TABLE docs (doc_id BIGINT, name VARCHAR, text VARCHAR, length BIGINT)")
        con.execute("CREATE TABLE postings_unsorted (term VARCHAR, doc_id BIGINT, tf BIGINT)")
        for batch in _batches(documents, batch_size):
            docs, postings = _index_batch(batch, count, text_key, id_key)
            con.register("docs_arrow", docs)
            con.register("postings_arrow", postings)
            con.execute("INSERT INTO docs SELECT * FROM docs_arrow")
            con.execute("INSERT INTO postings_unsorted SELECT * FROM postings_arrow")
            con.unregister("docs_arrow")
            con.unregister("postings_arrow")
            count += len(batch)
        if count == 0:
            raise RufusError("the search corpus is empty: give at least one document with a 'text' field")
        con.execute("CREATE TABLE postings AS SELECT * FROM postings_unsorted ORDER BY term")
        con.execute("DROP TABLE postings_unsorted")
        con.execute("CREATE TABLE stats AS SELECT count(*) AS n_docs, avg(length) AS avg_len FROM docs")
    tmp.rename(path)
    return path


def _batches(documents: Iterable[dict], size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for doc in documents:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _index_batch(batch: list[dict], first_id: int, text_key: str, id_key: str) -> tuple[pa.Table, pa.Table]:
    missing = [first_id + i for i, doc in enumerate(batch) if not isinstance(doc.get(text_key), str)]
    if missing:
        raise RufusError(f"search corpus documents {missing[:5]} have no string '{text_key}' field")
    postings: dict[str, list] = {"term": [], "doc_id": [], "tf": []}
    lengths = []
    for offset, doc in enumerate(batch):
        terms = tokenize(doc[text_key])
        lengths.append(len(terms))
        for term, tf in Counter(terms).items():
            postings["term"].append(term)
            postings["doc_id"].append(first_id + offset)
            postings["tf"].append(tf)
    docs = pa.table({
        "doc_id": pa.array(range(first_id, first_id + len(batch)), pa.int64()),
        "name": pa.array([str(doc.get(id_key, first_id + i)) for i, doc in enumerate(batch)], pa.string()),
        "text": pa.array([doc[text_key] for doc in batch], pa.string()),
        "length": pa.array(lengths, pa.int64()),
    })
    return docs, pa.table({"term": pa.array(postings["term"], pa.string()),
                           "doc_id": pa.array(postings["doc_id"], pa.int64()),
                           "tf": pa.array(postings["tf"], pa.int64())})


# ------------------------------------------------------------------------------ corpora

CORPUS_SUFFIXES = (".jsonl", ".json", ".parquet")
WIKIEXTRACTOR_FILE = re.compile(r"^wiki_\d+$")  # WikiExtractor --json output: AA/wiki_00, AA/wiki_01, ...


def corpus_files(path: Path) -> list[Path]:
    """The files of a corpus: the file itself, or every JSONL / parquet / WikiExtractor file below a folder."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and (p.suffix in CORPUS_SUFFIXES
                                                                 or WIKIEXTRACTOR_FILE.match(p.name)))
    if not files:
        raise RufusError(f"search corpus folder {path} holds no .jsonl, .parquet or WikiExtractor wiki_NN files")
    return files


def _records(file: Path) -> Iterator[dict]:
    if file.suffix == ".parquet":
        for batch in pq.ParquetFile(file).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
    else:  # JSON lines: .jsonl, .json, and WikiExtractor's wiki_NN
        yield from read_jsonl(file, what="search corpus")


def record_text_fields(record: dict, id_field: str) -> list[str]:
    """The fields a record's text is made of when none are named: `title` and `text` when it has a
    `text` (a document, a Wikipedia article), else every string field but the id (a GSM8K row:
    question, answer)."""
    if "text" in record:
        return ["title", "text"]
    return [key for key, value in record.items() if key != id_field and isinstance(value, str)]


def read_corpus(path: str | Path, text_fields: list[str] | None = None, id_field: str = "id",
                passage_words: int | None = None) -> Iterator[dict]:
    """Documents {id, text} from a corpus file or folder. `text` joins the record's `text_fields`
    that are present (None: see `record_text_fields`); a record without its id gets
    `<file>-<row>`. With `passage_words`, each document is cut into passages of that many words
    (ids `<id>#<n>`), as retrieval over Wikipedia does (100 words)."""
    path = Path(path)
    if not path.exists():
        raise RufusError(f"search corpus {path} does not exist: give a JSONL or parquet file of documents, or a "
                         "folder of them (a Wikipedia dump)")
    found_text = False
    for file in corpus_files(path):
        for row, record in enumerate(_records(file)):
            fields = text_fields or record_text_fields(record, id_field)
            text = "\n".join(str(record[f]) for f in fields if record.get(f) not in (None, ""))
            if not text:
                continue
            found_text = True
            doc_id = str(record.get(id_field) or f"{file.stem}-{row}")
            if passage_words is None:
                yield {"id": doc_id, "text": text}
                continue
            words = text.split()
            for n, start in enumerate(range(0, len(words), passage_words)):
                yield {"id": f"{doc_id}#{n}", "text": " ".join(words[start:start + passage_words])}
    if not found_text:
        raise RufusError(f"search corpus {path}: no record has any of the text fields "
                         f"{text_fields or ['title', 'text']}; set search_text_fields to the fields that hold the "
                         "documents' text")


class SearchIndex:
    """Read-only BM25 search over an index written by `build_index`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise RufusError(f"search index {self.path} does not exist: build it with rufus_train.grpo.search_index.build_index")
        self.con = duckdb.connect(str(self.path), read_only=True)

    def search(self, query: str, k: int = 3) -> list[dict]:
        terms = sorted(set(tokenize(query)))
        if not terms:
            return []
        rows = self.con.execute(
            """
            WITH q AS (SELECT unnest(?::VARCHAR[]) AS term),
            df AS (SELECT p.term, count(*) AS df FROM postings p JOIN q USING (term) GROUP BY p.term),
            scored AS (
                SELECT p.doc_id,
                       sum(ln(1 + (s.n_docs - df.df + 0.5) / (df.df + 0.5))
                           * p.tf * (? + 1) / (p.tf + ? * (1 - ? + ? * d.length / s.avg_len))) AS score
                FROM postings p JOIN df USING (term) JOIN docs d USING (doc_id), stats s
                GROUP BY p.doc_id
            )
            SELECT d.name, d.text, scored.score FROM scored JOIN docs d USING (doc_id)
            ORDER BY scored.score DESC, d.doc_id LIMIT ?
            """,
            [terms, K1, K1, B, B, k],
        ).fetchall()
        return [{"id": name, "text": text, "score": float(score)} for name, text, score in rows]

    def size(self) -> int:
        return self.con.execute("SELECT n_docs FROM stats").fetchone()[0]

    def close(self) -> None:
        self.con.close()
