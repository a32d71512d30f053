"""The one loader of catalog sources and benchmarks (rufus_data/sources/dataset_source.py): path, then
local, then hub; provenance; id ranges; the error when nothing loads; and the catalog side:
fallbacks and builder steps, as the mix manifest records them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_jsonl

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import read_shards
from rufus_data.mix import mix
from rufus_data.sources.canonical import open_source
from rufus_data.sources.catalog import load_catalog
from rufus_data.sources.dataset_source import (
    DatasetSource,
    DatasetUnavailable,
    HubDataset,
    IdRange,
    load_rows,
)


def hub_shaped_folder(root: Path) -> Path:
    """A dataset folder laid out like a hub repo (README `configs:` + parquet per split), as
    `huggingface-cli download --repo-type dataset` leaves it: `datasets` reads it offline."""
    folder = root / "org__mbpp"
    for split, ids in (("train", [601, 602]), ("test", [11, 12]), ("validation", [511])):
        (folder / "sanitized").mkdir(parents=True, exist_ok=True)
        rows = [{"task_id": i, "prompt": f"Write a function number {i}.", "test_list": [f"assert f{i}() == {i}"]}
                for i in ids]
        pq.write_table(pa.Table.from_pylist(rows), folder / "sanitized" / f"{split}-00000-of-00001.parquet")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: sanitized\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: sanitized/{s}-*\n" for s in ("train", "test", "validation"))
        + "---\n")
    return folder


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def test_path_then_local_then_hub(tmp_path, monkeypatch, data_root, datasets_cache):
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    hub = HubDataset(id=str(hub_shaped_folder(tmp_path)), config="sanitized", split="train+validation")
    both = DatasetSource(path=str(own), local="gsm8k/train.jsonl", hub=hub)
    first = load_rows(both, "dataset 'x'")
    assert first.provenance["origin"] == "path" and list(first.rows) == [{"question": "q", "answer": "a"}]
    assert first.provenance["fingerprint"].startswith("sha256:") and first.count == 1

    second = load_rows(both.model_copy(update={"path": str(tmp_path / "gone.jsonl")}), "dataset 'x'")
    assert second.provenance["origin"] == "local" and second.count == 7473
    assert second.provenance["sha256"] == "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"

    monkeypatch.delenv("RUFUS_DATA_ROOT")
    third = load_rows(both.model_copy(update={"path": None}), "dataset 'x'")
    rows = list(third.rows)
    assert third.provenance["origin"] == "hub" and [r["task_id"] for r in rows] == [601, 602, 511]
    assert third.provenance["split"] == "train+validation" and third.provenance["revision"] == "unpinned"
    assert third.provenance["datasets_fingerprint"]


def test_nothing_loads_names_the_dataset_and_three_ways(tmp_path, monkeypatch, hub_offline):
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))  # hub_offline: the hub code runs, from an empty cache
    source = DatasetSource(path="nope.jsonl", local="gsm8k/nope.jsonl",
                           hub=HubDataset(id="no-such-org/no-such-set", split="train", revision="a" * 40))
    with pytest.raises(DatasetUnavailable) as err:
        load_rows(source, "source 'mine'", base=tmp_path)
    text = str(err.value)
    assert text.startswith("source 'mine' could not be loaded; tried: ")
    assert f"file {tmp_path / 'nope.jsonl'} does not exist" in text
    assert "$RUFUS_DATA_ROOT/gsm8k/nope.jsonl (not in" in text and "no-such-org/no-such-set" in text
    assert "use `path:`" in text and "`local:`" in text and "`hub:` {id, config, split, revision}" in text


def test_a_dead_network_is_found_at_once(monkeypatch):
    """One short connect decides that the hub cannot answer; `datasets` is never asked (it would
    retry for ~25 s per dataset). A listening endpoint counts as reachable."""
    import socket

    import datasets

    from rufus_data.models import hub
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    hub.hub_unreachable.cache_clear()
    connects = []
    real_connect = socket.create_connection
    monkeypatch.setattr(hub.socket, "create_connection",
                        lambda address, timeout: connects.append((address, timeout)) or real_connect(address, timeout))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked"))
    with pytest.raises(DatasetUnavailable, match=r"the hub is not reachable here \(127.0.0.1:\d+ cannot be reached"):
        load_rows(DatasetSource(hub=HubDataset(id="org/set", revision="c" * 40)), "source 's'")
    assert connects == [(("127.0.0.1", port), hub.PROBE_TIMEOUT_S)]  # one short connect, no retries
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        hub.hub_unreachable.cache_clear()
        assert hub.hub_unreachable() is None
    hub.hub_unreachable.cache_clear()


def test_offline_set_after_datasets_loaded_still_means_no_network(monkeypatch):
    """HF_HUB_OFFLINE set once `datasets` has read its environment (a notebook, a test session):
    the hub is still never contacted; the dataset fails at once from the cache."""
    import socket

    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as if imported before the variable was set
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", "/nonexistent-rufus-cache")
    connects: list = []

    def record_lookup(host, *args, **kwargs):
        connects.append(host)
        raise socket.gaierror("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", record_lookup)  # every client resolves the host first
    with pytest.raises(DatasetUnavailable, match=r"could not load hub dataset org/never-cached"):
        load_rows(DatasetSource(hub=HubDataset(id="org/never-cached", revision="c" * 40)), "source 's'")
    assert connects == []
    assert datasets.config.HF_HUB_OFFLINE is False and constants.HF_HUB_OFFLINE is False  # restored


def test_transformers_offline_is_offline_as_huggingface_hub_reads_it(monkeypatch):
    """TRANSFORMERS_OFFLINE=1 puts huggingface_hub offline (its HF_HUB_OFFLINE falls back to it), so
    Rufus is offline too: a model outside the cache is refused naming the variable, with no probe of
    the network; HF_HUB_OFFLINE, when set, wins over it, as in huggingface_hub."""
    import socket

    from rufus_data.models import hub
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("the network was probed"))
    assert not hub.offline_mode()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub.offline_mode() and hub.offline_variable() == "TRANSFORMERS_OFFLINE"
    reason = hub.model_unavailable("no-such-org/no-such-model")
    assert reason == "TRANSFORMERS_OFFLINE is set and it is not in the Hugging Face cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # huggingface_hub reads HF_HUB_OFFLINE first when it is set
    assert not hub.offline_mode()


def test_id_ranges_keep_a_split_of_a_larger_file(data_root):
    local = "mbpp_sanitized/sanitized-mbpp.jsonl"
    train = list(load_rows(DatasetSource(local=local, ids=IdRange(field="task_id", outside=(11, 510))), "mbpp").rows)
    test = list(load_rows(DatasetSource(local=local, ids=IdRange(field="task_id", within=(11, 510))), "mbpp").rows)
    assert len(train) == 170 and len(test) == 257
    assert all(r["task_id"] <= 10 or r["task_id"] >= 511 for r in train)
    with pytest.raises(ValueError, match="exactly one of `within"):
        IdRange(field="task_id", within=(1, 2), outside=(3, 4))
    bad = DatasetSource(local=local, ids=IdRange(field="prompt", within=(1, 2)))
    with pytest.raises(RufusError, match=r"`ids` needs integer ids, but 'prompt' is"):
        list(load_rows(bad, "mbpp").rows)


def test_a_row_range_keeps_a_recipes_slice_of_the_file(data_root):
    """`rows: [first, last]`: the rows at those positions (0-based, both kept), as a recipe slices its
    data (Tulu 3 mini: train_rows[192:288] = rows [192, 287]); a range past the end is an error."""
    local = "gsm8k/train.jsonl"
    every = read_jsonl(data_root / local, 290)
    loaded = load_rows(DatasetSource(local=local, rows=(192, 287)), "gsm8k")
    assert [r["question"] for r in loaded.rows] == [r["question"] for r in every[192:288]]
    assert loaded.provenance["rows"] == [192, 287]
    assert [r["question"] for r in load_rows(DatasetSource(local=local, rows=(0, 0)), "gsm8k").rows] == [every[0]["question"]]
    with pytest.raises(RufusError, match=r"gsm8k \(.*train.jsonl\) has 7473 rows, and `rows: \[7000, 8000\]` asks for"):
        list(load_rows(DatasetSource(local=local, rows=(7000, 8000)), "gsm8k").rows)
    assert len(list(load_rows(DatasetSource(local=local, rows=(7000, 7472)), "gsm8k").rows)) == 473  # to the last row
    with pytest.raises(ValueError, match=r"positions \[first, last\] with 0 <= first <= last"):
        DatasetSource(local=local, rows=(5, 4))


def write_catalog(path: Path, source_yaml: str, kind: str = "preference") -> Path:
    path.write_text(f"kind: {kind}\nname: t\nholdout: 0\nsources:\n{source_yaml}")
    return path


def small_root(tmp_path: Path, data_root: Path, rows: int = 40) -> Path:
    root = tmp_path / "root"
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", rows)))
    return root


def test_fallback_with_a_builder_step_is_used_and_recorded(tmp_path, monkeypatch, data_root, builtin_model, hub_offline):
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(small_root(tmp_path, data_root)))
    catalog = write_catalog(tmp_path / "pref.yaml", (
        "  - name: pairs\n    hub: {id: no-such-org/prefs, split: train, revision: " + "b" * 40 + "}\n"
        "    format: preference\n    share: 1.0\n"
        "    fallback: {local: gsm8k/train.jsonl, build: perturbed_answer_pairs, format: preference}\n"))
    result = mix(catalog, tmp_path / "out")
    source = result.manifest["sources"][0]
    assert source["label"] == "gsm8k/train.jsonl"  # the rows say where they came from
    provenance = source["fingerprint"]
    assert provenance["origin"] == "local" and provenance["fallback"]["used"]
    assert "no-such-org/prefs" in provenance["fallback"]["instead_of"] and "could not be loaded" in provenance["fallback"]["why"]
    assert provenance["build"]["step"] == "perturbed_answer_pairs"
    assert provenance["build"]["counts"]["rows_in"] == 40 == provenance["build"]["counts"]["rows_out"]
    rows = read_shards(tmp_path / "out").to_pylist()
    assert len(rows) == 40
    for row in rows:
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        assert chosen != rejected and chosen.rsplit("####", 1)[0] == rejected.rsplit("####", 1)[0]
    # deterministic: the same pairs on a second run
    again = mix(catalog, tmp_path / "again")
    assert read_shards(again.out).to_pylist() == rows


def test_no_fallback_no_rows_and_legacy_keys(tmp_path, hub_offline):
    catalog = write_catalog(tmp_path / "c.yaml", "  - name: s\n    local: nowhere.jsonl\n    share: 1.0\n", "sft")
    with pytest.raises(DatasetUnavailable, match=r"source 's' could not be loaded.*use `path:`"):
        open_source(load_catalog(catalog).sources[0])
    flat = write_catalog(tmp_path / "flat.yaml", "  - name: s\n    hub: org/x\n    split: train_sft\n    share: 1.0\n")
    with pytest.raises(RufusError, match=r"`config`, `split` and `revision` go inside `hub:`"):
        load_catalog(flat)
    unknown = write_catalog(tmp_path / "b.yaml", "  - name: s\n    local: x.jsonl\n    build: nonsense\n    share: 1.0\n")
    with pytest.raises(RufusError, match=r"unknown builder 'nonsense'; the builders are: .*perturbed_answer_pairs"):
        load_catalog(unknown)
    nowhere = write_catalog(tmp_path / "n.yaml", "  - name: s\n    format: alpaca\n    share: 1.0\n")
    with pytest.raises(RufusError, match=r"source 's' needs `path:` \(a file\), `local:`"):
        load_catalog(nowhere)


def test_hub_shaped_folder_feeds_a_catalog(tmp_path, datasets_cache, builtin_model):
    """A catalog source whose hub id is a downloaded copy of a hub repo: the `datasets` code path,
    the config, a joined split and an id range, all offline."""
    folder = hub_shaped_folder(tmp_path)
    catalog = write_catalog(tmp_path / "code.yaml", (
        f"  - name: code\n    hub: {{id: {folder}, config: sanitized, split: train+test+validation}}\n"
        "    ids: {field: task_id, outside: [11, 510]}\n    build: mbpp_task_prompts\n    share: 1.0\n"), "rl")
    result = mix(catalog, tmp_path / "out")
    rows = read_shards(result.out).to_pylist()
    assert sorted(r["task_id"] for r in rows) == [511, 601, 602]  # the test ids 11 and 12 never arrive
    row = next(r for r in rows if r["task_id"] == 601)
    assert row["prompt"][-1]["content"] == "Write a function number 601.\nassert f601() == 601"
    assert row["test_list"] == ["assert f601() == 601"]
    provenance = result.manifest["sources"][0]["fingerprint"]
    assert provenance["origin"] == "hub" and provenance["ids"] == "task_id outside [11, 510]"
    several = IdRange(field="task_id", outside=[[11, 510], [569, 569]])
    assert [several.keeps(i) for i in (10, 11, 568, 569, 570)] == [True, False, True, False, True]


def test_hh_transcripts_become_rl_prompts(tmp_path, data_root, builtin_model):
    catalog = write_catalog(tmp_path / "hh.yaml", (
        f"  - name: hh\n    path: {data_root / 'hh_rlhf_harmless_base' / 'test.jsonl'}\n"
        "    format: prompt_only\n    fields: {prompt: chosen}\n    share: 1.0\n"), "rl")
    result = mix(catalog, tmp_path / "out")
    rows = read_shards(result.out).to_pylist()
    assert len(rows) == 2312
    assert all(r["prompt"][-1]["role"] == "user" and r["expected_output"] is None for r in rows)
    first = read_jsonl(data_root / "hh_rlhf_harmless_base" / "test.jsonl", 1)[0]["chosen"]
    row0 = next(r for r in rows if r["id"] == "hh-0")
    assert row0["prompt"][0]["content"] in first and "Assistant:" not in row0["prompt"][-1]["content"]
