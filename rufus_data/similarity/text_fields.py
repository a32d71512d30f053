"""Which columns of a canonical row hold text, and every text field of a batch of rows: what
decontam, dedup and the semantic stage compare (rows of any kind: messages, prompt, chosen,
rejected, and string or list-of-string columns such as solution or tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Columns that describe a row rather than hold its text.
NON_TEXT_COLUMNS = frozenset({"id", "source", "label", "origin_id"})


def _columns(table: pa.Table) -> Iterator[tuple[pa.Array, np.ndarray, Callable[[np.ndarray], list[str]], np.ndarray]]:
    """Per text column: its strings (flat, nulls and "" included), the row of each, a function
    that names the fields at some positions of the flat strings, and whether each is a system message."""
    for name in table.column_names:
        if name in NON_TEXT_COLUMNS:
            continue
        col = table.column(name).combine_chunks() if table.num_rows else pa.array([], table.schema.field(name).type)
        typ = col.type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            yield col, np.arange(len(col), dtype=np.int64), lambda keep, name=name: [name] * len(keep), np.zeros(len(col), bool)
        elif (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and len(col):
            inner = typ.value_type
            parents = pc.list_parent_indices(col).to_numpy().astype(np.int64)
            flat = pc.list_flatten(col)
            offsets = col.offsets.to_numpy()
            position = np.arange(len(parents)) - offsets[parents] + offsets[0]
            if pa.types.is_struct(inner) and inner.get_field_index("content") >= 0:
                roles = flat.field("role") if inner.get_field_index("role") >= 0 else None

                def labels(keep: np.ndarray, name=name, roles=roles, position=position) -> list[str]:
                    found = roles.take(pa.array(keep)).to_pylist() if roles is not None else ["turn"] * len(keep)
                    return [f"{name}[{p}].{r}" for p, r in zip(position[keep].tolist(), found)]

                system = (pc.fill_null(pc.equal(roles, "system"), False).to_numpy(zero_copy_only=False) if roles is not None
                          else np.zeros(len(parents), bool))
                yield flat.field("content"), parents, labels, system
            elif pa.types.is_string(inner) or pa.types.is_large_string(inner):
                yield (flat, parents, lambda keep, name=name, position=position: [f"{name}[{p}]" for p in position[keep].tolist()],
                       np.zeros(len(parents), bool))


def _filled(values: pa.Array) -> np.ndarray:
    """The positions of the strings that are neither null nor empty."""
    return np.flatnonzero(pc.fill_null(pc.greater(pc.binary_length(values), 0), False).to_numpy(zero_copy_only=False))


def text_fields(table: pa.Table) -> tuple[list[str], np.ndarray, list[str]]:
    """Every text field of every row: (texts, row index of each text, field name of each text).

    Strings, lists of strings, and message lists (the content of every turn, named
    `messages[i].role`) all count: system, user and assistant turns, prompt, solution, tests."""
    texts: list[str] = []
    rows: list[np.ndarray] = []
    names: list[str] = []
    for values, parents, labels, _ in _columns(table):
        keep = _filled(values)
        texts += values.take(pa.array(keep)).to_pylist()
        rows.append(parents[keep])
        names += labels(keep)
    row_of = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    return texts, row_of, names


def text_arrays(table: pa.Table, system_flags: bool = False) -> tuple:
    """The texts of `text_fields` as one Arrow array (no Python strings made), and the row of each;
    with `system_flags`, also whether each is a system message (dedup's numbers: a system prompt's
    numbers frame a row)."""
    texts: list[pa.Array] = []
    rows: list[np.ndarray] = []
    system: list[np.ndarray] = []
    for values, parents, _, is_system in _columns(table):
        keep = _filled(values)
        texts.append(pc.cast(values.take(pa.array(keep)), pa.large_string()))
        rows.append(parents[keep])
        system.append(is_system[keep])
    found = ((pa.concat_arrays(texts), np.concatenate(rows), np.concatenate(system)) if texts
             else (pa.array([], pa.large_string()), np.empty(0, dtype=np.int64), np.zeros(0, bool)))
    return found if system_flags else found[:2]
