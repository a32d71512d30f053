"""dedup as large-scale dedup runs: the same drops in one process, in a pool of processes and on
a local Ray cluster; clusters by union-find (a chain of near duplicates is one cluster); rows
copied thousands of times; and a run killed part way that, run again, resumes to the same output
without ever leaving a half-written folder."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, read_jsonl
from decontam_planting import recased_respaced

from rufus_data.dedup import DedupConfig, dedup
from rufus_data.folders.shards import read_shards, write_shards


def chat(rid: str, question: str, answer: str | None, source: str = "gsm8k", origin: str | None = None) -> dict:
    turns = [{"role": "user", "content": question}] + ([{"role": "assistant", "content": answer}] if answer else [])
    row = {"id": rid, "source": source, "label": source, "messages": turns}
    return row if origin is None else {**row, "origin_id": origin}


def planted_rows(data_root, n: int = 1200, seed: int = 3) -> list[dict]:
    """GSM8K train rows, then near and exact copies of some of them and a mix's repeats of
    others, in shuffled order."""
    rng = random.Random(seed)
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=n)
    rows = [chat(f"g{i}", r["question"], r["answer"], origin=f"g{i}") for i, r in enumerate(train)]
    later = []
    for k, i in enumerate(rng.sample(range(n), 90)):
        q, a = train[i]["question"], train[i]["answer"]
        if k % 3 == 1:
            q = recased_respaced(q, rng)
        elif k % 3 == 2:
            words = a.split(" ")
            words[len(words) // 2] = "so"
            a = " ".join(words)
        later.append(chat(f"dup{k}", q, a, "copies", origin=f"dup{k}"))
    for i in rng.sample(range(n), 30):  # a mix's repeats: same origin_id, never compared
        later.append(chat(f"g{i}#rep1", train[i]["question"], train[i]["answer"], origin=f"g{i}"))
    rng.shuffle(later)
    return rows + later


def outcome(result, out=None) -> tuple[list[dict], list[str] | None]:
    kept = read_shards(out).column("id").to_pylist() if out else None
    return result.clusters.to_pylist(), kept


@pytest.mark.spawn
def test_the_same_drops_in_one_process_and_in_two(data_root, tmp_path):
    write_shards(pa.Table.from_pylist(planted_rows(data_root)), tmp_path / "mix", shard_rows=150)
    one = dedup(tmp_path / "mix", tmp_path / "one", DedupConfig(workers=1, batch_rows=64))
    two = dedup(tmp_path / "mix", tmp_path / "two", DedupConfig(workers=2, batch_rows=64))
    assert outcome(one, tmp_path / "one") == outcome(two, tmp_path / "two")
    dropped = {c["duplicate_id"] for c in one.clusters.to_pylist()}
    assert {f"dup{k}" for k in range(90)} <= dropped  # every planted copy goes
    assert not any("#rep" in d for d in dropped)  # the repeats of kept rows stay
    assert (tmp_path / "one" / "clusters.parquet").exists() and not list(tmp_path.glob(".*dedup-work"))


@pytest.mark.spawn  # Ray starts its own processes (52 s of the fast set, measured under load)
def test_ray_engine_drops_what_local_drops(data_root, tmp_path):
    ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")
    write_shards(pa.Table.from_pylist(planted_rows(data_root, n=600)), tmp_path / "mix", shard_rows=200)
    local = dedup(tmp_path / "mix", tmp_path / "local", DedupConfig(workers=1))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = dedup(tmp_path / "mix", tmp_path / "ray", DedupConfig(engine="ray"))
    finally:
        ray.shutdown()
    assert outcome(remote, tmp_path / "ray") == outcome(local, tmp_path / "local")
    assert local.clusters.num_rows >= 60
    assert pq.read_table(tmp_path / "ray" / "clusters.parquet").equals(pq.read_table(tmp_path / "local" / "clusters.parquet"))


def test_a_chain_does_not_drop_a_row_unlike_the_kept_one(data_root, tmp_path):
    """A~B and B~C but not A~C (three windows of one text, each 5 words on, compared by Jaccard):
    union-find puts all three in one cluster, A is kept, B goes; C is no duplicate of A, the row
    kept, so it stays (it once went with A's cluster, through B)."""
    words = " ".join(r["question"] for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=4)).split()
    rows = [chat(name, " ".join(words[shift : shift + 60]), None) for name, shift in (("a", 0), ("b", 5), ("c", 10))]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    config = DedupConfig(measure="jaccard", threshold=0.8, numbers_must_match=False)
    result = dedup(tmp_path / "mix", None, config, report_only=True)
    pairs = {p["duplicate_id"]: p for p in result.clusters.to_pylist()}
    assert set(pairs) == {"b"} and pairs["b"]["kept_id"] == "a"
    assert pairs["b"]["measure"] == "jaccard" and pairs["b"]["value"] == pairs["b"]["jaccard"] >= 0.8


def test_rows_copied_many_times_are_one_cluster_each(data_root, tmp_path):
    """Two rows copied 300 times each (an exact copy, and one with a word changed every time):
    each group is one cluster whose first row stays, however large its LSH buckets."""
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=40)
    rows = [chat(f"g{i}", r["question"], r["answer"]) for i, r in enumerate(train)]
    first, second = train[0], train[1]
    for k in range(300):
        rows.append(chat(f"copy{k}", first["question"], first["answer"]))
        words = second["answer"].split(" ")
        words[k % len(words)] = f"w{k}"
        rows.append(chat(f"near{k}", second["question"], " ".join(words)))
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix", shard_rows=250)
    result = dedup(tmp_path / "mix", None, DedupConfig(workers=1, batch_rows=100), report_only=True)
    kept_of = {p["duplicate_id"]: p["kept_id"] for p in result.clusters.to_pylist()}
    assert kept_of == {**{f"copy{k}": "g0" for k in range(300)}, **{f"near{k}": "g1" for k in range(300)}}


def _dedup(mix, out, *options) -> list[str]:
    return [sys.executable, "-c", "from rufus_data.cli import app; app()", "dedup", str(mix), "--out", str(out), "--workers", "1", *options]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done


def _kill_once_sketched(command: list[str], work, tasks: int) -> None:
    """Start the command and SIGKILL it once `tasks` row groups are sketched."""
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(work.glob("sketch/*.meta.npz"))) < tasks and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed part way, not finished


@pytest.mark.spawn
def test_a_killed_run_resumes_to_the_same_output(data_root, tmp_path):
    write_shards(pa.Table.from_pylist(planted_rows(data_root, n=4000, seed=4)), tmp_path / "mix", shard_rows=100)
    (tmp_path / "small.yaml").write_text("batch_rows: 50\n")
    command = _dedup(tmp_path / "mix", tmp_path / "out", "--config", str(tmp_path / "small.yaml"))
    _kill_once_sketched(command, tmp_path / ".out.dedup-work", 5)  # of 42 row groups
    assert not (tmp_path / "out").exists()  # never a half-written output folder
    again = _run(command)
    assert "resuming the work of an earlier run" in " ".join(again.stderr.split())
    assert not (tmp_path / ".out.dedup-work").exists()  # removed once the output is in place
    dedup(tmp_path / "mix", tmp_path / "clean")  # an uninterrupted run
    assert pq.read_table(tmp_path / "out" / "clusters.parquet").equals(pq.read_table(tmp_path / "clean" / "clusters.parquet"))
    assert read_shards(tmp_path / "out").equals(read_shards(tmp_path / "clean"))
    # run again with other settings, the work of a killed run is not reused: it starts afresh
    _kill_once_sketched(_dedup(tmp_path / "mix", tmp_path / "other"), tmp_path / ".other.dedup-work", 1)
    (tmp_path / "strict.yaml").write_text("threshold: 0.9\n")
    changed = _run(_dedup(tmp_path / "mix", tmp_path / "other", "--config", str(tmp_path / "strict.yaml")))
    assert "resuming" not in changed.stderr
