"""Regenerate benchmarks/simulator.md, the simulator's figures (docs/evaluation.md), with one command:

    python benchmarks/evaluate.py            # ~1-2 min on 2 cores
    python benchmarks/evaluate.py --quick    # fewer steps and loads (a smoke run, not for claims)
    python benchmarks/evaluate.py --check    # exit 1 with a diff when benchmarks/simulator.md differs

Per surface (three cost-model surfaces, ``tabletune_pipelines.evaluation.costmodel``, and the two
H200 profiles in ``benchmarks/data/h200``), every policy runs in the replay simulator
(``tabletune_pipelines.evaluation.simulator``) at closed-loop loads 1..max_num_seqs with
acceptance (0.7, 0.5, 0.3): loss = 1 − goodput / best fixed k at that load (docs/method.md,
"Table search"), the worst case over loads, and a goodput-vs-load plot
(``benchmarks/results/<surface>.png``). Then the controller experiments (repair from the docs'
table shrunk to a quarter; a traffic switch where acceptance drops mid-run), and the H200 section
from ``benchmarks/h200_report.py``. Everything is seeded: a rerun writes the same numbers.
Then the real-engine section (``<!-- real-engine:begin/end -->``, at the top) from
``benchmarks/data/cpu/real_engine_eval.json`` (written by ``benchmarks/real_engine_eval.py``;
``--real-only`` re-renders just that section). Text outside the ``<!-- simulator:begin/end -->``
and real-engine markers of an existing page is kept. The measured results page, docs/results.md, is
rendered from benchmarks/data by ``benchmarks/report.py``. ``--check`` renders into a temporary
folder (the same minutes as a full run: too slow for a unit test) and compares the markdown only;
the plots depend on the installed matplotlib.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tabletune_pipelines.evaluation.baselines import NightjarPolicy, TurboSpecPolicy
from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeProfile
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.evaluation import costmodel as cm
from tabletune_pipelines.evaluation import simulator as sim
from tabletune_pipelines.evaluation.surfaces import Surface, from_cost_model, from_profile
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table

HERE = Path(__file__).resolve().parent

RATES = (0.7, 0.5, 0.3)
SWITCH_RATES = (0.35, 0.15, 0.05)
DOCS_DENSE = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
DOCS_EAGLE3 = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]
LOADS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
QUICK_LOADS = (1, 8, 32, 128, 512)
BEGIN, END = "<!-- simulator:begin -->", "<!-- simulator:end -->"
REAL_BEGIN, REAL_END = "<!-- real-engine:begin -->", "<!-- real-engine:end -->"
REAL_JSON = HERE / "data" / "cpu" / "real_engine_eval.json"
HONESTY = (
    "Where the adaptive baselines do not land between the tuned table and the docs' table, and why: "
    "**TurboSpec-style** is only as good as its linear step-time model. Where T(B, k) is close to linear in "
    "(B, k) over the loads that matter it picks the tuned table's k (0% on the H200 MoE profile); where it is "
    "not — the MoE cost surface's compute-bound rise above B = 128 and its capture-size staircase, or the "
    "H200 dense profile, whose least-squares line is bent by the profile's hiccup cells (k = 0 cells of "
    "40 ms) — it picks a k that the line favours and the engine does not, and loses as much as the docs' "
    "table at those loads. Its acceptance model (one per-token rate, geometric τ) is not the cause here: "
    "with a = (0.7, 0.5, 0.3) it predicts τ(3) within 2%. **Nightjar-style** has no model to be wrong, "
    "but UCB1 keeps exploring every k at every batch size, which costs a steady few percent at a fixed load "
    "over these 800–2500-step runs (more at large B, where a wrong k costs more): it is never the worst "
    "policy at a load, never the best either, and at loads where the docs' table happens to be right it is "
    "worse than the docs' table there. Each surface's verdict is printed under its loss table. Both "
    "baselines are driven through the controller's hooks, so the same "
    "classes can run inside vLLM."
)


def prior(rates, drafts: int = 4800) -> AcceptancePrior:
    """A measured-size prior (160 prompts' worth of drafts) with exactly these rates."""
    d = (drafts,) * len(rates)
    return AcceptancePrior(rates=tuple(rates), num_drafts=drafts, drafted_per_pos=d,
                           accepted_per_pos=tuple(int(round(drafts * a)) for a in rates),
                           prompt_fingerprint="simulated", prompt_count=160, source="synthetic")


def scaled(ranges, n: int) -> list[list[int]]:
    """The docs' 512-request table scaled to max_num_seqs n (range ends × n / 512)."""
    out, start = [], 1
    for _, e, k in ranges:
        end = max(start, min(n, round(e * n / 512)))
        if end >= start:
            out.append([start, end, k])
            start = end + 1
    out[-1][1] = n
    return out


def cut(ranges, n: int, K: int) -> list[list[int]]:
    """Ranges cut to 1..n with k capped at K (the table's dense form and back: ``core.table``)."""
    return DraftTable.from_dense(DraftTable.from_entries(ranges).vllm_lookup(n, K)[1:]).entries()


def fmt_table(r) -> str:
    return "[" + ",".join(f"[{a},{b},{k}]" for a, b, k in r) + "]"


@dataclass
class Setup:
    surface: Surface
    tuned_stick: list
    tuned_evid: list
    published: Path
    step_ms: dict
    loads: tuple[int, ...]
    aa: float = 0.0


def steps_for(load: int, quick: bool) -> int:
    base = 1200 if quick else 3000
    return int(min(2500, max(500 if quick else 800, base / math.sqrt(load))))


def setup(surface: Surface, tmp: Path, loads) -> Setup:
    prof = surface.profile()
    ts = derive_table(prof, prior(RATES), DeriveOptions(policy="stickiness"))
    te = derive_table(prof, prior(RATES), DeriveOptions(policy="evidence"))
    pub = sim.published_for(tmp / f"{surface.name}.json", ranges=te.table.ranges, step_ms=te.table.step_ms,
                            prior=RATES, max_num_seqs=surface.max_num_seqs, max_k=surface.max_k,
                            deployment=surface.name)
    return Setup(surface, [list(r) for r in ts.table.ranges], [list(r) for r in te.table.ranges], pub,
                 te.table.step_ms, tuple(l for l in loads if l <= surface.max_num_seqs))


def policies(st: Setup):
    """(name, kind, factory) per policy; factory() builds a fresh policy per run."""
    s, n, K = st.surface, st.surface.max_num_seqs, st.surface.max_k
    out = []
    if s.nospec_ms is not None:
        out.append(("no-spec", "static", lambda: sim.TablePolicy("no-spec", None)))
    for k in range(K + 1):
        out.append((f"fixed k={k}", "fixed", lambda k=k: sim.TablePolicy.fixed(k, n)))
    docs = {f"docs dense (scaled to {n})" if n != 512 else "docs dense": scaled(DOCS_DENSE, n)}
    if n != 512:
        docs[f"docs dense (cut to {n})"] = cut(DOCS_DENSE, n, K)
    e3 = cut(DOCS_EAGLE3, n, K)
    if all(e3 != v for v in docs.values()):
        docs["docs EAGLE-3"] = e3
    for name, r in docs.items():
        out.append((name, "static", lambda r=r, name=name: sim.TablePolicy.from_ranges(name, r, n, K)))
    out.append(("tuned (0.5% rule)", "static", lambda: sim.TablePolicy.from_ranges("t", st.tuned_stick, n, K)))
    out.append(("tuned (evidence)", "static", lambda: sim.TablePolicy.from_ranges("e", st.tuned_evid, n, K)))
    fac = sim.ControllerFactory(st.published, n, K)
    out.append(("tuned + controller", "adaptive", fac))
    cells = s.profile().reject_cells()
    out.append(("TurboSpec-style", "adaptive", lambda: TurboSpecPolicy(cells, n, range(K + 1))))
    if s.source_profile is not None:
        # A least-squares line is not robust to the profile's hiccup cells: also fit it on the
        # cleaned cells the simulator runs on, so the comparison does not rest on them alone.
        grid = sorted(next(iter(cells.values())))
        clean = {k: {b: s.t(b, k) for b in grid} for k in range(K + 1)}
        out.append(("TurboSpec-style (clean fit)", "adaptive", lambda: TurboSpecPolicy(clean, n, range(K + 1))))
    out.append(("Nightjar-style", "adaptive", lambda: NightjarPolicy(n, range(K + 1))))
    return out, docs


def evaluate_surface(st: Setup, quick: bool, seed: int):
    pols, docs = policies(st)
    good: dict[str, dict[int, float]] = {name: {} for name, _, _ in pols}
    for load in st.loads:
        steps = steps_for(load, quick)
        for name, _, make in pols:
            r = sim.simulate(st.surface, make(), load, steps, sim.Workload(RATES), seed=seed + load, warmup=200)
            good[name][load] = r.goodput
    fixed = [name for name, kind, _ in pols if kind == "fixed"]
    best = {l: max(good[f][l] for f in fixed) for l in st.loads}
    # A/A: the tuned table once more on other draws; the relative difference is the runs' noise
    # (across seeds; policies compared at one seed share their draws and differ by less).
    aa = []
    for load in st.loads:
        pol = sim.TablePolicy.from_ranges("aa", st.tuned_evid, st.surface.max_num_seqs, st.surface.max_k)
        r = sim.simulate(st.surface, pol, load, steps_for(load, quick), sim.Workload(RATES), seed=seed + load + 10_000,
                         warmup=200)
        aa.append(abs(r.goodput / good["tuned (evidence)"][load] - 1))
    st.aa = max(aa)
    loss = {name: {l: 1 - good[name][l] / best[l] for l in st.loads} for name in good}
    return good, loss, best, docs


def loss_table(st: Setup, loss) -> str:
    lines = ["| policy | " + " | ".join(str(l) for l in st.loads) + " | **worst** |",
             "|---|" + "---:|" * (len(st.loads) + 1)]
    for name, row in loss.items():
        worst = max(row.values())
        at = max(row, key=row.get)
        lines.append(f"| {name} | " + " | ".join(f"{100 * row[l]:.1f}" for l in st.loads)
                     + f" | **{100 * worst:.1f}** (L={at}) |")
    return "\n".join(lines)


def goodput_figure(series: dict, best: dict, path: Path, *, dashed, ylabel: str, title: str,
                   ylim: tuple[float, float] | None = None) -> None:
    """Two panels over load: goodput and goodput / best fixed k, one line per policy (``series``:
    policy -> {load: goodput}; loads a policy lacks are skipped); ``dashed(name)`` marks baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.8))
    colors = plt.get_cmap("tab20").colors
    for i, (name, row) in enumerate(series.items()):
        xs = sorted(ld for ld, v in row.items() if v is not None)
        style = "--" if dashed(name) else "-"
        kw = dict(color=colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20], marker=".", label=name)
        ax1.plot(xs, [row[ld] for ld in xs], style, **kw)
        ax2.plot(xs, [row[ld] / best[ld] for ld in xs], style, **kw)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests (closed loop)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel(ylabel)
    ax2.set_ylabel("goodput / best fixed k")
    if ylim is not None:
        ax2.set_ylim(*ylim)
    ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot(st: Setup, good, best, path: Path) -> None:
    goodput_figure({name: {ld: row[ld] for ld in st.loads} for name, row in good.items()}, best, path,
                   dashed=lambda n: n.startswith("fixed") or n == "no-spec", ylabel="goodput, tokens/s",
                   title=f"{st.surface.name}: a = {RATES}", ylim=(0.5, 1.05))


def recovery_time(res: sim.SimResult, start_step: int, target: float, window: int = 250) -> float | None:
    """Simulated seconds from ``start_step`` to the first step s from which the goodput of the next
    two ``window``-step windows both reach ``target`` (one window alone is too noisy at small loads;
    s slides by 10 steps, so the answer is not rounded to a window)."""
    t = np.concatenate([[0.0], np.cumsum(res.step_ms) / 1000.0])
    k = np.concatenate([[0], np.cumsum(res.step_tokens)])
    for i in range(start_step, len(res.step_ms) - 2 * window + 1, 10):
        j, m = i + window, i + 2 * window
        if (k[j] - k[i]) / (t[j] - t[i]) >= target and (k[m] - k[j]) / (t[m] - t[j]) >= target:
            return float(t[i] - t[start_step])
    return None


def repair_experiment(st: Setup, docs, tmp: Path, quick: bool, seed: int) -> str:
    s, n, K = st.surface, st.surface.max_num_seqs, st.surface.max_k
    docs_table = next(iter(docs.values()))
    wrong = sim.quartered(docs_table, n)
    pub = sim.published_for(tmp / f"{s.name}.wrong.json", ranges=wrong, step_ms=st.step_ms, prior=RATES,
                            max_num_seqs=n, max_k=K, deployment=s.name)
    fac = sim.ControllerFactory(pub, n, K)
    steps = 1500 if quick else 3000
    lines = [f"Start: the docs' table {fmt_table(docs_table)} shrunk to a quarter, {fmt_table(wrong)}; prior = "
             "the true rates, profile = the tuner's. Controller defaults (rebuild every 100 steps, "
             f"exploration every 50). {steps} steps per load, whole run counted (the repair included).", "",
             "| load | wrong table tok/s | controller tok/s | tuned tok/s | controller / wrong | gap recovered | "
             "time to 90% of the gap (sim. s) | controller's table at the end |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    gains, shares = [], []
    for load in st.loads:
        wl = sim.Workload(RATES)
        w = sim.simulate(s, sim.TablePolicy.from_ranges("w", wrong, n, K), load, steps, wl, seed=seed + load)
        t = sim.simulate(s, sim.TablePolicy.from_ranges("t", st.tuned_evid, n, K), load, steps, wl, seed=seed + load)
        c_obj = fac()
        c = sim.simulate(s, c_obj, load, steps, wl, seed=seed + load)
        gap = t.goodput - w.goodput
        if gap <= 0.02 * t.goodput:
            continue  # the quartered table is (nearly) right at this load: nothing to repair
        share = (c.goodput - w.goodput) / gap
        ttr = recovery_time(c, 0, w.goodput + 0.9 * gap)
        gains.append(c.goodput / w.goodput - 1)
        shares.append(share)
        lines.append(f"| {load} | {w.goodput:.0f} | {c.goodput:.0f} | {t.goodput:.0f} | {c.goodput / w.goodput:.3f} | "
                     f"{100 * share:.0f}% | {'%.2f s' % ttr if ttr is not None else 'not reached'} | "
                     f"{fmt_table(c_obj.ranges)} |")
    if gains:
        lines += ["", f"Largest gain over the wrong table: **+{100 * max(gains):.0f}%** (published: up to +58%); "
                      "gap recovered: " + (f"{100 * min(shares):.0f}%" if round(100 * min(shares)) == round(100 * max(shares))
                                           else f"{100 * min(shares):.0f}–{100 * max(shares):.0f}%") + "."]
    else:
        lines += ["", "The quartered table is within 2% of the tuned one at every load here: nothing to repair."]
    return "\n".join(lines)


def switch_experiment(st: Setup, quick: bool, seed: int) -> str:
    s, n, K = st.surface, st.surface.max_num_seqs, st.surface.max_k
    new = derive_table(s.profile(), prior(SWITCH_RATES), DeriveOptions(policy="evidence"))
    new_table = [list(r) for r in new.table.ranges]
    fac = sim.ControllerFactory(st.published, n, K)
    pre, post = (500, 2500) if quick else (1000, 6000)
    lines = [f"True acceptance drops from {RATES} to {SWITCH_RATES} at step {pre}; the controller starts from the "
             f"tuned table {fmt_table(st.tuned_evid)} with the old prior. Oracle = the table tuned for the new rates "
             f"{fmt_table(new_table)}. Post-switch goodput over {post} steps.", "",
             "| load | old table tok/s | controller tok/s | oracle tok/s | gap recovered | time to 90% of the gap |",
             "|---:|---:|---:|---:|---:|---:|"]
    found = False
    for load in st.loads:
        wl = sim.Workload(RATES, switch_at=pre, switch_rates=SWITCH_RATES)
        runs = {}
        for name, pol in (("old", sim.TablePolicy.from_ranges("o", st.tuned_evid, n, K)),
                          ("oracle", sim.TablePolicy.from_ranges("n", new_table, n, K)), ("ctrl", fac())):
            runs[name] = sim.simulate(s, pol, load, pre + post, wl, seed=seed + load, warmup=pre)
        o, c, g = runs["old"].goodput, runs["ctrl"].goodput, runs["oracle"].goodput
        if g - o <= 0.02 * g:
            continue
        found = True
        ttr = recovery_time(runs["ctrl"], pre, o + 0.9 * (g - o))
        lines.append(f"| {load} | {o:.0f} | {c:.0f} | {g:.0f} | {100 * (c - o) / (g - o):.0f}% | "
                     f"{'%.2f s' % ttr if ttr is not None else 'not reached'} |")
    if not found:
        lines.append("| - | the old table stays within 2% of the oracle at every load | | | | |")
    lines += ["", "Published: 96% of a traffic-switch gap recovered within a minute."]
    return "\n".join(lines)


def calibration_notes() -> str:
    a = {x.what: x for x in cm.anchors() if x.surface == cm.H100_DENSE_4B.name}
    step = a["step at B = 80, k = 3"].model
    lin = a["linear fit (B, k <= 128, 3) at B = 80, k = 3"].model
    moe = {x.what: x for x in cm.anchors()
           if x.surface == cm.H100_MOE_30B.name}["docs' dense table loss at 96 requests"]
    return ("Missed anchors, and why. (1) The linear fit: a least-squares fit in (B, k) over B ≤ 128 gives "
            f"{lin:.2f} ms "
            f"at B = 80, k = 3 against the model's own {step:.2f} ms (published: 8.0 vs 9.7 ms). The roofline is "
            "nearly linear there (compute-bound, 320 tokens is a capture size); the published gap comes from a "
            "convexity this model does not have, so the linear model's error — TurboSpec-style's weakness — is "
            "understated on the dense cost surface and shows on the MoE surface and the measured H200 profiles. "
            f"(2) The docs' table on the MoE at 96 requests loses {moe.model:.1f}% here against the published 17.5%: "
            "the model's k = 1 is too slow relative to k = 3 at B = 96 (only the four MoE step-time figures were "
            "fitted; this one is an outcome, not a fit target).")


def switch_diagnosis(st: Setup, quick: bool, seed: int, tmp: Path) -> str:
    """The traffic switch again at a large and a small load with exploration or hysteresis off."""
    s, n, K = st.surface, st.surface.max_num_seqs, st.surface.max_k
    new = [list(r) for r in derive_table(s.profile(), prior(SWITCH_RATES),
                                         DeriveOptions(policy="evidence")).table.ranges]
    pre, post = (500, 2500) if quick else (1000, 6000)
    wl = sim.Workload(RATES, switch_at=pre, switch_rates=SWITCH_RATES)
    lines = ["| load | settings | controller tok/s | oracle tok/s | k run after the switch (steps at k = 0, 1, 2, 3) | "
             "â at the end |", "|---:|---|---:|---:|---|---|"]
    for load in (4, n):
        oracle = sim.simulate(s, sim.TablePolicy.from_ranges("n", new, n, K), load, pre + post, wl, seed=seed + load,
                              warmup=pre).goodput
        for label, ctl in (("defaults", {}), ("exploration off", {"exploration_every_steps": 0}),
                           ("hysteresis 0", {"hysteresis": 0})):
            pub = sim.published_for(tmp / f"{s.name}.diag{load}{len(label)}.json", ranges=st.tuned_evid,
                                    step_ms=st.step_ms, prior=RATES, max_num_seqs=n, max_k=K, controller=ctl,
                                    deployment=s.name)
            c = sim.ControllerFactory(pub, n, K)()
            r = sim.simulate(s, c, load, pre + post, wl, seed=seed + load, warmup=pre)
            ks = np.bincount(r.ks[pre:], minlength=K + 1).tolist()
            est = ", ".join(f"{x:.2f}" for x in c.estimate())
            lines.append(f"| {load} | {label} | {r.goodput:.0f} | {oracle:.0f} | {ks} | ({est}) |")
    return "\n".join(lines)


def h200_section() -> str:
    spec = importlib.util.spec_from_file_location("h200_report", HERE / "h200_report.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod.main()
    return buf.getvalue().strip()


def surfaces(quick: bool) -> list[Surface]:
    out = [from_cost_model(p) for p in cm.COST_SURFACES]
    for f in sorted((HERE / "data" / "h200").glob("*.one_launch.json")):
        out.append(from_profile(StepTimeProfile.from_json(f.read_text())))
    return out


def between(loss, docs_names) -> str:
    """Whether TurboSpec-/Nightjar-style land between the tuned table and the docs' table (worst case)."""
    worst = {k: max(v.values()) for k, v in loss.items()}
    tuned = worst["tuned (evidence)"]
    docs = max(worst[d] for d in docs_names)
    out = []
    for b in [x for x in worst if x.startswith(("TurboSpec", "Nightjar"))]:
        w = worst[b]
        # within half a point counts as "the same": about the runs' sampling error
        if abs(w - tuned) <= 0.005:
            where = "the same as the tuned table"
        elif w < tuned:
            where = "better than the tuned table"
        elif abs(w - docs) <= 0.005:
            where = "as bad as the docs' table"
        elif w > docs:
            where = "worse than the docs' table"
        else:
            where = "between the tuned table and the docs' table"
        out.append(f"{b} {100 * w:.1f}% ({where})")
    return f"worst case: tuned (evidence) {100 * tuned:.1f}%, docs {100 * docs:.1f}%; " + ", ".join(out)


def _pct(x, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{nd}f}"


def _pm(d, se, nd: int = 1) -> str:
    if d is None:
        return "n/a"
    return f"{100 * d:+.{nd}f} ± {_pct(se, nd)}" if se is not None else f"{100 * d:+.{nd}f}"


def real_engine_plot(name: str, res: dict, loads, path: Path) -> None:
    """Goodput and goodput / best fixed k vs load, per policy, for one real-engine scenario."""
    best = {str(ld): max((res["goodput"][f][str(ld)][0] for f in res["goodput"] if f.startswith("k=")
                          and str(ld) in res["goodput"][f]), default=float("nan")) for ld in loads}
    series = {p: {ld: v[0] for ld, v in row.items()} for p, row in res["goodput"].items()}
    for p, per in res.get("adaptive", {}).items():
        series[p + " (bridged)"] = {ld: best[ld] * (1 - v["loss"]) for ld, v in per.items() if v.get("loss") is not None}
    for ld, v in (res.get("nospec") or {}).items():
        series.setdefault("no-spec (own launch)", {})[ld] = v["goodput"]
    goodput_figure({p: {int(ld): v for ld, v in row.items()} for p, row in series.items()},
                   {int(ld): v for ld, v in best.items()}, path,
                   dashed=lambda p: p.startswith("k=") or p.startswith("no-spec"), ylabel="goodput, kept tokens/s",
                   title=f"real engine (vLLM CPU build): {name}")


def real_engine_section(doc: dict, *, results_dir: Path | None = None, rel_to: Path | None = None) -> str:
    """The "Real engine (vLLM CPU build)" section from benchmarks/real_engine_eval.py's JSON (markdown,
    between the ``REAL_BEGIN``/``REAL_END`` markers). With ``results_dir``, also a PNG per scenario."""
    m = doc["meta"]
    loads = [int(x) for x in m["loads"]]
    out = [REAL_BEGIN, "# Real engine (vLLM CPU build)", "",
           f"`{m['command']}` ({m['engine']}; {m['target']} target, K = {m['K']}, max_num_seqs "
           f"{m['max_num_seqs']}, launch table {m['launch_table']}), finished {m['finished']} in "
           f"{m['wall_s'] / 60:.1f} min; load average at start `{m['loadavg_start']}`, at the end "
           f"`{m['loadavg_end']}`" + (" — **--quick smoke run, not for claims**" if m.get("quick") else "") + ". "
           f"Closed loop at loads {loads}; table policies in ONE launch, hot-swapped every {m['window_s']:g} s "
           f"window (+ {m['settle_s']:g} s settle) in rotating order over {m['rounds']} rounds, kept tokens counted "
           "from the step log and every window checked against it; adaptive policies and no-spec in their own "
           f"launches ({m['adaptive_rounds']} rounds, each round an adaptive window and an anchor window of the "
           "tuned (evidence) table with the controller bypassed). Loss = 1 − goodput / best fixed k at that load; "
           "adaptive policies' loss is bridged through the anchor (paired in their launch × tuned / best in the "
           "table launch). Method and caveats: docs/evaluation.md, \"Real engine\". Raw data: "
           "`benchmarks/data/cpu/real_engine_eval.json`, printed output `benchmarks/data/cpu/real_engine_eval.log`.", ""]
    for name, scn in doc["scenarios"].items():
        res = scn["results"]
        prof = scn.get("profile", {})
        out += [f"## Real engine: {name}", ""]
        if "meta" in scn:  # this scenario was rerun on its own (real_engine_eval.py --merge-into)
            sm = scn["meta"]
            out += [f"This scenario's run: `{sm['command']}`, finished {sm['finished']} in {sm['wall_s'] / 60:.1f} min, "
                    f"{sm['rounds']} rounds of {sm['window_s']:g} s windows in the table launch, {sm['adaptive_rounds']} "
                    f"in the adaptive ones; load average at start `{sm['loadavg_start']}`, at the end "
                    f"`{sm['loadavg_end']}`.", ""]
        out += [f"Acceptance rates {scn['rates']}; profile: {prof.get('source', 'n/a')} "
                f"({prof.get('seconds', 'n/a')} s). Tables: "
                + "; ".join(f"{p}: `{t}`" for p, t in scn["tables"].items() if not p.startswith("k=")) + ".", "",
                "Loss (%) against the best fixed k at each load (negative: faster than every fixed k):", "",
                "| policy | " + " | ".join(f"L={ld}" for ld in loads) + " | **worst** |",
                "|---|" + "---:|" * (len(loads) + 1)]
        for p, row in res["loss"].items():
            out.append(f"| {p} | " + " | ".join(_pct(row.get(str(ld))) for ld in loads)
                       + f" | **{_pct(res['worst'].get(p))}** |")
        out += ["", f"Best fixed k per load: " + ", ".join(f"L={ld}: {k}" for ld, k in res["best_fixed"].items())
                + ". Goodput (kept tokens/s, mean over rounds ± s.e.):", "",
                "| policy | " + " | ".join(f"L={ld}" for ld in loads) + " |", "|---|" + "---:|" * len(loads)]
        for p, row in res["goodput"].items():
            out.append(f"| {p} | " + " | ".join(
                f"{row[str(ld)][0]:.1f} ± {row[str(ld)][1]:.1f}" if str(ld) in row and row[str(ld)][1] is not None
                else (f"{row[str(ld)][0]:.1f}" if str(ld) in row else "n/a") for ld in loads) + " |")
        for p, per in res.get("adaptive", {}).items():
            out.append(f"| {p} (own launch) | " + " | ".join(
                f"{_fmt_num(per[str(ld)]['goodput'])} ± {_fmt_num(per[str(ld)]['se'])}" if str(ld) in per else "n/a"
                for ld in loads) + " |")
        for ld_row in [res.get("nospec")] if res.get("nospec") else []:
            out.append("| no-spec (own launch) | " + " | ".join(
                f"{_fmt_num(ld_row[str(ld)]['goodput'])} ± {_fmt_num(ld_row[str(ld)]['se'])}" if str(ld) in ld_row
                else "n/a"
                for ld in loads) + " |")
        aa = res["aa"]
        out += ["", f"**Noise.** A/A pair (the tuned (evidence) table under two names), paired difference per load: "
                + ", ".join(f"L={ld}: {_pm(v['diff'], v['se'])}%" for ld, v in aa.items())
                + f"; floor (worst |A/A| over loads) **{_pct(res['aa_floor'])}%**. Median paired s.e. over all "
                f"table-policy pairs: {_pct(res['median_paired_se'])}%. Windows excluded by the step-log check: "
                f"{res['excluded_windows']} of {res['windows']}.", "",
                "Paired difference, tuned (evidence) vs each policy (% of the other's goodput, ± s.e. over rounds; "
                "adaptive: vs the anchor in the adaptive launch, i.e. the policy relative to the tuned table):", "",
                "| vs | " + " | ".join(f"L={ld}" for ld in loads) + " |", "|---|" + "---:|" * len(loads)]
        for p in scn["tables"]:
            if p == "tuned (evidence)":
                continue
            cells = []
            for ld in loads:
                row = next((x for x in res["pairs"] if x["load"] == ld and {x["a"], x["b"]} == {p, "tuned (evidence)"}),
                           None)
                if row is None or row["diff"] is None:
                    cells.append("n/a")
                    continue
                d = row["diff"] if row["a"] == "tuned (evidence)" else 1.0 / (1.0 + row["diff"]) - 1.0
                cells.append(_pm(d, row["se"]))
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        for p, per in res.get("adaptive", {}).items():
            out.append(f"| {p} (policy / tuned) | " + " | ".join(
                _pm(per[str(ld)]["vs_anchor"], per[str(ld)]["vs_anchor_se"]) if str(ld) in per else "n/a"
                for ld in loads) + " |")
        if res.get("adaptive"):
            out += ["", "Adaptive policies, raw cross-launch loss (own launch vs the table launch's best fixed k; "
                    "launch-to-launch drift is up to ~11% here, which is why the bridged figure is the one above): "
                    + "; ".join(f"{p}: " + ", ".join(f"L={ld}: {_pct(v['raw_loss'])}" for ld, v in per.items())
                                for p, per in res["adaptive"].items()) + "."]
        st = scn.get("adaptive_state") or {}
        if st:
            out += ["", "Controller state at the end of each adaptive launch: " + "; ".join(
                f"{p}: policy {s.get('policy')}, active {s.get('policy_active')}, errors {s.get('errors')}, "
                f"k steps {s.get('policy_k_steps')}, table {s.get('policy_table') or s.get('table')}"
                for p, s in st.items()) + "."]
        v = res["verdict"]
        out += ["", f"**Verdict ({name}).** Tuned (evidence) worst-case loss {_pct(v['tuned_worst'])}% against the "
                f"target {_pct(v['target'])}% (3% or the A/A floor if larger): "
                f"**{'met' if v['within_target'] else 'not met'}**; better (lower worst case) than "
                + ", ".join(f"{p}: **{'yes' if b else 'no'}**" for p, b in v["better_than"].items()) + "."]
        if results_dir is not None:
            png = results_dir / f"real-engine-{name}.png"
            try:
                real_engine_plot(name, res, loads, png)
                out += ["", f"![goodput vs load, {name}]({png.relative_to(rel_to).as_posix() if rel_to else png})"]
            except Exception as exc:  # noqa: BLE001 - a plot must not stop the report
                out += ["", f"(plot not drawn: {exc!r})"]
        out.append("")
    out.append(REAL_END)
    return "\n".join(out)


def _fmt_num(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def splice_real_engine(text: str, section: str) -> str:
    """``text`` with its real-engine block replaced by ``section`` (inserted at the top when absent);
    everything else — the simulator block, the hand-written GPU section — is kept byte for byte."""
    if REAL_BEGIN in text and REAL_END in text:
        return text[:text.index(REAL_BEGIN)] + section + text[text.index(REAL_END) + len(REAL_END):]
    return section + "\n\n" + text


def render_real_engine(out: Path, data: Path = REAL_JSON) -> bool:
    """Splice the real-engine section from ``data`` into ``out``; False when there is no JSON."""
    if not data.exists():
        return False
    import json

    doc = json.loads(data.read_text())
    results_dir = out.parent / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    section = real_engine_section(doc, results_dir=results_dir, rel_to=out.parent)
    old = out.read_text() if out.exists() else ""
    out.write_text(splice_real_engine(old, section))
    return True


def check(args: argparse.Namespace) -> int:
    """Render the page as ``main`` would, into a copy of ``args.out`` in a temporary folder, and print
    the unified diff against ``args.out``: 0 when they match, 1 when they differ (nothing is written)."""
    import difflib
    import shutil

    with tempfile.TemporaryDirectory(prefix="tt-eval-check-") as d:
        copy = Path(d) / args.out.name
        if args.out.exists():
            shutil.copyfile(args.out, copy)
        argv = ["--out", str(copy), "--seed", str(args.seed), "--real-engine-json", str(args.real_engine_json)]
        argv += ["--quick"] * args.quick + ["--real-only"] * args.real_only
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        if rc != 0:
            return rc
        new = copy.read_text()
    old = args.out.read_text() if args.out.exists() else ""
    if old == new:
        print(f"{args.out} is what benchmarks/evaluate.py renders")
        return 0
    name = str(args.out.relative_to(HERE.parent)) if args.out.is_relative_to(HERE.parent) else str(args.out)
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                               name + " (committed)", name + " (rendered)"))
    print(f"\n{name} differs from what benchmarks/evaluate.py renders: run `python benchmarks/evaluate.py`.")
    return 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer loads and steps (smoke run)")
    ap.add_argument("--out", type=Path, default=HERE / "simulator.md")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-engine-json", type=Path, default=REAL_JSON,
                    help="benchmarks/real_engine_eval.py's output, rendered as the real-engine section")
    ap.add_argument("--real-only", action="store_true", help="only re-render the real-engine section (seconds)")
    ap.add_argument("--check", action="store_true",
                    help="render into a temporary folder and compare with --out (a diff and exit 1 on a difference)")
    args = ap.parse_args(argv)
    if args.check:
        return check(args)
    t_start = time.time()
    if args.real_only:
        ok = render_real_engine(args.out, args.real_engine_json)
        print(f"{'wrote' if ok else 'no ' + str(args.real_engine_json) + '; left'} {args.out}")
        return 0 if ok else 1
    loads = QUICK_LOADS if args.quick else LOADS
    results_dir = args.out.parent / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    md = [BEGIN, "# Evaluation results", "",
          "Regenerate with `python benchmarks/evaluate.py` (seeded: the same numbers every run"
          + (", **--quick smoke run**" if args.quick else "") + "). Method: docs/evaluation.md.", "",
          "## Simulator: calibration of the cost model", "",
          "Each published figure against the cost model (`tabletune_pipelines/evaluation/costmodel.py`, "
          f"acceptance {RATES}):", "", cm.calibration_table(), "",
          calibration_notes(), ""]
    headline, verdicts = [], []
    with tempfile.TemporaryDirectory(prefix="tt-eval-") as d:
        tmp = Path(d)
        for s in surfaces(args.quick):
            st = setup(s, tmp, loads)
            good, loss, best, docs = evaluate_surface(st, args.quick, args.seed)
            png = results_dir / f"{s.name}.png"
            plot(st, good, best, png)
            verdict = between(loss, list(docs))
            verdicts.append(f"- {s.name}: {verdict}.")
            headline.append(f"| {s.name} | " + " | ".join(
                f"{100 * max(loss[p].values()):.1f}" if p in loss else "n/a"
                for p in ("tuned (0.5% rule)", "tuned (evidence)", "tuned + controller", "TurboSpec-style",
                          "TurboSpec-style (clean fit)", "Nightjar-style")) +
                f" | {100 * max(max(loss[x].values()) for x in docs):.1f} |")
            md += [f"## Simulator: {s.name}", "", s.description + ".", "",
                   f"Tuned (0.5% rule): {fmt_table(st.tuned_stick)}; tuned (evidence): {fmt_table(st.tuned_evid)}; "
                   + "; ".join(f"{k}: {fmt_table(v)}" for k, v in docs.items()) + ".", "",
                   f"Loss (%) against the best fixed k at each load (closed loop, a = {RATES}, "
                   f"{steps_for(1, args.quick)}–{steps_for(st.loads[-1], args.quick)} steps per run, the first 200 "
                   "not counted; common random numbers across policies). Negative = faster than every fixed k "
                   "(no-spec can be: k = 0 still runs the drafter).", "", loss_table(st, loss), "",
                   f"{verdict}. A/A noise floor (the tuned table on other random draws): up to "
                   f"{100 * st.aa:.1f}% of goodput at a load.", "",
                   f"![goodput vs load]({png.relative_to(args.out.parent).as_posix()})", "",
                   f"### Controller repair ({s.name})", "", repair_experiment(st, docs, tmp, args.quick, args.seed), "",
                   f"### Traffic switch ({s.name})", "", switch_experiment(st, args.quick, args.seed), ""]
            if s.name == cm.H100_MOE_30B.name:
                md += [f"### Why the switch is not fully recovered ({s.name})", "",
                       "The same switch with one controller setting changed. At the largest load the gap left is "
                       "the exploration steps (one step at K every 50, and a k = 3 step costs several k = 0 "
                       "steps there); without exploration the table happens to be right only because the "
                       "controller's first rebuild (its 0.5% search on the old prior) had already put k = 0 "
                       "there, and with no drafts its â never moves (the short-table trap of "
                       "docs/method.md, \"Online controller\"). At a small load, hysteresis keeps the current k "
                       "next to a boundary of the new table.", "", switch_diagnosis(st, args.quick, args.seed, tmp),
                       ""]
            print(f"{s.name}: {verdict} ({time.time() - t_start:.0f} s)", flush=True)
    at = md.index("## Simulator: calibration of the cost model")
    md[at:at] = [
        "## Simulator: headline (worst-case loss %, a = (0.7, 0.5, 0.3))", "",
        "| surface | tuned (0.5% rule) | tuned (evidence) | tuned + controller | TurboSpec-style | "
        "TurboSpec-style (clean fit) | Nightjar-style | docs (worst of its variants) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|", *headline, "", *verdicts, "", HONESTY, ""]
    md += ["## GPU (H200), measured", "", "Output of `python benchmarks/h200_report.py`:", "", "```", h200_section(),
           "```", END]
    text = "\n".join(md) + "\n"
    if args.out.exists():
        old = args.out.read_text()
        if BEGIN in old and END in old:
            text = old[:old.index(BEGIN)] + text.rstrip("\n") + old[old.index(END) + len(END):]
            if not text.endswith("\n"):
                text += "\n"
    args.out.write_text(text)
    if render_real_engine(args.out, args.real_engine_json):
        print(f"real-engine section from {args.real_engine_json}")
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
