"""Human-readable views of the documents: markdown tables and a goodput-vs-batch-size plot.

Plain strings and PNG bytes; the Dagster layer and the CLI decide where they are shown.
``write_plot`` writes a plot where the CLI's ``--plot`` says, if what is there is TableTune's.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.errors import PlotTargetError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeProfile
from tabletune_pipelines.formats.strict_io import atomic_write_bytes, not_a_write_target
from tabletune_pipelines.tuning.derive import TunedTable, table_step_and_tau


def table_markdown(ranges: Iterable[Iterable[int]]) -> str:
    """The table's ranges, one row per range."""
    lines = ["| batch sizes | k |", "|---|---|"]
    lines += [f"| {s}–{e} | {k} |" for s, e, k in ranges]
    return "\n".join(lines)


def ranges_line(ranges: Iterable[Iterable[int]]) -> str:
    """The table's ranges on one line: ``B 1-16: k=3 · 17-64: k=2 · 65-128: k=1``."""
    parts = [f"{s}-{e}: k={k}" if s != e else f"{s}: k={k}" for s, e, k in ranges]
    return "B " + " · ".join(parts)


def context_grid_lines(table: DraftTable) -> list[str]:
    """A table with a context axis as a grid: one row per batch-size range, one column per context
    bucket, each cell its k (``B \\ ctx | 1-1024 | 1025-8192``); a table without one is a one-column
    grid under ``every ctx``."""
    heads = ["every ctx"] if table.axes.context is None else [f"{lo}-{hi}" for lo, hi in table.axes.context]
    rows = [[f"{lo}-{hi}" if lo != hi else f"{lo}", *(str(k) for k in ks)]
            for (lo, hi), ks in zip(table.axes.batch, table.ks, strict=True)]
    grid = [["B \\ ctx", *heads], *rows]
    widths = [max(len(r[j]) for r in grid) for j in range(len(grid[0]))]
    return [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in grid]


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
    """One row per batch size: predicted step time (± its standard error) and goodput per k, the
    chosen k and the k within noise of it."""
    choice = tuned.choice
    n = len(choice.chosen)
    rows = batch_sizes or sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, n} & set(range(1, n + 1)))
    within = tuned.evidence.within_noise() if tuned.evidence is not None else None
    sd = tuned.step_ms_sd if tuned.step_ms_sd is not None and np.any(tuned.step_ms_sd > 0) else None
    head = (["B"] + [f"T k={k} (ms)" for k in choice.ks] + [f"G k={k} (tok/s)" for k in choice.ks] + ["chosen k"]
            + (["k within noise"] if within is not None else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in rows:
        t = [f"{tuned.step_ms_dense[i, b - 1]:.2f}" + (f" ± {sd[i, b - 1]:.2f}" if sd is not None else "")
             for i in range(len(choice.ks))]
        g = [f"{choice.goodput[i, b - 1]:.0f}" for i in range(len(choice.ks))]
        extra = [", ".join(str(k) for k in within[b - 1])] if within is not None else []
        lines.append("| " + " | ".join([str(b), *t, *g, str(choice.chosen[b - 1]), *extra]) + " |")
    return "\n".join(lines)


def loss_text(table: DraftLengthTable) -> str:
    """``"0.40% (95% bounds 0.00–2.10%)"``, or the point estimate alone without error estimates."""
    loss = f"{table.predicted_worst_loss:.2%}"
    if table.has_error_estimates and table.predicted_worst_loss_ucb is not None and table.confidence is not None:
        return (f"{loss} ({table.confidence:.0%} bounds {table.predicted_worst_loss_lcb or 0.0:.2%}–"
                f"{table.predicted_worst_loss_ucb:.2%})")
    return f"{loss} (no error estimates)"


def boundaries_markdown(table: DraftLengthTable) -> str:
    """One row per boundary: where, from which k to which, the gain, its lower bound and confidence."""
    if not table.boundaries:
        return "no boundary: one range"
    lines = ["| B | k from → to | gain | lower bound | P(gain > threshold) | supported |", "|---|---|---|---|---|---|"]
    for b in table.boundaries:
        lines.append(f"| {b.batch_size} | {b.from_k} → {b.to_k} | {b.gain:+.2%} | {b.gain_lcb:+.2%} | "
                     f"{b.confidence:.0%} | {'yes' if b.supported else 'NO'} |")
    return "\n".join(lines)


def within_noise_markdown(table: DraftLengthTable) -> str:
    """Runs of batch sizes with the same set of k within noise of the chosen one."""
    if not table.within_noise:
        return "not recorded"
    lines = ["| batch sizes | chosen k | k within noise |", "|---|---|---|"]
    dense_k = table.draft.dense(table.max_num_seqs, table.max_k).tolist()
    run: tuple[int, int, tuple[int, ...]] | None = None
    start = 1
    for b in range(1, table.max_num_seqs + 1):
        key = (dense_k[b - 1], tuple(table.within_noise.get(str(b), [])))
        if run is None or key != run[1:]:
            if run is not None:
                lines.append(f"| {start}–{b - 1} | {run[1]} | {', '.join(map(str, run[2]))} |")
            run, start = (b, *key), b
    if run is not None:
        lines.append(f"| {start}–{table.max_num_seqs} | {run[1]} | {', '.join(map(str, run[2]))} |")
    return "\n".join(lines)


def accepted_work_text(table: DraftLengthTable) -> str:
    """The accepted-work fit in one line (docs/method.md, "Limitations" 2)."""
    f = table.accepted_work_fit
    if not f:
        return "no all-accepted cells: no accepted-work correction"
    runs = f.get("applied_at_batch_sizes")
    if not f.get("significant"):
        state = "NOT applied (not significant)"
    elif runs == []:
        state = "NOT applied (significant as a whole, but nowhere significantly above 0)"
    else:
        state = "applied" + (" at B = " + ", ".join(f"{a}–{b}" for a, b in runs) if runs else "")
    return (f"extra ms per accepted draft = {f['alpha_ms']:.3f} ± {f['alpha_se_ms']:.3f} + "
            f"({f['beta_ms']:.4f} ± {f['beta_se_ms']:.4f})·B from {f['cells']} all-accepted cells; {state}")


def evidence_markdown(tuned: TunedTable) -> str:
    """The honest summary of a table: loss with bounds, ranges, boundaries and their evidence, k
    within noise, re-measured and wall-timed cells, the accepted-work fit and any warnings."""
    t = tuned.table
    one_b = sum(1 for s, e, _ in t.ranges if s == e)
    parts = [
        f"search policy: {t.search_policy}" + (f", confidence {t.confidence:.0%}" if t.confidence else ""),
        f"predicted worst loss vs best fixed k: {loss_text(t)}",
        f"ranges: {len(t.ranges)} ({one_b} one batch size wide); cells re-measured: {t.cells_remeasured}; "
        f"wall-timed cells: {t.wall_timed_cells}",
        f"accepted-work correction: {accepted_work_text(t)}",
        "", "boundaries:", boundaries_markdown(t), "", "k within noise of the chosen one:", within_noise_markdown(t),
    ]
    if tuned.warnings:
        parts += ["", *[f"WARNING: {w}" for w in tuned.warnings]]
    return "\n".join(parts)


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
    fig.savefig(buf, format="png", metadata={"Software": PLOT_SOFTWARE})  # the mark write_plot recognises
    plt.close(fig)
    return buf.getvalue()


def table_plot(tuned: TunedTable, no_spec_ms: Mapping[int, float] | None, title: str) -> bytes:
    """The table asset's plot: ``goodput_plot`` for a table without a context axis; with one, a
    heat-map of k over (B, context bucket) beside the table's goodput against B at each context level."""
    if not tuned.table.context_entries:
        return goodput_plot(tuned.table, no_spec_ms, title)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = tuned.table.full_table
    buckets = full.axes.context or ()
    dense = full.dense(tuned.table.max_num_seqs)  # (B, buckets)
    fig, (heat, curves) = plt.subplots(1, 2, figsize=(11, 4), dpi=90, gridspec_kw={"width_ratios": [1, 1.6]})
    im = heat.imshow(dense, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                     extent=(-0.5, len(buckets) - 0.5, 0.5, dense.shape[0] + 0.5))
    heat.set_xticks(range(len(buckets)), [f"{lo}-{hi}" for lo, hi in buckets], fontsize=8)
    heat.set_xlabel("context bucket (tokens)")
    heat.set_ylabel("batch size B")
    fig.colorbar(im, ax=heat, label="k", ticks=sorted({int(k) for k in dense.ravel()}))
    for (lo, hi), row in zip(full.axes.batch, full.ks, strict=True):
        for j, k in enumerate(row):
            heat.text(j, (lo + hi) / 2, f"k = {k}", ha="center", va="center", fontsize=8, color="white")
    b = np.arange(1, tuned.table.max_num_seqs + 1)
    for level in tuned.by_context:
        choice = level.evidence.choice
        g = choice.goodput[[choice.ks.index(k) for k in choice.chosen], b - 1]
        curves.plot(b, g, linewidth=1.6, label=f"ctx {level.level} ({level.bucket[0]}-{level.bucket[1]})"
                                               + (", pooled prior" if level.pooled else ""))
    curves.set_xlabel("batch size B (concurrent requests)")
    curves.set_ylabel("goodput of the table (tokens kept / s)")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": PLOT_SOFTWARE})  # the mark write_plot recognises
    plt.close(fig)
    return buf.getvalue()


# -- writing a plot (README, "What TableTune writes") -----------------------------------------------
# ``tabletune table`` is read-only except for ``--plot PATH``; whatever PATH names would be replaced.
# So a plot goes only where nothing is, or over a plot TableTune wrote: a regular file starting with
# the PNG signature and carrying the text chunk ``Software: TableTune ...`` that ``goodput_plot``
# writes. Never the store, the fleet file, a published table or its companion (the caller names
# them), a symlink or a folder; and atomically (temp file + rename), so a failure leaves nothing
# half-written.

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_SOFTWARE = "TableTune goodput_plot"
"""The PNG ``Software`` text of TableTune's plots (a PNG without it is someone else's)."""
_PNG_HEAD_BYTES = 64 * 1024  # matplotlib writes its text chunks right after IHDR


def _tabletune_png(head: bytes) -> str | None:
    """Why the bytes ``head`` (a file's start) are not a plot TableTune wrote (None: they are)."""
    if not head.startswith(PNG_SIGNATURE):
        return "is not a PNG image"
    i = len(PNG_SIGNATURE)
    while i + 8 <= len(head):
        size, kind = int.from_bytes(head[i:i + 4], "big"), head[i + 4:i + 8]
        if kind == b"IDAT" or kind == b"IEND":
            break
        body = head[i + 8:i + 8 + size]
        if kind == b"tEXt" and body.partition(b"\x00")[::2] == (b"Software", PLOT_SOFTWARE.encode()):
            return None
        i += 12 + size
    return f"is a PNG image without TableTune's mark (Software: {PLOT_SOFTWARE})"


def check_plot_target(path: str | os.PathLike[str], protected: Mapping[Path, str] | None = None) -> None:
    """Raise ``PlotTargetError`` unless a plot may be written at ``path``: its folder exists, and
    nothing is there or a plot TableTune wrote is. ``protected``: paths that are never a plot
    (``{path: what it is}``, e.g. the store and the fleet file), refused whether or not they exist."""
    p = Path(path)
    mine = _resolved(p)
    for other, what in (protected or {}).items():
        if _resolved(Path(other)) == mine:
            raise _plot_refusal(p, f"is {what}")
    if not p.parent.is_dir():
        raise PlotTargetError(f"cannot write a plot to {p}: its folder {p.parent} does not exist (TableTune "
                              "creates no folder for a plot)")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise PlotTargetError(f"cannot inspect {p} before writing a plot there: {exc.strerror or exc}") from None
    reason = not_a_write_target(st)
    if reason:
        raise _plot_refusal(p, reason)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            head = os.pread(fd, _PNG_HEAD_BYTES, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PlotTargetError(f"cannot read {p} to check it before writing a plot there: "
                              f"{exc.strerror or exc}") from None
    reason = _tabletune_png(head)
    if reason:
        raise _plot_refusal(p, reason)


def write_plot(path: str | os.PathLike[str], png: bytes, protected: Mapping[Path, str] | None = None) -> Path:
    """Write ``png`` (``goodput_plot``'s bytes) to ``path`` after ``check_plot_target``, atomically."""
    if _tabletune_png(png[:_PNG_HEAD_BYTES]):
        raise ValueError("write_plot writes goodput_plot's PNGs only")  # a bug, not an input
    check_plot_target(path, protected)
    try:
        return atomic_write_bytes(path, png)
    except OSError as exc:
        raise PlotTargetError(f"cannot write a plot to {path}: {exc.strerror or exc}; nothing was written") from None


def _plot_refusal(path: Path, reason: str) -> PlotTargetError:
    return PlotTargetError(f"refusing to write a plot to {path}: it {reason}, so it is not a plot TableTune "
                           "wrote. Nothing was written; give a new file name, or the path of an earlier plot")


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare the path as written
        return path.expanduser().absolute()


# -- served verification (docs/evaluation.md, "Served verification") ------------------------------

def served_goodput_plot(result, title: str) -> bytes:
    """PNG: served goodput vs load (closed-loop concurrency), one curve per fixed k with its
    standard error across rounds, the candidate table bold; failed loads marked. ``result`` is an
    ``tuning.served_verdict.ServedVerification``. Carries the mark ``write_plot`` recognises."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=90)
    pols = list(dict.fromkeys(g.policy for g in result.goodput))
    for p in pols:
        pts = sorted((g.load, g.goodput, g.stderr) for g in result.goodput if g.policy == p and g.rounds > 0)
        if not pts:
            continue
        xs = [x for x, _, _ in pts]
        ys = [y for _, y, _ in pts]
        es = [e if np.isfinite(e) else 0.0 for _, _, e in pts]
        if p == "table":
            label = "table" + (f" (= {result.candidate_is})" if result.candidate_is else "")
            ax.errorbar(xs, ys, yerr=es, fmt="k--o", linewidth=2.2, capsize=3, label=label, zorder=3)
        else:
            ax.errorbar(xs, ys, yerr=es, marker=".", linewidth=1.2, capsize=2, label=p)
    failed = [v.load for v in result.verdicts if v.status == "fail"]
    for load in failed:
        ax.axvline(load, color="red", alpha=0.25, linewidth=6)
    ax.set_xlabel("load (concurrent requests, closed loop)")
    ax.set_ylabel("served goodput (tokens kept / s)")
    verdict = "passed" if result.passed else f"FAILED at load {failed}"
    ax.set_title(f"{title}\nserved verification {verdict}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": PLOT_SOFTWARE})
    plt.close(fig)
    return buf.getvalue()
