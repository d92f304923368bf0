"""Human-readable views of a tuned table: markdown and a goodput-vs-batch-size plot."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.table import expand_table
from tabletune_pipelines.documents import DraftLengthTable
from tabletune_pipelines.tuning import TunedTable


def table_markdown(ranges: Iterable[Iterable[int]]) -> str:
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


def table_step_and_tau(table: DraftLengthTable) -> tuple[np.ndarray, np.ndarray]:
    """Per B (index B-1): the step time of the table's k and tau of that k."""
    dense_k = expand_table([list(r) for r in table.ranges], table.max_num_seqs, table.max_k)
    taus = tau_curve(table.acceptance_rates)
    t = np.array([table.step_ms[str(k)][str(b)] for b, k in enumerate(dense_k, start=1)])
    tau = np.array([taus[k] for k in dense_k])
    return t, tau


def goodput_plot(table: DraftLengthTable, no_spec_ms: Mapping[int, float] | None, title: str) -> bytes:
    """PNG: goodput vs batch size, one curve per k, the table's choice and no speculation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = tau_curve(table.acceptance_rates)
    b = np.arange(1, table.max_num_seqs + 1)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=90)
    for k in sorted(int(x) for x in table.step_ms):
        t = np.array([table.step_ms[str(k)][str(x)] for x in b])
        ax.plot(b, b * taus[k] / t * 1000.0, label=f"k = {k}", linewidth=1.4)
    t_tab, tau_tab = table_step_and_tau(table)
    ax.plot(b, b * tau_tab / t_tab * 1000.0, "k--", linewidth=2.2, label="table")
    if no_spec_ms:
        xs = sorted(x for x in no_spec_ms if x <= table.max_num_seqs)
        ax.plot(xs, [x / no_spec_ms[x] * 1000.0 for x in xs], ":", color="grey", marker=".", label="no speculation")
    ax.set_xlabel("batch size B (concurrent requests)")
    ax.set_ylabel("goodput (tokens kept / s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
