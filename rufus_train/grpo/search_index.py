"""A local full-text search index in duckdb, so the search agent trains offline.

duckdb's `fts` extension cannot be used here: `INSTALL fts` downloads it from duckdb's extension
server (unreachable offline), and the PyPI wheels that carry it (`duckdb-extension-fts`) stop at
duckdb 1.5.5 while Rufus runs duckdb 2.x (an extension loads only into the exact version it was
built for). So the index is the same thing `fts` builds, in plain SQL: an inverted index
(term, doc, term frequency) plus document lengths, scored with Okapi BM25 (k1=1.2, b=0.75, the
`fts` defaults) at query time. Terms are lowercased alphanumeric tokens minus English stopwords
(no stemming)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa

from rufus_data.errors import RufusError

STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he", "her", "his", "i", "in", "is", "it", "its", "of", "on", "or", "she", "that", "the", "their", "them", "there", "these", "they", "this", "to", "was", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"]
)
TOKEN = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def tokenize(text: str) -> list[str]:
    return [t for t in TOKEN.findall(text.lower()) if t not in STOPWORDS]


def build_index(documents: list[dict], path: str | Path, text_key: str = "text", id_key: str = "id") -> Path:
    """Write a BM25 index of `documents` ({id, text, ...}) to a duckdb file (replaced if present)."""
    path = Path(path)
    if not documents:
        raise RufusError("the search corpus is empty: give at least one document with a 'text' field")
    missing = [i for i, doc in enumerate(documents) if not isinstance(doc.get(text_key), str)]
    if missing:
        raise RufusError(f"search corpus documents {missing[:5]} have no string '{text_key}' field")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    docs = pa.table(
        {
            "doc_id": pa.array(list(range(len(documents))), pa.int64()),
            "name": pa.array([str(doc.get(id_key, i)) for i, doc in enumerate(documents)]),
            "text": pa.array([doc[text_key] for doc in documents]),
        }
    )
    postings = {"term": [], "doc_id": [], "tf": []}
    lengths = []
    for doc_id, doc in enumerate(documents):
        terms = tokenize(doc[text_key])
        lengths.append(len(terms))
        counts: dict[str, int] = {}
        for term in terms:
            counts[term] = counts.get(term, 0) + 1
        for term, tf in counts.items():
            postings["term"].append(term)
            postings["doc_id"].append(doc_id)
            postings["tf"].append(tf)
    terms_table = pa.table(postings)
    docs = docs.append_column("length", pa.array(lengths, pa.int64()))
    with duckdb.connect(str(tmp)) as con:
        con.register("docs_arrow", docs)
        con.register("terms_arrow", terms_table)
        con.execute("CREATE TABLE docs AS SELECT * FROM docs_arrow")
        con.execute("CREATE TABLE postings AS SELECT * FROM terms_arrow ORDER BY term")
        con.execute("CREATE TABLE stats AS SELECT count(*) AS n_docs, avg(length) AS avg_len FROM docs")
    tmp.rename(path)
    return path


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

    def close(self) -> None:
        self.con.close()
