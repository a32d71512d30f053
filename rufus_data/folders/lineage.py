"""The lineage of a run's data, and whether that data was checked against a benchmark.

Each shard folder a run trains on is followed back through the manifests that made it (mix ->
decontam -> dedup -> filter, in whatever order they ran): one node per folder with its command,
config hash and fingerprint (the sha256 of each shard file), and the folders it was made from.
A step's manifest records the fingerprint of what it read (shards.folder_fingerprint), so an
input folder counts as that step's input only while its files still hash the same
(`on_disk: same`); one that changed or is gone ends the chain there, and nothing read beyond it
is trusted. A decontam node records, per benchmark it checked, the rows it removed.

A run's lineage (run_folder.py stores it) holds its data entries and its base model; a base
that is itself a run folder (a pipeline's earlier stage) is included by reference, and
`check_against` follows it: a model was checked against a benchmark only when every row of
every stage's data passed a decontam step that checked that benchmark."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

from rufus_data.folders.run_folder import read_lineage, run_of
from rufus_data.folders.shards import DATA_DIR, file_sha256, folder_fingerprint, read_manifest, shard_files

LINEAGE_VERSION = 1
DECONTAM = "rufus-data decontam"
MIX = "rufus-data mix"
CONTAMINATED = "contaminated.parquet"  # decontam's record of the rows it removed


# --- building ---------------------------------------------------------------------------------
def folder_lineage(folder: str | Path, recorded: dict | None = None) -> dict:
    """The node of a shard folder and, through its manifest's inputs, of the folders it was made
    from. `recorded`: the input as its consumer's manifest holds it (path, files, maybe the
    catalog the consumer mixed it from); None for the folder a run reads now, fingerprinted here."""
    folder = Path(folder)
    node: dict = {"path": str(folder.resolve()) if folder.exists() else str(folder)}
    if recorded is None:
        node["fingerprint"] = folder_fingerprint(folder, shard_files(folder))["files"]
    else:
        node["fingerprint"] = recorded.get("files", {})
        node["on_disk"] = on_disk_state(folder, node["fingerprint"])
        if recorded.get("catalog"):  # mixed by the consumer itself (filter, pairs), then removed
            node["catalog"] = recorded["catalog"]
        if node["on_disk"] != "same":
            return node
    manifest = read_manifest(folder)
    node["command"] = manifest.get("command")
    if not manifest:
        return node
    node["config_hash"] = manifest.get("config_hash")
    if manifest.get("catalog"):
        node["catalog"] = manifest["catalog"]
    if node["command"] == DECONTAM:
        node["checked"] = decontam_checks(folder, manifest)
    inputs = manifest.get("inputs") or []
    node["inputs"] = [folder_lineage(locate(item["path"], folder), item) for item in inputs
                      if "files" in item and "path" in item]
    if node["command"] == MIX:
        node["sources"] = [item for item in inputs if "source" in item]
    return node


def locate(recorded: str, consumer: Path) -> Path:
    """An input path as a manifest records it (as typed: relative to where that command ran):
    from here, else from a folder above its consumer (`outputs/mix` beside `outputs/clean`); the
    fingerprint check decides whether what is found is the folder that was read."""
    path = Path(recorded)
    if path.is_absolute() or path.exists():
        return path
    return next((above / path for above in consumer.resolve().parents if (above / path).is_dir()), path)


def on_disk_state(folder: Path, files: dict[str, str]) -> str:
    """`same` when every recorded shard file is there with its recorded sha256, else `changed`
    (`missing`: the folder is gone)."""
    if not folder.is_dir():
        return "missing"
    for name, digest in files.items():
        path = folder / DATA_DIR / name
        if not path.is_file() or file_sha256(path) != digest:
            return "changed"
    return "same"


def decontam_checks(folder: Path, manifest: dict) -> dict:
    """What a decontam step checked: rows removed per benchmark, the suites named, and what it
    could not check. Manifests from before `rows_dropped_by_benchmark` are counted from the
    step's contaminated.parquet."""
    removed = manifest.get("rows_dropped_by_benchmark")
    if removed is None:
        removed = {name: 0 for name in manifest.get("benchmarks") or {}}
        if (folder / CONTAMINATED).is_file():
            hits = pq.read_table(folder / CONTAMINATED, columns=["benchmark", "row"]).to_pylist()
            for name in removed:
                removed[name] = len({hit["row"] for hit in hits if hit["benchmark"] == name})
    return {"benchmarks": removed, "against": manifest.get("against") or [],
            "against_suites": manifest.get("against_suites") or [], "not_checked": manifest.get("not_decontaminable") or {}}


def run_lineage(data: list[dict], base_model: str) -> dict:
    """A run's lineage: its data entries (each {entry, name, catalog, shipped, folder: node}) and
    its base model; a base that is a run folder is named with the hash of its own lineage."""
    base_run = run_of(base_model)
    base: dict = {"model": base_model, "run": str(base_run) if base_run else None}
    if base_run is not None:
        recorded = read_lineage(base_run)
        base["lineage_sha256"] = None if recorded is None else lineage_hash(recorded)
    return {"version": LINEAGE_VERSION, "data": data, "base": base}


def lineage_hash(lineage: dict) -> str:
    return hashlib.sha256(json.dumps(lineage, sort_keys=True, default=str).encode()).hexdigest()


# --- reading ----------------------------------------------------------------------------------
def decontam_steps(node: dict) -> list[dict]:
    """The decontam nodes of a folder's lineage, nearest first, as far as the chain is trusted."""
    found = [node] if node.get("checked") else []
    for item in node.get("inputs") or []:
        if item.get("on_disk", "same") == "same":
            found += decontam_steps(item)
    return found


def unchecked_reason(node: dict, benchmark: str) -> str | None:
    """Why some rows of the folder were never checked against `benchmark`; None when every row
    was (a decontam step on each path back to the sources checked it)."""
    if benchmark in ((node.get("checked") or {}).get("benchmarks") or {}):
        return None
    state = node.get("on_disk", "same")
    if state == "missing" and node.get("catalog"):
        return (f"the catalog {node['catalog']['path']} was mixed by the step that read it (filter, pairs) and never "
                f"decontaminated")
    if state != "same":
        return (f"{node['path']} {'is gone' if state == 'missing' else 'has changed'} since the next step read it: "
                "nothing says it was decontaminated")
    inputs = node.get("inputs") or []
    if not inputs:
        if node.get("command") == MIX:
            where = f" from {node['catalog']['path']}" if node.get("catalog") else ""
            return f"{node['path']} (mixed{where}) reached training without a decontam step that checked {benchmark}"
        return f"{node['path']} has no manifest naming its inputs: nothing says it was decontaminated"
    return next((why for why in (unchecked_reason(item, benchmark) for item in inputs) if why), None)


def rows_removed(node: dict, benchmark: str) -> int:
    """Rows removed for `benchmark` by every decontam step in the folder's trusted lineage."""
    return sum(int((step["checked"]["benchmarks"] or {}).get(benchmark) or 0) for step in decontam_steps(node))


def checked_benchmarks(node: dict) -> dict[str, int]:
    """Benchmark -> rows removed, for each benchmark every row of the folder was checked against."""
    names = {name for step in decontam_steps(node) for name in step["checked"]["benchmarks"]}
    return {name: rows_removed(node, name) for name in sorted(names) if unchecked_reason(node, name) is None}


def chain_text(node: dict) -> str:
    """`filter <- decontam (against quick) <- mix catalogs/x.yaml`: the steps, nearest first."""
    command = (node.get("command") or "no manifest").removeprefix("rufus-data ")
    if node.get("checked"):
        named = dict.fromkeys(node["checked"]["against"] + node["checked"]["against_suites"])  # a suite may be both
        command += f" (against {', '.join(named) or '?'})"
    if node.get("command") == MIX and node.get("catalog"):
        command += f" {node['catalog']['path']}"
    if node.get("on_disk", "same") != "same":
        mixed_there = node["on_disk"] == "missing" and node.get("catalog")
        command = f"mix {node['catalog']['path']}" if mixed_there else f"{node['path']} ({node['on_disk']})"
    inputs = [chain_text(item) for item in node.get("inputs") or []]
    if not inputs:
        return command
    return f"{command} <- " + (inputs[0] if len(inputs) == 1 else "[" + " + ".join(inputs) + "]")


def rows_text(rows: int) -> str:
    return f"{rows:,} row{'' if rows == 1 else 's'}"


@dataclass
class DataCheck:
    """Whether a model's training data was checked against one benchmark."""

    status: str  # clean | removed | not_checked | no_training_data
    rows_removed: int | None = None
    why: str = ""

    @property
    def flagged(self) -> bool:
        """Scored on a benchmark its training data was never checked against."""
        return self.status == "not_checked"

    @property
    def text(self) -> str:
        return {"clean": "checked: clean", "removed": f"checked: {rows_text(self.rows_removed or 0)} removed",
                "not_checked": "NOT CHECKED", "no_training_data": "no training data"}[self.status]

    def as_dict(self) -> dict:
        return asdict(self)


NO_RUN = DataCheck("no_training_data", why="not a Rufus run (a base model): no training data to check")


def check_against(run: Path | None, benchmark: str) -> DataCheck:
    """Was every row this model trained on (its run's data and that of the runs below it) checked
    against `benchmark`? With how many rows the checks removed."""
    if run is None:
        return NO_RUN
    removed, seen, expected = 0, set(), None  # expected: the lineage hash the run above recorded
    while run is not None and run not in seen:
        seen.add(run)
        lineage = read_lineage(run)
        if lineage is None:
            return DataCheck("not_checked", why=f"the run {run} recorded no data lineage (trained before Rufus recorded "
                                                "one): nothing says its data was decontaminated")
        if expected is not None and lineage_hash(lineage) != expected:
            return DataCheck("not_checked", why=f"the run {run} was trained again after the next stage started from it: "
                                                "its lineage is not the one that stage trained on")
        for entry in lineage["data"]:
            why = unchecked_reason(entry["folder"], benchmark)
            if why:
                return DataCheck("not_checked", why=f"data {entry['name']} of the run {run}: {why}")
            removed += rows_removed(entry["folder"], benchmark)
        base = lineage.get("base") or {}
        run, expected = (Path(base["run"]), base.get("lineage_sha256")) if base.get("run") else (None, None)
    return DataCheck("removed" if removed else "clean", removed)
