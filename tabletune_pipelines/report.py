"""Human-readable views of a tuned table: markdown and a goodput-vs-batch-size plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabletune_pipelines.tuning import TunedTable


def ranges_markdown(ranges: Sequence[Sequence[int]]) -> str:
    lines = ["| batch sizes | k |", "|---|---|"]
    lines += [f"| {s}–{e} | {k} |" for s, e, k in ranges]
    return "\n".join(lines)


def goodput_markdown(tuned: TunedTable, batch_sizes: Sequence[int] | None = None) -> str:
    """One row per batch size: predicted step time and goodput per k, and the chosen k."""
    choice = tuned.choice
    n = len(choice.chosen)
    rows = batch_sizes or sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, n} & set(range(1, n + 1)))
    head = ["B"] + [f"T k={k} (ms)" for k in choice.ks] + [f"G k={k} (tok/s)" for k in choice.ks] + ["chosen k"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in rows:
        t = [f"{tuned.step_ms_dense[i, b - 1]:.2f}" for i in range(len(choice.ks))]
        g = [f"{choice.goodput[i, b - 1]:.0f}" for i in range(len(choice.ks))]
        lines.append("| " + " | ".join([str(b), *t, *g, str(choice.chosen[b - 1])]) + " |")
    return "\n".join(lines)


def plot_goodput(tuned: TunedTable, path: str | Path, title: str = "") -> Path:
    """PNG of predicted goodput vs batch size, one line per k, the chosen k marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    choice = tuned.choice
    b = list(range(1, len(choice.chosen) + 1))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, k in enumerate(choice.ks):
        ax.plot(b, choice.goodput[i], label=f"k = {k}", linewidth=1.5)
    chosen_g = [choice.goodput[choice.ks.index(k), j] for j, k in enumerate(choice.chosen)]
    ax.plot(b, chosen_g, "k:", linewidth=2.5, label="tuned table")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("predicted goodput (tokens/s)")
    ax.set_title(title or "Predicted goodput per draft length")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
