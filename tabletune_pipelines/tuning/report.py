"""Human-readable views of the documents: markdown tables and a goodput-vs-batch-size plot.

Plain strings and PNG bytes; the Dagster layer and the CLI decide where they are shown.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeProfile
from tabletune_pipelines.tuning.derive import TunedTable, table_step_and_tau


def table_markdown(ranges: Iterable[Iterable[int]]) -> str:
    """The table's ranges, one row per range."""
    lines = ["| batch sizes | k |", "|---|---|"]
    lines += [f"| {s}–{e} | {k} |" for s, e, k in ranges]
    return "\n".join(lines)


def identity_markdown(identity: EngineIdentity) -> str:
    """Every field of an engine identity, and its key."""
    body = identity.to_dict()
    lines = ["| field | value |", "|---|---|", f"| key | `{identity.key}` |"]
    for k in ("gpu", "vllm_version", "model", "drafter", "method", "max_k", "max_num_seqs", "dtype", "cudagraph_mode"):
        lines.append(f"| {k} | {body[k]} |")
    return "\n".join(lines)


def profile_markdown(profile: StepTimeProfile) -> str:
    """Step time per B (rows) and k (columns), every draft rejected, plus the no-speculation baseline."""
    reject = profile.reject_cells()
    ns = profile.no_spec_ms()
    ks = sorted(reject)
    bs = sorted({b for v in reject.values() for b in v} | set(ns))
    rows = ["| B | " + " | ".join(f"k={k}" for k in ks) + " | no-spec |", "|---" * (len(ks) + 2) + "|"]
    for b in bs:
        rows.append(f"| {b} | " + " | ".join(f"{reject[k].get(b, float('nan')):.2f}" for k in ks)
                    + f" | {ns.get(b, float('nan')):.2f} |")
    return "\n".join(rows)


def priors_markdown(priors: Iterable[tuple[str, AcceptancePrior]]) -> str:
    """One row per (deployment, prior): id, rates, drafts and prompts behind them."""
    rows = ["| deployment | prior | a_1..a_K | drafts | prompts |", "|---|---|---|---|---|"]
    for name, prior in priors:
        rows.append(f"| {name} | `{prior.prior_id}` | {[round(a, 3) for a in prior.rates]} | {prior.num_drafts} | "
                    f"{prior.prompt_count} |")
    return "\n".join(rows)


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
