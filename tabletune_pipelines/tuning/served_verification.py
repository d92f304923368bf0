"""The served verification of a candidate table before it is published: the run loop
(``verify_on_server``) on one running launch.

**Protocol** (docs/evaluation.md, "Served verification"). Launch-to-launch drift is larger than the
differences between good tables, so every policy is measured in the same server: a policy's table is
hot-swapped between windows through the timing scheduler's k control, the order of the policies
rotates from round to round (``served_load.rotated``, so slow drift hits every policy alike), every
policy of a round serves the same requests (each client's prompts and lengths are redrawn from the
round's seed at every window, ``LoadGenerator.reseed``: with real acceptance each prompt sets how
many drafts are kept, and a new draw per window would add that spread to the paired ratio), and
each window is counted and checked on the engine side from the step log
(``served_windows.measure_window``). The load is ``served_load.LoadGenerator``; what each load serves
and the budget come from ``served_plan``; the verdict and the result from ``served_verdict``.

**Sequential rounds**: each load (largest first; sized from the profile, the loads where a verdict
is expected first, ``verdict_order``) runs rounds until its verdict is decided, its ``rounds`` (the
most per load) are spent or its share of the budget is (what is left, split among the loads still
to measure, or among the ones still to measure where a verdict is expected); after 2 rounds the
window-to-window spread of the paired ratio says how many rounds a decision needs, and that figure
is printed; and a fixed k that the best fixed k out-serves beyond the paired noise is not served in
the load's later rounds (``outserved``: it cannot become the k the candidate is judged against).
Each load's stop reason is kept: ``decided``, ``rounds`` or ``budget``.

No Dagster, no vLLM import: ``server`` is anything with ``set_k(table=...)``, ``step_log_offset()``,
``read_steps(...)`` and ``complete(...)``, i.e. ``engine.process.VLLMServer`` launched with
TableTune's timing scheduler (``engine/timing_scheduler.py``) and a launch table (runtime k
switching). ``tuning.deployments.verify_served`` launches the deployment's engine and calls it;
``evaluation.served`` is the benchmarks' measuring harness on top of these modules.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tabletune_pipelines.core.stats import mean_se, paired_ratios, t_quantile
from tabletune_pipelines.core.table import DraftTable
from tabletune_pipelines.tuning.served_load import LoadGenerator, rotated
from tabletune_pipelines.tuning.served_plan import (
    DEFAULTS,
    PLANNED_ROUNDS,
    SWAP_OVERHEAD_S,
    FixedKChoice,
    LoadPolicies,
    VerificationSizing,
    WindowKind,
    default_loads,
    load_batch_sizes,
    load_policies,
    plan_verification,
    plausible_fixed_ks,
    size_verification,
)
from tabletune_pipelines.tuning.served_verdict import (
    LoadVerdict,
    ServedVerification,
    StopReason,
    judge,
    rounds_to_decide,
)
from tabletune_pipelines.tuning.served_windows import (
    CANDIDATE,
    Window,
    by_round,
    fixed_name,
    measure_requests_window,
    measure_window,
    window_progress_line,
)
from tabletune_pipelines.vocab import DEFAULT_TEMPERATURE

logger = logging.getLogger("tabletune.served")

__all__ = ["first_warmup", "outserved", "verify_on_server"]


def first_warmup(server: Any, tables: Sequence[Sequence[Sequence[int]]], seconds: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Run the load already flowing on each of ``tables`` in turn for an equal share of ``seconds``
    (the launch's first warm-up: every policy's step shapes before anything is counted)."""
    share = seconds / max(1, len(tables))
    for table in tables:
        server.set_k(table=table)
        sleep(share)


def verdict_order(loads: Sequence[int], sizing: VerificationSizing) -> tuple[int, ...]:
    """``loads`` in the order the budget serves them: those where the profile expects a verdict,
    fewest rounds first (the larger load first on a tie), then those where it expects none or has
    no fixed k to judge against, largest first. Measured in that order, a budget too small for
    every load is spent where it buys verdicts (one 2026-12-07 run split 180 s evenly over loads 16,
    8 and 1: two paired rounds each, t = 12.7, no verdict anywhere)."""
    need = {n.load: n.rounds for n in sizing.needs}
    return tuple(sorted(loads, key=lambda ld: (need.get(ld) is None, need.get(ld) or 0, -ld)))


MIN_OPEN_ROUNDS = 3
"""A load where the profile expects no verdict is measured only if its share of the budget buys this
many paired rounds: with two the t quantile is 12.7, and no plausible gap clears it."""


def _loads_sharing(left: Sequence[int], sizing: VerificationSizing | None) -> int:
    """How many of the loads ``left`` to measure split the budget left: all of them, or, sized from the
    profile and while a load where a verdict is expected is among them, those loads only."""
    if sizing is None:
        return len(left)
    reachable = {n.load for n in sizing.needs if n.rounds is not None}
    return max(1, sum(1 for ld in left if ld in reachable)) if reachable & set(left) else len(left)


def verify_on_server(server: Any, candidate_table: Sequence[Sequence[int]], *, K: int, max_num_seqs: int,
                     loads: Sequence[int] | None = None, rounds: int | None = None, window_s: float | None = None,
                     budget_s: float | None = None, settle_s: float | None = None, warmup_s: float | None = None,
                     first_warmup_s: float | None = None, min_steps: int | None = None, tolerance: float = 0.03,
                     device: str | None = None, vocab_size: int = 2048,
                     prompt: Callable[[random.Random], Any] | None = None, output_tokens: tuple[int, int] = (32, 128),
                     acceptance: str = "", progress: Callable[[str], None] | None = None,
                     fixed_k: FixedKChoice = "all", within_noise: Mapping[int, Sequence[int]] | None = None,
                     window: WindowKind | None = None, requests_per_client: int | None = None,
                     references: Mapping[str, Sequence[Sequence[int]]] | None = None,
                     profile_steps: tuple[Mapping[str, Mapping[str, float]], Sequence[float]] | None = None,
                     clock: Callable[[], float] = time.monotonic) -> ServedVerification:
    """Run ``candidate_table`` against the fixed k at ``loads`` inside one launch (``server``), in
    rotating rounds until each load's verdict is decided, and judge it (``served_verdict``). ``fixed_k``:
    every k 0..K at every load, or the ``plausible_fixed_ks`` of each load (``within_noise``: the
    table's evidence). ``references``: tables the candidate is compared with at each load (paired
    ratios, not gating), served only where no served policy runs the same k. ``profile_steps``: the
    table's decode step times ``{k: {B: ms}}`` measured in this launch's profile and the acceptance
    rates; with them the windows, rounds and budget not given are sized by ``size_verification`` (the
    loss to detect is ``tolerance``), and the loads where no verdict is expected are named up front.
    ``window``: what a window counts (``vocab.WindowKind``): ``time`` windows of a loop that
    runs across them, or ``requests``, the round's fixed requests (``requests_per_client`` a client)
    served from an idle engine at temperature ``DEFAULT_TEMPERATURE`` (the acceptance prior's), so
    every policy of a round does the same work. Other ``None`` options take the device's ``DEFAULTS``
    (``device``: ``server.device`` when not given). Loads are measured largest first, each with its
    share of the budget left, so a budget that runs out leaves the smallest loads inconclusive; sized
    from the profile, the loads where a verdict is expected go first, fewest rounds first, and share
    the budget among themselves, and the loads where none is expected get what they leave
    (``verdict_order``)."""
    say = progress or logger.info
    device = device or getattr(server, "device", None) or "cpu"
    d = DEFAULTS.get(device, DEFAULTS["gpu"])
    loads = tuple(sorted({min(int(x), max_num_seqs) for x in (loads or default_loads(max_num_seqs))}, reverse=True))
    per_load = {}
    for load in loads:
        ks = (range(K + 1) if fixed_k == "all" else
              plausible_fixed_ks(candidate_table, load, max_k=K, max_num_seqs=max_num_seqs, within_noise=within_noise))
        per_load[load] = load_policies(candidate_table, load, max_k=K, max_num_seqs=max_num_seqs, fixed_ks=ks,
                                       references=references)
    every = {n: t for lp in per_load.values() for n, t in lp.policies.items()}
    lookup = DraftTable.from_entries([list(r) for r in candidate_table]).vllm_lookup(max_num_seqs, K)[1:]
    same = fixed_name(lookup[0]) if len(set(lookup)) == 1 else None
    most = rounds or d.rounds
    kind: WindowKind = window or d.window
    requests = requests_per_client or d.requests_per_client
    sizing = None
    if profile_steps is not None:
        sizing = size_verification(profile_steps[0], profile_steps[1], per_load, max_k=K, max_num_seqs=max_num_seqs,
                                   device=device, tolerance=tolerance, most_rounds=most, min_steps=min_steps,
                                   window=kind, requests=requests, output_tokens=output_tokens)
        budget_s, window_s = budget_s or sizing.budget_s, window_s or sizing.window_s
        say(f"[served] sized from the profile's step times and the {tolerance:.0%} loss to detect: "
            f"{window_s:g} s windows, a {budget_s:.0f} s budget, up to {sizing.rounds} planned rounds per load "
            f"(expected per-round spread {sizing.ratio_sd:.2f}; "
            + ", ".join(f"load {n.load}: " + ("no fixed k to judge against" if n.predicted_ratio is None else
                                              f"predicted {n.predicted_ratio:.3f}, "
                                              + (f"~{n.rounds} rounds" if n.rounds else "no verdict expected"))
                        for n in sizing.needs) + ")")
        loads = verdict_order(loads, sizing)
    planned = min(most, sizing.rounds if sizing is not None else PLANNED_ROUNDS)
    plan = plan_verification(max(len(lp.policies) for lp in per_load.values()), loads, budget_s=budget_s or d.budget_s,
                             rounds=planned, window_s=window_s or d.window_s,
                             settle_s=d.settle_s if settle_s is None else settle_s,
                             warmup_s=d.warmup_s if warmup_s is None else warmup_s)
    if sizing is not None and (budget_s, window_s) == (sizing.budget_s, sizing.window_s):
        # sized per load: the windows stay as sized; a load stops when decided or its share is spent
        plan = dataclasses.replace(plan, window_s=sizing.window_s, budget_s=sizing.budget_s,
                                   estimated_s=sizing.budget_s, note="")
    plan = dataclasses.replace(plan, rounds=most,
                               first_warmup_s=d.first_warmup_s if first_warmup_s is None else first_warmup_s)
    what = (f"windows of {requests} requests a client (~{plan.window_s:g} s at the largest load)" if kind == "requests"
            else f"{plan.window_s:g} s windows")
    say(f"served verification of {[list(r) for r in candidate_table]}"
        + (f" (= fixed {same})" if same else "") + f" at loads {list(plan.loads)}: "
        f"up to {plan.rounds} rounds (until decided) of {what}, "
        f"~{plan.estimated_s:.0f} s for {planned} rounds "
        f"of a {plan.budget_s:.0f} s budget" + (f" ({plan.note})" if plan.note else "")
        + (f", after a {plan.first_warmup_s:g} s warm-up on every policy in turn" if plan.first_warmup_s else ""))
    for load, lp in per_load.items():
        skipped = sorted(set(range(K + 1)) - {int(f.split("=")[1]) for f in lp.fixed})
        say(f"[served] load {load} serves {list(lp.policies)}"
            + (f"; the table is {lp.same} at B = {load_batch_sizes(load).start}..{load}, judged against the other "
               f"fixed k" if lp.same else "")
            + (f"; fixed k = {skipped} lose beyond the profile's noise here, not served" if skipped else "")
            + "".join(f"; {r} is " + ("the table here (A/A, not measured)" if via == CANDIDATE else f"{via} here")
                      for r, via in lp.references.items() if via is not None))
    t0 = clock()
    fixed = [fixed_name(k) for k in range(K + 1)]
    windows: list[Window] = []
    errors: list[str] = []
    stops: list[tuple[int, str]] = []
    min_steps = d.min_steps if min_steps is None else min_steps
    per_window = plan.window_s + plan.settle_s + SWAP_OVERHEAD_S
    spent: list[float] = []  # wall seconds per window so far (swaps and extended windows included)
    dropped: dict[int, set[str]] = {}  # per load, the fixed k no longer served (``outserved``)
    for li, load in enumerate(plan.loads):
        lp = per_load[load]
        names = list(lp.policies)
        left = plan.budget_s - (clock() - t0)
        if left < plan.warmup_s + len(names) * per_window:
            break
        share = left / _loads_sharing(plan.loads[li:], sizing)  # what is left, split among the loads still to measure
        if sizing is not None and load in {n.load for n in sizing.unreachable} \
                and share < plan.warmup_s + MIN_OPEN_ROUNDS * len(names) * per_window:
            # no verdict expected and too little left to find one anyway: the budget stops here
            stops.append((load, "budget"))
            say(f"[served] load {load}: not measured: no verdict expected, and the {share:.0f} s left for it buy fewer "
                f"than {MIN_OPEN_ROUNDS} paired rounds of its {len(names)} policies")
            continue
        t_load = clock()
        gen = LoadGenerator(server, load, vocab_size, output_tokens=output_tokens, seed=load, prompt=prompt,
                            temperature=DEFAULT_TEMPERATURE if kind == "requests" else None)
        if kind == "time" or (not windows and plan.first_warmup_s > 0):  # the first warm-up runs on a flowing load
            gen.start()
        last = li == len(plan.loads) - 1
        why: StopReason = "rounds"
        try:
            if not windows and plan.first_warmup_s > 0:  # every k's shapes once before any window, off the clock
                tw = clock()
                first_warmup(server, list(every.values()), plan.first_warmup_s)
                t0 += clock() - tw
                t_load += clock() - tw
            if kind == "requests":
                gen.stop()  # windows of fixed work start from an idle engine
            else:
                time.sleep(plan.warmup_s)
            for r in range(plan.rounds):
                round_s = len(names) * max(per_window, statistics.fmean(spent) if spent else 0.0)
                if clock() - t_load + round_s > share:
                    why = "budget"
                    break
                for name in rotated(names, r + li):
                    tw = clock()
                    if kind == "requests":  # every policy of round r serves the round's requests
                        w = measure_requests_window(server, name, lp.policies[name], gen, load=load, round_=r,
                                                    requests=requests, settle_s=plan.settle_s,
                                                    max_num_seqs=max_num_seqs, max_k=K)
                    else:
                        gen.reseed(r)  # every policy of round r serves the same request sequence per client
                        w = measure_window(server, name, lp.policies[name], load=load, round_=r,
                                           window_s=plan.window_s, settle_s=plan.settle_s,
                                           max_num_seqs=max_num_seqs, max_k=K, min_steps=min_steps)
                    spent.append(clock() - tw)
                    windows.append(w)
                    say(f"[served] {clock() - t0:5.0f}/{plan.budget_s:.0f} s  " + window_progress_line(w))
                if r >= 1 and _progress(windows, lp, fixed, tolerance, say, dropped).status != "inconclusive":
                    why = "decided"
                    break
                if r >= 1:
                    out = outserved(windows, lp, [n for n in names if n in fixed])
                    if out:
                        names = [n for n in names if n not in out]
                        dropped.setdefault(load, set()).update(out)
                        say(f"[served] load {load}: {', '.join(out)} served less than {_best(windows, lp, fixed)} "
                            "beyond the paired noise: not served in the rounds left")
        finally:
            gen.stop(wait=not (why == "budget" or last))  # the next load starts from an empty engine
        stops.append((load, why))
        say(f"[served] load {load}: rounds stopped ({why})")
        errors += gen.errors
        if gen.errors:
            say(f"[served] load {load}: {len(gen.errors)} client errors, first: {gen.errors[0]}")
    cut = len(stops) < len(plan.loads) or any(why == "budget" for _, why in stops)
    elapsed = clock() - t0
    goodput, verdicts = judge(windows, sorted(plan.loads), fixed, tolerance=tolerance,
                              same={ld: lp.same for ld, lp in per_load.items()},
                              references={ld: lp.references for ld, lp in per_load.items()}, dropped=dropped)
    result = ServedVerification(
        candidate=tuple((int(lo), int(hi), int(k)) for lo, hi, k in candidate_table), max_k=K,
        max_num_seqs=max_num_seqs,
        plan=plan, goodput=tuple(goodput), verdicts=tuple(verdicts), tolerance=tolerance, elapsed_s=elapsed,
        budget_cut=cut, candidate_is=same, windows=tuple(windows), client_errors=len(errors),
        first_client_error=errors[0] if errors else "", device=device, acceptance=acceptance,
        stop_reasons=tuple(stops), expected_open=tuple(sizing.lines(tolerance, most)) if sizing else (),
        window=kind, requests_per_client=requests if kind == "requests" else None)
    say(f"[served] {elapsed:.0f} s: {result.summary()}")
    return result


def _best(windows: Sequence[Window], lp: LoadPolicies, fixed: Sequence[str]) -> str | None:
    """The fixed k with the highest mean goodput at the load so far, other than the candidate's own k
    there (the one the verdict judges the candidate against)."""
    by = by_round(windows, lp.load)
    means = {f: statistics.fmean(by[f].values()) for f in fixed if f != lp.same and by.get(f)}
    return max(means, key=lambda f: (means[f], f)) if means else None


def outserved(windows: Sequence[Window], lp: LoadPolicies, served: Sequence[str]) -> list[str]:
    """The fixed k among ``served`` that the best fixed k (``_best``) out-serves beyond the paired
    noise: the upper end of the interval of their paired ratio to it (mean ± t·s.e. over the rounds
    both ran, Student's t as the verdict's) lies below 1. Such a k cannot become the best fixed k the
    candidate is judged against, so its windows stop (sequential elimination); the candidate's own
    k and the best are never among them."""
    best = _best(windows, lp, served)
    if best is None:
        return []
    by = by_round(windows, lp.load)
    out = []
    for f in served:
        if f in (best, lp.same):
            continue
        ratios = paired_ratios(by.get(f, {}), by[best])
        if len(ratios) >= 2:
            r, se = mean_se(ratios)
            if r + t_quantile(len(ratios) - 1) * se < 1.0:
                out.append(f)
    return out


def _progress(windows: Sequence[Window], lp: LoadPolicies, fixed: Sequence[str], tolerance: float,
              say: Callable[[str], None], dropped: Mapping[int, set[str]]) -> LoadVerdict:
    """The load's verdict so far, printed with the rounds a decision needs at the spread measured."""
    _, (v,) = judge(windows, [lp.load], fixed, tolerance=tolerance, same={lp.load: lp.same}, dropped=dropped)
    need = ""
    if v.status == "inconclusive" and v.ratio is not None and v.ratio_se is not None and v.rounds >= 2:
        n = rounds_to_decide(v.ratio_se * math.sqrt(v.rounds), v.ratio, tolerance)
        need = f"; at this spread a verdict needs ~{n} rounds" if n is not None else "; the ratio sits on the line"
    say(f"[served] load {lp.load} after {v.rounds} round(s): {v.status}: {v.reason.split(': ', 1)[-1]}{need}")
    return v
