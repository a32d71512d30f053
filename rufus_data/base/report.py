"""Small helpers for what a person reads first: markdown tables and matplotlib figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pyplot():
    """matplotlib.pyplot on the file-only backend (no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(path: Path, labels: Sequence[str], series: dict[str, Sequence[float]], title: str, ylabel: str) -> None:
    """Grouped bars, one group per label, one bar per series (e.g. requested vs realised share)."""
    plt = pyplot()
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) + 2), 3.8))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, values, width=width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
