"""`--engine ray`: the same per-task scan as Ray Data tasks, on a local Ray instance."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import read_jsonl

from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.folders.shards import write_shards


@pytest.mark.spawn
def test_ray_engine_finds_what_local_finds(data_root, tmp_path):
    ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=400)
    test = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=40)
    rows = []
    for i, r in enumerate(train):
        question = test[i // 10]["question"] if i % 10 == 0 else r["question"]
        rows.append({"id": f"r{i}", "source": "gsm8k_train", "label": "x",
                     "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": r["answer"]}]})
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix", shard_rows=200)
    local = decontam(tmp_path / "mix", tmp_path / "local", DecontamConfig(against=["gsm8k"], workers=1, batch_rows=100))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = decontam(tmp_path / "mix", tmp_path / "ray", DecontamConfig(against=["gsm8k"], engine="ray", batch_rows=100))
    finally:
        ray.shutdown()
    assert remote.hits.sort_by("row").to_pylist() == local.hits.sort_by("row").to_pylist()
    assert {h["row_id"] for h in remote.hits.to_pylist()} >= {f"r{i}" for i in range(0, 400, 10)}
    assert (tmp_path / "ray" / "report.md").exists()
