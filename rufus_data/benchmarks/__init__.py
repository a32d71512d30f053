"""Benchmarks: the eval sets, their rows and the suites that score them, in one place below eval.
rufus-eval scores these rows and `rufus-data decontam` checks training data against the same
rows, so what is checked is what is evaluated (rufus_data never imports rufus_eval).

    registry.py  catalogs/benchmarks.yaml: each set, where its rows load from, its fields
    suite.py     the schema of a suite YAML (catalogs/suites/): tasks, scorers, sampling
    rows.py      a benchmark's rows: loaded path -> local -> hub (or the BFCL wheel), converted
    convert.py   what is done to hub rows before a task reads them (LiveCodeBench, GPQA, MixEval)
    bfcl.py      BFCL's rows, read from the bfcl-eval wheel
    pull.py      `rufus-eval data pull`: a suite's data into a folder for offline machines
    against.py   what decontam's `--against NAME` names: benchmarks, sets, suites
    items.py     decontam's view of the rows: each item's id, problem and answer texts

Running a suite (lm-eval task configs, backends, results) stays in rufus_eval."""

from rufus_data.benchmarks.items import EvalItem, LoadedBenchmarks, load_benchmarks
from rufus_data.benchmarks.registry import load_registry

__all__ = ["EvalItem", "LoadedBenchmarks", "load_benchmarks", "load_registry"]
