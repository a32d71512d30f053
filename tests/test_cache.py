"""$RUFUS_CACHE: where it is ($RUFUS_CACHE, else $XDG_CACHE_HOME/rufus, else ~/.cache/rufus), the
bound on its computed entries (the decontam eval indexes: least recently used removed first past
$RUFUS_CACHE_MAX_GB), and `rufus-data cache info` / `cache clean`, which removes only those."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from rufus_data.base import cache
from rufus_data.base.paths import cache_dir, cached_pickle
from rufus_data.benchmarks import load_benchmarks
from rufus_data.cli import app
from rufus_data.decontam import index as eval_index
from rufus_data.decontam import semantic_stage
from rufus_data.decontam.config import DecontamConfig


def test_cache_dir_is_rufus_cache_else_xdg_cache_home_else_home(tmp_path, monkeypatch):
    monkeypatch.delenv("RUFUS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "rufus" and cache_dir().is_dir()
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RUFUS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: a relative path is ignored
    assert cache_dir() == Path.home() / ".cache" / "rufus"


def test_decontam_eval_indexes_are_bounded_least_recently_used_first(tmp_path, monkeypatch, data_root):
    """Real eval indexes (GSM8K under three n-gram settings): with room for two, writing the third
    removes the one used longest ago; an entry read since it was written counts as used then."""
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    items = load_benchmarks(["gsm8k"]).items
    configs = [DecontamConfig(ngram=n) for n in (8, 9, 10)]

    def entries() -> set[Path]:
        return set((tmp_path / "decontam").glob("ngrams-*.pkl"))

    eval_index.build_eval_index(items, configs[0], cache=True)
    [first] = entries()
    eval_index.build_eval_index(items, configs[1], cache=True)
    [second] = entries() - {first}
    os.utime(first, (1_000, 1_000))  # both long ago, the second used last ...
    os.utime(second, (2_000, 2_000))
    eval_index.build_eval_index(items, configs[0], cache=True)  # ... until the first is read again
    assert first.stat().st_mtime > 2_000
    room = 2.5 * max(first.stat().st_size, second.stat().st_size)  # two entries of this size, not three
    monkeypatch.setenv("RUFUS_CACHE_MAX_GB", str(room / 1e9))
    eval_index.build_eval_index(items, configs[2], cache=True)
    third = (entries() - {first, second}).pop()
    assert entries() == {first, third}  # the second, least recently used, went
    monkeypatch.setenv("RUFUS_CACHE_MAX_GB", "0")  # nothing kept but the entry just written
    eval_index.build_eval_index(items, configs[1], cache=True)
    assert entries() == {second}


def test_cache_info_lists_folders_and_clean_removes_only_computed_entries(tmp_path, monkeypatch, data_root):
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "model.safetensors").write_bytes(b"\0" * 1000)
    eval_index.build_eval_index(load_benchmarks(["gsm8k"]).items, DecontamConfig(), cache=True)
    runner = CliRunner()
    shown = runner.invoke(app, ["cache", "info"])
    assert shown.exit_code == 0, shown.output
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in shown.stdout.splitlines()
             if line.startswith("│")]
    rows = {row[0]: row[1:] for row in cells}  # folder: files, MB, computed entries, computed MB
    assert set(rows) == {"decontam", "models"}
    assert (rows["models"][0], rows["models"][2]) == ("1", "0") and (rows["decontam"][0], rows["decontam"][2]) == ("1", "1")
    cleaned = runner.invoke(app, ["cache", "clean"])
    assert cleaned.exit_code == 0, cleaned.output
    assert "removed 1 computed entries" in cleaned.stdout
    assert not (tmp_path / "decontam").exists()
    assert (tmp_path / "models" / "tiny" / "model.safetensors").exists()
    monkeypatch.setenv("RUFUS_CACHE_MAX_GB", "lots")
    refused = runner.invoke(app, ["cache", "info"])
    assert refused.exit_code != 0 and "RUFUS_CACHE_MAX_GB='lots' is not a size" in refused.output


class Planted:
    """What a planted entry holds: unpickling it would run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_entry_runs_nothing_and_is_replaced(tmp_path, monkeypatch, capsys):
    """Issue 47 item 14: pickle.load on a $RUFUS_CACHE entry ran a planted file."""
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path / "cache"))
    computed = []

    def compute() -> dict:
        computed.append(1)
        return {"grams": np.arange(3, dtype=np.uint64), "names": {"a"}}

    value = cached_pickle("test/planted", ["k"], [], compute, types=())
    [entry] = (tmp_path / "cache" / "test").glob("planted-*.pkl")
    marker = tmp_path / "ran"
    entry.write_bytes(pickle.dumps(Planted(marker)))
    again = cached_pickle("test/planted", ["k"], [], compute, types=())
    assert not marker.exists() and len(computed) == 2
    assert "names posix.system, which no Rufus cache entry holds: not loaded" in " ".join(capsys.readouterr().err.split())
    assert again["names"] == value["names"] and (again["grams"] == value["grams"]).all()
    cached_pickle("test/planted", ["k"], [], compute, types=())  # replaced: read back, not computed
    assert len(computed) == 2


def test_both_decontam_entries_read_back_from_the_cache(tmp_path, monkeypatch, data_root, capsys):
    """The classes each entry names are the ones its reader allows: a second command reads them."""
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    items = load_benchmarks(["gsm8k"]).items[:50]
    config = DecontamConfig(ngram=8)
    first = eval_index.build_eval_index(items, config, cache=True)
    loads = []
    real = cache.EntryUnpickler.load
    monkeypatch.setattr(cache.EntryUnpickler, "load", lambda self: loads.append(1) or real(self))
    second = eval_index.build_eval_index(items, config, cache=True)
    assert loads == [1] and (second.exact.item_grams == first.exact.item_grams).all()
    assert (second.minhash.hasher.segments(first.minhash.shingles, first.minhash.bounds[:-1])
            == first.minhash.hasher.segments(first.minhash.shingles, first.minhash.bounds[:-1])).all()
    texts = ["\n".join(item.problems) for item in items]
    semantic_stage.eval_side(texts, "wordllama")
    vectors, evidence = semantic_stage.eval_side(texts, "wordllama")
    assert loads == [1, 1] and len(evidence) == len(items) and vectors.shape[0] == len(items)
    assert "no Rufus cache entry holds" not in capsys.readouterr().err  # both read back whole
