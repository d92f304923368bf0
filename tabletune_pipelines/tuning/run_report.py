"""What ``tabletune run`` shows a user after publishing: the measured acceptance per position with
its interval and the mix it was measured on, the table, and what serving the docs' table instead
would cost (docs/method.md, "How a table is judged").

The docs' table is vLLM's documented example (``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]``, the
shape the project's GPU runs compare against), cut to the deployment's ``max_num_seqs`` and K.
Its cost is the goodput ratio G(published table) / G(docs' table) at every batch size, from the
same profile and prior the table was derived from (``tuning.derive.derive_table``), with the
standard error of that ratio from the evidence search's ``log_sd`` (step-time errors, their
correlation between k, the prior's count error): ratio · sd(log ratio). Where both tables run the
same k the ratio is exactly 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tabletune_pipelines.core.table import DraftTable

DOCS_EXAMPLE = ((1, 64, 3), (65, 128, 1), (129, 512, 0))


def docs_table(max_num_seqs: int, max_k: int) -> list[list[int]]:
    """The docs' example table cut to ``max_num_seqs`` (the last range extended to it), k capped at K."""
    out: list[list[int]] = []
    for s, e, k in DOCS_EXAMPLE:
        if s > max_num_seqs:
            break
        out.append([s, min(e, max_num_seqs), min(k, max_k)])
    out[-1][1] = max_num_seqs
    return out


@dataclass(frozen=True)
class DocsComparison:
    docs: list[list[int]]
    ratio: np.ndarray
    """G(table) / G(docs' table) per batch size 1..N."""
    sd: np.ndarray
    """Standard error of the ratio per batch size."""

    @property
    def mean(self) -> float:
        return float(self.ratio.mean())

    @property
    def mean_sd(self) -> float:
        """Error of the mean over B, the per-B errors taken as fully correlated (an upper bound)."""
        return float(self.sd.mean())

    def differing(self) -> list[int]:
        return [b + 1 for b in range(len(self.ratio)) if self.sd[b] > 0 or abs(self.ratio[b] - 1.0) > 1e-12]


def compare_to_docs(evidence, ks: Sequence[int], table: Sequence[Sequence[int]], max_num_seqs: int,
                    max_k: int) -> DocsComparison:
    """``evidence``: the ``EvidenceTable`` of ``derive_table`` (its ``log_ratio`` and ``log_sd``, (K, K, N))."""
    ks = [int(k) for k in ks]
    docs = docs_table(max_num_seqs, max_k)
    mine = DraftTable.from_entries([list(r) for r in table]).dense(max_num_seqs).tolist()
    theirs = DraftTable.from_entries(docs).dense(max_num_seqs).tolist()
    lr, ls = np.asarray(evidence.log_ratio), np.asarray(evidence.log_sd)
    ratio, sd = np.ones(max_num_seqs), np.zeros(max_num_seqs)
    for b in range(max_num_seqs):
        if mine[b] == theirs[b]:
            continue
        i, j = ks.index(mine[b]), ks.index(theirs[b])
        ratio[b] = math.exp(float(lr[i, j, b]))
        sd[b] = ratio[b] * float(ls[i, j, b])
    return DocsComparison(docs, ratio, sd)


def comparison_lines(cmp: DocsComparison) -> list[str]:
    diff = cmp.differing()
    lines = [f"  the docs' example table here: {cmp.docs}"]
    if not diff:
        lines.append("  goodput vs the docs' table: the same k at every batch size, ratio 1.000 (nothing to gain or lose)")
        return lines
    per_b = ", ".join(f"B={b}: {cmp.ratio[b - 1]:.3f} ± {cmp.sd[b - 1]:.3f}" for b in diff)
    lines.append(f"  goodput of this table / the docs' table (± standard error, from the profile and prior): {per_b}; "
                 f"the same k elsewhere")
    lines.append(f"  mean over B = 1..{len(cmp.ratio)}: {cmp.mean:.3f} ± {cmp.mean_sd:.3f} "
                 f"(serving the docs' table would cost {100 * (1 - 1 / cmp.mean):.1f}% of goodput at a uniform load)")
    return lines


def tie_lines(evidence, tolerance: float) -> list[str]:
    """The batch sizes where candidate k are tied with the table's k within ``tolerance`` at the
    evidence rule's confidence (``EvidenceTable.ties``), grouped into ranges of equal candidates, and
    those still open (a k could beat the table's by more than ``tolerance``)."""
    ties = evidence.ties(tolerance)
    kinds = sorted(set(ties))
    runs = DraftTable.from_dense([kinds.index(c) for c in ties]).entries()
    groups = [(s, e, kinds[i]) for s, e, i in runs if kinds[i]]
    conf = f"{evidence.confidence:.0%}"
    if not groups:
        lines = [f"  ties: none; at every batch size the table's k is ahead or no k is within {tolerance:.0%} of it"]
    else:
        where = "; ".join(f"B = {s}" + (f"-{e}" if e > s else "") + f": k = {', '.join(map(str, c))}"
                          for s, e, c in groups)
        lines = [f"  tied within {tolerance:.0%} (no k beats the table's by more, at {conf} confidence): {where} "
                 f"(the table's k first); any of them serves as well there, and the table keeps the first"]
    amb = evidence.ambiguous(tolerance)
    if amb:
        keys = [None] * len(ties)
        for a in amb:
            keys[a.batch_size - 1] = (a.chosen_k, a.rivals)
        kinds_open = sorted({k for k in keys if k is not None})
        parts = []
        open_runs = DraftTable.from_dense([kinds_open.index(k) + 1 if k is not None else 0 for k in keys]).entries()
        for s, e, i in open_runs:
            if not i:
                continue
            chosen, rivals = kinds_open[i - 1]
            worst = max(a.priority for a in amb if s <= a.batch_size <= e)
            parts.append(f"B = {s}" + (f"-{e}" if e > s else "") + f": k = {', '.join(map(str, rivals))} could beat "
                         f"the table's k = {chosen} by up to {worst:.1%}")
        lines.append(f"  undecided (beyond {tolerance:.0%} at {conf} confidence): " + "; ".join(parts)
                     + "; the profile cannot tell these apart: any of them may serve as well, and more repetitions "
                       "(or the served verification) would settle it")
    return lines


def no_verdict_lines(section: dict | None) -> list[str]:
    """What the served verification could not decide, for the top of a summary (before the table):
    the loads left without a verdict and what stopped their rounds, and the loads where the sizing
    from the profile expected none (``served_verification.size_verification``). Empty when every load
    reached a verdict, or when there is no verification section."""
    if not isinstance(section, dict):
        return []
    rows = [r for r in section.get("per_load") or [] if isinstance(r, dict) and r.get("status") == "inconclusive"]
    if not rows:
        return []
    why = {"budget": "stopped by the budget", "rounds": "the most rounds spent", "decided": "decided"}
    loads = ", ".join(f"{r.get('load')} ({why.get(r.get('stop'), 'not reached')}, {r.get('rounds')} paired "
                      f"round(s))" for r in rows)
    budget = section.get("budget_s")
    lines = [f"served verification reached NO VERDICT at load {loads}"
             + (f" within its {budget:g} s budget" if isinstance(budget, (int, float)) else "")
             + ": the table below is unverified there"]
    lines += [f"  expected before measuring: {line}" for line in section.get("no_verdict_expected") or []
              if isinstance(line, str)]
    return lines
