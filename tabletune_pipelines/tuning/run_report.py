"""The run report, "what was measured": the one rendering of a published table that ``tabletune run``
prints after publishing, ``tabletune show`` prints for the deployment's file and the UI shows as the
``published_table`` metadata ``what_was_measured`` (``measured_lines``). It gives the table, the
engine it was measured on, the measured acceptance per position with its interval and the mix of the
sample it was measured on, the predicted loss and what serving the docs' table instead would cost
(docs/method.md, "How a table is judged"), the batch sizes where k are tied or undecided, the
changes of k the profile did not measure where (``boundary_lines``), and the served verification's
verdict per load.

The docs' table is vLLM's documented example (``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]``, the
shape the project's GPU runs compare against), cut to the deployment's ``max_num_seqs`` and K.
Its cost is the goodput ratio G(published table) / G(docs' table) at every batch size, from the
same profile and prior the table was derived from (``tuning.derive.derive_table``), with the
standard error of that ratio from the evidence search's ``log_sd`` (step-time errors, their
correlation between k, the prior's count error): ratio · sd(log ratio). Where both tables run the
same k the ratio is exactly 1.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import TableTuneError

if TYPE_CHECKING:
    from tabletune_pipelines.formats.fleet import Deployment
    from tabletune_pipelines.formats.published_schema import PublishedTable

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
class TableComparison:
    """One table's predicted goodput against another's on one profile, per batch size."""

    other: list[list[int]]
    """The table compared against (the docs' table in ``compare_to_docs``)."""
    ratio: np.ndarray
    """G(table) / G(the other table) per batch size 1..N."""
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


def compare_tables(evidence, ks: Sequence[int], table: Sequence[Sequence[int]], other: Sequence[Sequence[int]],
                   max_num_seqs: int) -> TableComparison:
    """``table``'s goodput over ``other``'s per batch size, from ``evidence``: the ``EvidenceTable`` of
    ``derive_table`` (its ``log_ratio`` and ``log_sd``, (K, K, N)) on one profile and prior."""
    ks = [int(k) for k in ks]
    mine = DraftTable.from_entries([list(r) for r in table]).dense(max_num_seqs).tolist()
    theirs = DraftTable.from_entries([list(r) for r in other]).dense(max_num_seqs).tolist()
    lr, ls = np.asarray(evidence.log_ratio), np.asarray(evidence.log_sd)
    ratio, sd = np.ones(max_num_seqs), np.zeros(max_num_seqs)
    for b in range(max_num_seqs):
        if mine[b] == theirs[b]:
            continue
        i, j = ks.index(mine[b]), ks.index(theirs[b])
        ratio[b] = math.exp(float(lr[i, j, b]))
        sd[b] = ratio[b] * float(ls[i, j, b])
    return TableComparison([list(r) for r in other], ratio, sd)


def compare_to_docs(evidence, ks: Sequence[int], table: Sequence[Sequence[int]], max_num_seqs: int,
                    max_k: int) -> TableComparison:
    """``compare_tables`` against the docs' table (``docs_table``)."""
    return compare_tables(evidence, ks, table, docs_table(max_num_seqs, max_k), max_num_seqs)


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
        keys: list[tuple[int, tuple[int, ...]] | None] = [None] * len(ties)
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


def boundary_lines(evidence, ks: Sequence[int], table: Sequence[Sequence[int]], measured: Sequence[int],
                   max_num_seqs: int) -> list[str]:
    """Where the table changes k between two measured batch sizes with unmeasured ones between them
    (the adaptive plan measures a few batch sizes and bisects only where its budget lets it): the
    change could sit anywhere in that gap, and a run that measures it may put it elsewhere. Per gap,
    the goodput of each other placement of one change from the gap's left k to its right k, over
    this table's (``compare_tables``: the profile's interpolation between the measured batch sizes),
    its range and its largest s.e. Nothing when every change sits between measured neighbours."""
    n = max_num_seqs
    dense = DraftTable.from_entries([list(r) for r in table]).dense(n).tolist()
    points = sorted({int(b) for b in measured if 1 <= int(b) <= n} | {1, n})
    parts = []
    for lo, hi in zip(points, points[1:], strict=False):
        if hi - lo < 2 or all(dense[b - 1] == dense[lo - 1] for b in range(lo, hi + 1)):
            continue
        left, right = dense[lo - 1], dense[hi - 1]
        ratios, sds = [], []
        for c in range(lo, hi):  # k = left up to c, k = right from c + 1 on (within the gap)
            other = list(dense)
            other[lo:hi - 1] = [left if b <= c else right for b in range(lo + 1, hi)]
            if other == dense:
                continue
            cmp = compare_tables(evidence, ks, DraftTable.from_dense(other).entries(), table, n)
            ratios.append(cmp.mean)
            sds.append(cmp.mean_sd)
        changes = [b for b in range(lo, hi) if dense[b - 1] != dense[b]]
        at = ", ".join(f"{b}/{b + 1}" for b in changes)
        span = (f"the other placements predict {min(ratios):.3f}-{max(ratios):.3f} of this table's goodput "
                f"(s.e. up to {max(sds):.3f})" if ratios else "no other placement of one change")
        parts.append(f"B = {lo + 1}-{hi - 1} (k {left} at B = {lo}, k {right} at B = {hi}; this table changes "
                     f"at {at}): {span}")
    if not parts:
        return []
    return ["  not measured where k changes (a run that measures these batch sizes may place the change "
            "elsewhere): " + "; ".join(parts)]


def no_verdict_lines(section: dict | None) -> list[str]:
    """What the served verification could not decide, for the top of a summary (before the table):
    the loads left without a verdict and what stopped their rounds, and the loads where the sizing
    from the profile expected none (``served_plan.size_verification``). Empty when every load
    reached a verdict, or when there is no verification section."""
    if not isinstance(section, dict):
        return []
    rows = [r for r in section.get("per_load") or [] if isinstance(r, dict) and r.get("status") == "inconclusive"]
    if not rows:
        return []
    why = {"budget": "stopped by the budget", "rounds": "the most rounds spent", "decided": "decided"}
    loads = ", ".join(f"{r.get('load')} ({why.get(str(r.get('stop')), 'not reached')}, {r.get('rounds')} paired "
                      f"round(s))" for r in rows)
    budget = section.get("budget_s")
    lines = [f"served verification reached NO VERDICT at load {loads}"
             + (f" within its {budget:g} s budget" if isinstance(budget, (int, float)) else "")
             + ": the table below is unverified there"]
    lines += [f"  expected before measuring: {line}" for line in section.get("no_verdict_expected") or []
              if isinstance(line, str)]
    return lines


# -- the run report -------------------------------------------------------------------------------

def measured_lines(pub: PublishedTable, dep: Deployment, store: Any, *, sample_seed: int = 0) -> list[str]:
    """What was measured for the published table ``pub`` at ``dep``'s path: the no-verdict notes
    (``no_verdict_lines``), then one block per figure (table, engine, prior with its intervals and
    its sample's mix, predicted loss against the best fixed k and the docs' table, ties, served
    verdict, file). ``store``: the store the table was built from (read only), or a sentence saying
    why there is none (each figure that needs it says so). ``sample_seed``: the acceptance
    measurement's seed, which picks the sample whose mix is named. The same lines for ``run``,
    ``show`` and the UI."""
    from tabletune_pipelines.tuning.report import ranges_line

    lines = [f"NOTE: {n}" if not n.startswith(" ") else f"     {n}" for n in no_verdict_lines(pub.served_verification)]
    lines.append(f"  table       {ranges_line(pub.ranges)}   (K = {pub.max_k}, max_num_seqs = {pub.max_num_seqs})")
    lines += _context_lines(pub)
    lines.append(f"  engine      {_identity_line(pub)}")
    lines.append(f"              key {pub.identity_key}")
    lines += _prior_lines(pub, dep, store, sample_seed)
    lines += _loss_lines(pub, store)
    lines += _served_lines(pub, dep)
    lines.append(f"  file        {dep.published_table}")
    return lines


def served_verdict(section: dict | None) -> tuple[str, list[str]]:
    """The served verification's verdict and one line per load, in the document's words: ``verified``
    (every load passed), ``unverified`` (none failed, some reached no verdict), ``failed``; ``not
    verified yet`` when the file carries no verification. The ``verdict`` a section states is taken
    as it is; a section without one (written before it existed) is judged from its loads."""
    if section is None:
        return "not verified yet", []
    per_load = [r for r in section.get("per_load") or [] if isinstance(r, dict)]
    lines = []
    for r in per_load:
        ratio, se, best = r.get("ratio"), r.get("ratio_se"), r.get("best_fixed_k")
        figure = ("" if ratio is None else f": table / best fixed k{'' if best is None else f' (k={best})'} = "
                  f"{ratio:.3f}" + ("" if se is None else f" ± {se:.3f}"))
        ran = r.get("rounds")
        done = ("" if not isinstance(ran, int) else
                f" ({ran} paired round(s){', stopped by the budget' if r.get('stop') == 'budget' else ''})")
        same = r.get("candidate_is")
        aa = f"; the table is {same} here, judged against the other fixed k" if isinstance(same, str) else ""
        refs = []
        for name, ref in (r.get("references") or {}).items():
            if not isinstance(ref, dict):
                continue
            if ref.get("same_as") == "table":
                refs.append(f"vs {name}: A/A (the same k here)")
            elif isinstance(ref.get("ratio"), (int, float)):
                rse = ref.get("ratio_se")
                se = f" ± {rse:.3f}" if isinstance(rse, (int, float)) else ""
                refs.append(f"vs {name}: {ref['ratio']:.3f}{se} ({ref.get('rounds')} paired round(s))")
        mb = r.get("mean_batch")
        batch = f" (mean batch {mb:.1f})" if isinstance(mb, (int, float)) else ""
        lines.append(f"load {r.get('load')}{batch}: {r.get('status')}{figure}{done}{aa}"
                     + "".join(f"; {x}" for x in refs))
    stated = section.get("verdict")
    if isinstance(stated, str) and stated:
        return stated, lines
    if not section.get("passed"):
        return "failed", lines
    if not per_load or any(r.get("status") != "pass" for r in per_load):
        return "unverified", lines
    return "verified", lines


def _served_lines(pub: PublishedTable, dep: Deployment) -> list[str]:
    verdict, per_load = served_verdict(pub.served_verification)
    sv = pub.served_verification or {}
    open_loads = [r.get("load") for r in sv.get("per_load") or [] if r.get("status") == "inconclusive"]
    if open_loads and verdict != "failed":
        verdict += f": no verdict at load {', '.join(map(str, open_loads))}"
    lines = [f"  served      {verdict}"]
    if sv:
        cut = (f"; the {sv['budget_s']:g} s budget cut it short"
               if sv.get("budget_cut") and isinstance(sv.get("budget_s"), (int, float)) else "")
        per = sv.get("requests_per_client")
        window = (f"windows of {per} request(s) a client (~{sv.get('window_s')} s at the largest load)"
                  if sv.get("window") == "requests" and isinstance(per, int) else f"{sv.get('window_s')} s")
        lines.append(f"              up to {sv.get('rounds')} round(s) of {window} per policy at load "
                     f"{', '.join(map(str, sv.get('loads') or []))} on {sv.get('device') or '?'}, acceptance "
                     f"{sv.get('acceptance') or '?'}{cut}")
    lines += [f"              {line}" for line in per_load]
    if sv.get("plot"):
        lines.append(f"              plot {dep.published_table.parent / sv['plot']}")
    return lines


def _context_lines(pub: PublishedTable) -> list[str]:
    """The (B, ctx) grid of a file whose table has a context axis (``table.context_entries``): rows
    are batch-size ranges, columns context buckets, cells k; none for a batch-only table."""
    from tabletune_pipelines.tuning.report import context_grid_lines

    table = pub.document.get("table") or {}
    entries = table.get("context_entries")
    if not entries:
        return []
    try:
        full = DraftTable.from_entries(entries, max_num_seqs=pub.max_num_seqs, max_k=pub.max_k, allow_context=True)
    except TableTuneError as exc:
        return [f"  (B, ctx)    table.context_entries cannot be read: {exc}"]
    head = (f"  (B, ctx)    k by batch size and context (a step's context: the {table.get('ctx_agg', 'mean')} over "
            "its requests); the line above is the batch-only table for an engine without 5-item entries")
    cols = pub.context_columns
    tail = ("              the controller serves it as published (the file carries no context_columns)" if cols is None
            else "              the controller corrects each bucket from its own level: " + "; ".join(
                f"{c.ctx[0]}-{c.ctx[1]} from {c.level} tokens, a = {', '.join(f'{a:.3f}' for a in c.acceptance_rates)}"
                + (" (pooled)" if c.pooled else "") for c in cols))
    return [head, *(f"              {line}" for line in context_grid_lines(full)), tail]


def _identity_line(pub: PublishedTable) -> str:
    i = pub.identity
    if not i:
        return "not recorded"
    parts = [str(i.get("gpu", "?")), f"vLLM {i.get('vllm_version', '?')}", str(i.get("model", "?"))]
    if i.get("drafter"):
        parts.append(f"drafter {i['drafter']}")
    parts.append(str(i.get("method", "?")))
    parts += [f"{name} {i[name]}" for name in ("dtype", "cudagraph_mode") if i.get(name)]
    return " · ".join(parts)


def _prior_lines(pub: PublishedTable, dep: Deployment, store: Any, sample_seed: int) -> list[str]:
    """a_i with their 95 % (Wilson) intervals from the file's counts; the sample's size, week and mix
    from the store's copy of the prior when the store holds it."""
    from tabletune_pipelines.core.acceptance_ci import prior_intervals

    p = pub.prior
    head = f"  prior       {p.prior_id or '?'} ({p.source or 'source not recorded'})"
    stored = None
    if not isinstance(store, str) and p.prior_id:
        with contextlib.suppress(TableTuneError, KeyError):
            stored = store.acceptance_prior(p.prior_id)
    if stored is not None:
        head += (f": {stored.prompt_count} prompts, {stored.num_drafts} drafts, "
                 + (f"week of {stored.week}" if stored.week else "no week (ad hoc)"))
    else:
        head += f": {p.num_drafts} drafts" if p.num_drafts else ": counts not recorded"
        head += f"; sample size and date: {store if isinstance(store, str) else 'the store does not hold it'}"
    lines = [head]
    if not p.rates:
        return [*lines, "              no acceptance rates recorded"]
    counted = len(p.drafted_per_pos) >= len(p.rates) and any(p.drafted_per_pos)
    if counted:
        rates = " · ".join(f"a_{i + 1} {iv.value:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]"
                           for i, iv in enumerate(prior_intervals(p)))
        lines.append(f"              {rates}  (95% intervals)")
    else:
        lines.append("              " + " · ".join(f"a_{i + 1} {a:.3f}" for i, a in enumerate(p.rates))
                     + "  (no counts: no intervals)")
    if stored is not None and stored.source == "measured" and stored.week:
        from tabletune_pipelines.formats.prompt_mixes import describe_mix, sample_mix

        prompts = dep.prompts_file(stored.week)
        if prompts.is_file():
            with contextlib.suppress(TableTuneError, OSError, ValueError):
                mix = sample_mix(prompts, dep.max_prompts, sample_seed)
                lines.append(f"              sample: {describe_mix(mix)} (of {prompts})")
    return lines


def _loss_lines(pub: PublishedTable, store: Any) -> list[str]:
    """The predicted worst loss against the best fixed k (the file's evidence), the predicted goodput
    against vLLM docs' example table, the ties and the changes of k between measured batch sizes
    (re-derived from the store's profile and prior, with their errors)."""
    from tabletune_pipelines.core.evidence import ACCEPTED_LOSS

    doc = pub.document

    def number(x: object) -> float | None:  # the evidence section is checked as JSON only: read it with care
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None

    table, ev = doc.get("table") or {}, doc.get("evidence") or {}
    loss = number(table.get("predicted_worst_loss", 0.0)) or 0.0
    lcb, ucb, conf = (number(ev.get(k)) for k in ("predicted_worst_loss_lcb", "predicted_worst_loss_ucb", "confidence"))
    bounds = (f" ({conf:.0%} bounds {lcb or 0.0:.2%}–{ucb:.2%})" if ev.get("has_error_estimates") is True
              and ucb is not None and conf else " (no error estimates)")
    lines = [f"  predicted   worst loss against the best fixed k at any B: {loss:.2%}{bounds}"]
    docs = docs_table(pub.max_num_seqs, pub.max_k)
    vs = f"              against vLLM docs' table {json.dumps(docs)}: "
    derived = _derived(pub, docs, store)
    tuned, measured = derived if not isinstance(derived, str) else (derived, ())
    if _same_dense(pub.ranges, docs, pub.max_num_seqs):
        lines.append(vs + "the same k at every batch size (ratio 1.000)")
    elif isinstance(tuned, str):
        lines.append(vs + f"not computed ({tuned})")
    else:
        cmp = compare_to_docs(tuned.evidence, list(tuned.choice.ks), pub.ranges, pub.max_num_seqs, pub.max_k)
        diff = cmp.differing()
        lo, hi = min(diff, key=lambda b: cmp.ratio[b - 1]), max(diff, key=lambda b: cmp.ratio[b - 1])
        spread = " to ".join(f"{cmp.ratio[b - 1]:.3f} ± {cmp.sd[b - 1]:.3f} (B {b})" for b in dict.fromkeys((lo, hi)))
        lines += [vs + f"goodput ratio {cmp.mean:.3f} ± {cmp.mean_sd:.3f} (this table / the docs', mean over "
                       f"B 1-{pub.max_num_seqs}, ± s.e.)",
                  f"              where the k differ: {spread}; "
                  f"the same k at the other {pub.max_num_seqs - len(diff)} B"]
    if not isinstance(tuned, str):
        lines += ["            " + line for line in tie_lines(tuned.evidence, ACCEPTED_LOSS)]
        lines += ["            " + line for line in boundary_lines(tuned.evidence, list(tuned.choice.ks), pub.ranges,
                                                                   measured, pub.max_num_seqs)]
    return lines


def _same_dense(ranges: Sequence[Sequence[int]], docs: list[list[int]], n: int) -> bool:
    return not DraftTable.from_entries([list(r) for r in ranges]).diff(DraftTable.from_entries(docs), n)


def _derived(pub: PublishedTable, docs: list[list[int]], store: Any) -> Any:
    """The table's profile and prior in the store, derived again (``derive_table``: its evidence
    prices the docs' comparison and the ties), with the batch sizes the profile measured at every k,
    or why not."""
    if isinstance(store, str):
        return store
    from tabletune_pipelines.tuning.derive import derive_table

    try:
        prior = store.acceptance_prior(pub.prior.prior_id or "")
        profile = store.load_profile(pub.identity_key)
        tuned = derive_table(profile, prior)
    except (TableTuneError, KeyError) as exc:
        first = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).splitlines()[0]
        return f"the store at {store.path} lacks the table's profile or prior: {first}"
    except (ValueError, ArithmeticError) as exc:  # numpy's LinAlgError is a ValueError
        return f"the table's profile and prior do not derive here: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    if tuned.evidence is None:
        return "the profile has no error estimates"
    missing = sorted({k for _, _, k in [*pub.ranges, *docs]} - set(tuned.choice.ks))
    if missing:
        return f"the stored profile has no k = {missing}"
    cells = profile.estimates("reject")
    measured = tuple(sorted(set.intersection(*(set(by_b) for by_b in cells.values())))) if cells else ()
    return tuned, measured
