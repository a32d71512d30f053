"""Where the test suite's time goes: seconds per test file from pytest's JUnit XML, and before
against after when given a second file (issue #24's closing note).

    python scripts/test_durations.py AFTER.xml [BEFORE.xml] [--tests N] [--markdown]

Write the XML with `pytest --junitxml=FILE`. A test's time there is its setup, call and teardown
together, so a module-scoped fixture counts towards the first test that uses it. Skipped tests
count in `skipped`, not in `tests`."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FileTimes:
    seconds: float = 0.0
    tests: int = 0
    skipped: int = 0
    failed: int = 0
    slowest: list[tuple[float, str]] = field(default_factory=list)


def test_file(classname: str) -> str:
    """tests.test_x (or tests.test_x.TestClass) -> tests/test_x.py."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_") or part == "conftest":
            return "/".join(parts[: i + 1]) + ".py"
    return classname


def read_junit(path: Path) -> tuple[dict[str, FileTimes], float]:
    """Per file: seconds, test counts and each test's time; and the run's wall time."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0.0)) for s in suites)
    files: dict[str, FileTimes] = defaultdict(FileTimes)
    for case in root.iter("testcase"):
        entry = files[test_file(case.get("classname", ""))]
        seconds = float(case.get("time", 0.0))
        entry.seconds += seconds
        if case.find("skipped") is not None:
            entry.skipped += 1
        else:
            entry.tests += 1
            if case.find("failure") is not None or case.find("error") is not None:
                entry.failed += 1
        entry.slowest.append((seconds, case.get("name", "")))
    return dict(files), wall


def row(cells: list[str], widths: list[int], markdown: bool) -> str:
    if markdown:
        return "| " + " | ".join(cells) + " |"
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def table(after: dict[str, FileTimes], before: dict[str, FileTimes] | None, markdown: bool) -> list[list[str]]:
    names = sorted(set(after) | set(before or {}),
                   key=lambda n: -max(after.get(n, FileTimes()).seconds, (before or {}).get(n, FileTimes()).seconds))
    rows = []
    for name in names:
        now = after.get(name, FileTimes())
        cells = [name, str(now.tests), str(now.skipped)]
        if before is not None:
            then = before.get(name, FileTimes())
            cells += [f"{then.seconds:.1f}", f"{now.seconds:.1f}", f"{now.seconds - then.seconds:+.1f}"]
        else:
            cells.append(f"{now.seconds:.1f}")
        if now.failed:
            cells[0] += f" ({now.failed} failed)"
        rows.append(cells)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("after", type=Path, help="JUnit XML of the run to report")
    parser.add_argument("before", type=Path, nargs="?", help="JUnit XML of the baseline run, for before/after columns")
    parser.add_argument("--tests", type=int, default=0, metavar="N", help="also list the N slowest tests of the run")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for an issue's closing note)")
    args = parser.parse_args(argv)

    after, after_wall = read_junit(args.after)
    before, before_wall = read_junit(args.before) if args.before else (None, 0.0)
    header = ["file", "tests", "skipped"] + (["before s", "after s", "change s"] if before is not None else ["seconds"])
    rows = table(after, before, args.markdown)
    total = ["total", str(sum(f.tests for f in after.values())), str(sum(f.skipped for f in after.values()))]
    if before is not None:
        then, now = (sum(f.seconds for f in files.values()) for files in (before, after))
        total += [f"{then:.1f}", f"{now:.1f}", f"{now - then:+.1f}"]
    else:
        total.append(f"{sum(f.seconds for f in after.values()):.1f}")
    widths = [max(len(r[i]) for r in [header, total, *rows]) for i in range(len(header))]
    print(row(header, widths, args.markdown))
    print("|" + "|".join("---" for _ in header) + "|" if args.markdown else "  ".join("-" * w for w in widths))
    for cells in [*rows, total]:
        print(row(cells, widths, args.markdown))
    walls = f"pytest's wall time: {after_wall:.0f} s" + (f" (before: {before_wall:.0f} s)" if before is not None else "")
    print(f"\n{walls}")
    if args.tests:
        slowest = sorted(((s, f"{name}::{test}") for name, f in after.items() for s, test in f.slowest), reverse=True)
        print(f"\nslowest {args.tests} tests:")
        for seconds, test in slowest[: args.tests]:
            print(f"{seconds:8.1f}  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
