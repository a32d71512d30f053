"""Which columns of a canonical row hold text, and every text field of a batch of rows: what
decontam, dedup and the semantic stage compare (rows of any kind: messages, prompt, chosen,
rejected, and string or list-of-string columns such as solution or tests)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Columns that describe a row rather than hold its text.
NON_TEXT_COLUMNS = frozenset({"id", "source", "label", "origin_id"})


def text_fields(table: pa.Table) -> tuple[list[str], np.ndarray, list[str]]:
    """Every text field of every row: (texts, row index of each text, field name of each text).

    Strings, lists of strings, and message lists (the content of every turn, named
    `messages[i].role`) all count: system, user and assistant turns, prompt, solution, tests."""
    texts: list[str] = []
    rows: list[np.ndarray] = []
    names: list[str] = []
    for name in table.column_names:
        if name in NON_TEXT_COLUMNS:
            continue
        col = table.column(name).combine_chunks() if table.num_rows else pa.array([], table.schema.field(name).type)
        typ = col.type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            values = col.to_pylist()
            keep = [i for i, v in enumerate(values) if v]
            texts += [values[i] for i in keep]
            rows.append(np.asarray(keep, dtype=np.int64))
            names += [name] * len(keep)
        elif (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and len(col):
            inner = typ.value_type
            parents = pc.list_parent_indices(col).to_numpy()
            flat = pc.list_flatten(col)
            offsets = col.offsets.to_numpy()
            position = np.arange(len(parents)) - offsets[parents] + offsets[0]
            if pa.types.is_struct(inner) and inner.get_field_index("content") >= 0:
                contents = flat.field("content").to_pylist()
                roles = (flat.field("role").to_pylist() if inner.get_field_index("role") >= 0
                         else ["turn"] * len(contents))
                labels = [f"{name}[{p}].{r}" for p, r in zip(position.tolist(), roles)]
            elif pa.types.is_string(inner) or pa.types.is_large_string(inner):
                contents = flat.to_pylist()
                labels = [f"{name}[{p}]" for p in position.tolist()]
            else:
                continue
            keep = [i for i, v in enumerate(contents) if v]
            texts += [contents[i] for i in keep]
            rows.append(parents[keep].astype(np.int64))
            names += [labels[i] for i in keep]
    row_of = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    return texts, row_of, names
