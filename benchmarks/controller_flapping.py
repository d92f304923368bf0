"""Switches per hour of the online controller at a steady load, with and without the flap backoff,
in ONE launch (the flap bound: docs/controller.md, "Flapping").

    python benchmarks/controller_flapping.py                       # 2 rounds x 2 policies x 5 min
    python benchmarks/controller_flapping.py --minutes 10 --rounds 1 --load 8

One launch of the small tiny target + 1-layer draft (``draft_model``, K = 3, launch table listing
every k, max_num_seqs 16) with the production controller plugin. First, in the same launch, T(B, k)
at B = ``--load`` for k = 1, 2, 3 (observe mode, the controller's own mean of clean steps). Then the
synthetic acceptance is set to a **near tie** between k = 1 and k = 2 at that batch size, or between
k = 2 and k = 3 where T2/T1 is too large for any rates <= 0.95 to tie k = 1 and 2 (``near_tie_rates``;
the start table runs the pair's lower k; the printed G_{j+1}/G_j says how near the tie is): the case where noise decides
and a controller flaps if it can. The published profile is that measurement shaped over B
(``T(B) = T(L)·(0.5 + 0.5·B/L)``), step-time correction on (the defaults).

Policies, each published as a new version from the table ``[[1, 16, 1]]`` and served for
``--minutes`` at ``--load`` closed-loop clients, rounds alternating the order:
``backoff`` (the defaults: evidence rule, ``flap_backoff_rebuilds`` 1024) and ``no backoff``
(``flap_backoff_rebuilds: 0``), plus ``point estimates`` (``evidence_confidence: 0.5``, no
backoff: closest to the controller before the evidence rule) and ``point estimates + backoff``
(where the backoff has flips to bound). Printed per phase and per policy
(mean ± s.e. over rounds): switches and reversals per hour (from the controller's own counters in
its exported state), over the whole phase and over its last two thirds (steady state: the first
third holds the start table's convergence and the backoff's first, short holds), ranges of the
final table and goodput (kept tokens / busy s); then the ratios of switches per hour with and
without the backoff.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tabletune_pipelines.evaluation.bench import loadavg
from tabletune_pipelines.core.stats import mean_se

POLICIES = {
    "backoff": {},
    "no backoff": {"flap_backoff_rebuilds": 0},
    "point estimates": {"flap_backoff_rebuilds": 0, "evidence_confidence": 0.5},
    "point estimates + backoff": {"evidence_confidence": 0.5},
}


def near_tie_rates(t_at: dict[int, float]) -> tuple[tuple[float, float, float], int, float]:
    """Synthetic rates (non-increasing, at most 0.95) that make k = j and j + 1 tie at the measured
    T(L, k), for the pair j = 1 or 2 whose tie is reachable (G_{j+1}/G_j nearest 1): tau(k) = 1 + a_1 +
    ... + a_k, so G_j = G_{j+1} when a_{j+1} = tau(j)·(T_{j+1}/T_j − 1). The rates below the pair start
    at 0.6 and rise (to 0.95) until a_{j+1} fits under them; the rate above the pair is 0.01.
    Returns (rates, j, G_{j+1}/G_j)."""
    best = None
    for j in (1, 2):
        r = t_at[j + 1] / t_at[j]
        for base in [0.6 + 0.05 * i for i in range(8)]:
            lower = (base,) * j
            nxt = min(base, max(0.0, (1.0 + sum(lower)) * (r - 1.0)))
            rates = (*lower, nxt, 0.01)[:3]
            tau = [1.0 + sum(rates[:k]) for k in range(4)]
            tie = tau[j + 1] / tau[j] / r
            if best is None or abs(tie - 1.0) < abs(best[2] - 1.0) - 1e-9:
                best = (tuple(min(a, rates[i - 1]) if i else a for i, a in enumerate(rates)), j, tie)
            if abs(tie - 1.0) < 1e-6:
                break
        if best is not None and abs(best[2] - 1.0) < 1e-6:
            break
    return best  # type: ignore[return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", type=int, default=8, help="closed-loop clients (the batch size served)")
    ap.add_argument("--minutes", type=float, default=5.0, help="minutes per policy and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--profile-seconds", type=float, default=20.0)
    args = ap.parse_args()
    import logging

    logging.getLogger("tabletune.controller").setLevel(logging.WARNING)
    from tabletune_pipelines.engine import VLLMServer
    from tabletune_pipelines.evaluation.rig import Rig, server_config

    n, ks, L = 16, (1, 2, 3), int(args.load)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    work = Path(tempfile.mkdtemp(prefix="tt-flapping-"))
    pub = work / "local.json"
    srv = VLLMServer(server_config(work, pub, rates=(0.6, 0.2, 0.01)))
    rig = Rig(srv, pub, work / "local.live.jsonl")
    flat = {k: {b: 10.0 for b in range(1, n + 1)} for k in (0, *ks)}
    rig.publish(ranges=[(1, n, 1)], rates=(0.6, 0.2, 0.01), profile=flat, controller={"mode": "observe"})
    t0 = time.monotonic()
    srv.start()
    print(f"engine started in {time.monotonic() - t0:.0f} s; load average {loadavg()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {nm: [] for nm in names}
    try:
        t_at: dict[int, float] = {}
        for k in ks:
            rig.publish(ranges=[(1, n, k)], rates=(0.6, 0.2, 0.01), profile=flat, allowed_k=[k],
                        controller={"mode": "observe", "step_time_outlier_ratio": 50.0})
            ws, _ = rig.serve(L, args.profile_seconds, 2.0, max_tokens=(96, 160))
            cells = [c for c in (ws[-1].controller.get("step_time", {}).get(str(k), []) if ws else [])]
            at = [c for c in cells if int(c[0]) == L] or sorted(cells, key=lambda c: -c[2])[:1]
            if not at:
                raise SystemExit(f"no clean steps at k = {k}: {cells}")
            t_at[k] = float(at[0][1])
        rates, j, tie = near_tie_rates(t_at)
        profile = {k: {b: t_at.get(k, t_at[1]) * (0.5 + 0.5 * b / L) for b in range(1, n + 1)} for k in (0, *ks)}
        srv.set_synthetic_rates(rates)
        print(f"T(B = {L}) = " + ", ".join(f"k{k} {t_at[k]:.2f} ms" for k in ks) + f"; near-tie rates "
              f"({', '.join(f'{a:.3f}' for a in rates)}) between k = {j} and {j + 1}: G{j + 1}/G{j} = {tie:.3f} at "
              f"B = {L}" + ("" if abs(tie - 1.0) < 0.01 else " (NOT a tie: no pair of k can tie with rates <= 0.95)"),
              flush=True)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                rig.publish(ranges=[(1, n, j)], rates=rates, profile=profile, allowed_k=list(ks),
                            controller=dict(POLICIES[name]))
                t1 = time.monotonic()
                ws, gen = rig.serve(L, args.minutes * 60.0, 3.0, max_tokens=(96, 160))
                if len(ws) < 2:
                    raise SystemExit(f"{name}: {len(ws)} windows exported")
                hours = (ws[-1].window_end - ws[0].window_start).total_seconds() / 3600.0
                first, last = ws[0].controller, ws[-1].controller
                sw = (last["switches"] - first["switches"]) / hours
                rev = (last["reversals"] - first["reversals"]) / hours
                # Steady state: the last two thirds (the first third holds the start table's convergence,
                # which is no flapping, and the backoff's first, short holds).
                t_mid = ws[0].window_start + (ws[-1].window_end - ws[0].window_start) / 3
                mid = next(w for w in ws if w.window_end >= t_mid)
                h2 = (ws[-1].window_end - mid.window_end).total_seconds() / 3600.0
                sw2 = (last["switches"] - mid.controller["switches"]) / h2 if h2 > 0 else float("nan")
                busy = sum(w.busy_s or 0.0 for w in ws)
                g = sum(w.tokens or 0 for w in ws) / busy if busy else float("nan")
                res = {"switches_per_hour": sw, "steady_switches_per_hour": sw2, "reversals_per_hour": rev,
                       "ranges": len(last["table"]), "goodput": g, "rebuilds": last["rebuilds"] - first["rebuilds"],
                       # What let switches through: overrides of the hold, its level, where the table moved.
                       "overrides": last.get("flap_overrides", 0) - first.get("flap_overrides", 0),
                       "level": last.get("flap_level"), "by_batch_size": last.get("switches_by_batch_size")}
                results[name].append(res)
                print(f"round {r} {name:<16} {sw:8.0f} switches/h ({sw2:.0f} in the last two thirds), {rev:7.0f} "
                      f"reversals/h over {hours * 60:.1f} min "
                      f"({res['rebuilds']} rebuilds); hold overrides {res['overrides']}, level {res['level']}, "
                      f"switches by B {res['by_batch_size']}; table {last['table']}; {g:7.1f} tok/s; "
                      f"{time.monotonic() - t1:.0f} s; load average {loadavg()}", flush=True)
    finally:
        srv.stop()

    print("\n| policy | switches / h | switches / h, last two thirds | reversals / h | ranges at the end | "
          "goodput tok/s |")
    print("|---|---|---|---|---|---|")
    for nm in names:
        cells = {key: mean_se([x[key] for x in results[nm]])
                 for key in ("switches_per_hour", "steady_switches_per_hour", "reversals_per_hour", "ranges", "goodput")}
        print(f"| {nm} | " + " | ".join(f"{m:.1f} ± {s:.1f}" for m, s in cells.values()) + " |")
    for on_name, off_name in (("backoff", "no backoff"), ("point estimates + backoff", "point estimates")):
        if on_name in results and off_name in results:
            for key, what in (("switches_per_hour", "whole phase"), ("steady_switches_per_hour", "last two thirds")):
                on = sum(x[key] for x in results[on_name])
                off = sum(x[key] for x in results[off_name])
                print(f"switches per hour ({what}), {on_name} / {off_name}: {on / off:.3f}" if off else
                      f"{off_name} ({what}): no switches, so nothing for the backoff to bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
