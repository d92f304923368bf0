"""Scripted documents for the library tests: a step-time surface with a real crossover, priors, tables."""

from __future__ import annotations

import numpy as np

from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity, StepTimeCell, StepTimeProfile

RATES = (0.7, 0.5, 0.3)
IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="tiny:small", drafter="tiny:small",
                       method="draft_model", max_k=3, max_num_seqs=16)

# Shaped like a medium target on the CPU build (ms at B = 1 / 4 / 16): verifying more drafts costs
# more as B grows, so the best k falls from 3 at small B to a shorter k at B = 16.
_ANCHORS = {None: (14.1, 15.3, 25.6), 1: (16.9, 22.6, 42.3), 3: (17.4, 28.1, 64.6)}


def scripted_ms(k: int | None, b: int) -> float:
    """Scripted T(B, k); k = 0 costs 12% more than no speculation (the drafter still runs)."""
    if k == 0:
        return scripted_ms(None, b) * 1.12
    if k == 2:
        return 0.5 * (scripted_ms(1, b) + scripted_ms(3, b))
    return float(np.interp(b, [1, 4, 16], _ANCHORS[k]))


def profile(batch_sizes=(1, 2, 4, 8, 12, 16), ks=(0, 1, 2, 3), no_spec=True, identity=IDENT) -> StepTimeProfile:
    """Every draft rejected, launch K = max_k, one cell per (k, B)."""
    cells = [StepTimeCell(k=k, batch_size=b, median_ms=scripted_ms(k, b), repetitions_ms=(scripted_ms(k, b),),
                          launch_k=identity.max_k)
             for b in batch_sizes for k in ks]
    if no_spec:
        cells += [StepTimeCell(k=None, batch_size=b, median_ms=scripted_ms(None, b),
                               repetitions_ms=(scripted_ms(None, b),)) for b in batch_sizes]
    return StepTimeProfile(identity=identity, cells=tuple(cells))


def prior(rates=RATES, drafts=2400, week="2026-11-16", source="measured", deployment="local-cpu") -> AcceptancePrior:
    """A prior whose per-position counts match its rates."""
    return AcceptancePrior(
        rates=tuple(rates), num_drafts=drafts, drafted_per_pos=tuple([drafts] * len(rates)),
        accepted_per_pos=tuple(int(round(r * drafts)) for r in rates), prompt_fingerprint=f"f-{week}-{source}",
        prompt_count=24, source=source, week=week, deployment=deployment)


def noisy_profile(noise: float = 0.05, seed: int = 0, reps: int = 3, batch_sizes=tuple(range(1, 17)),
                  ks=(0, 1, 2, 3), accept_extra_ms_per_token: float | None = None, accept_batch_sizes=(1, 8, 16),
                  identity=IDENT) -> StepTimeProfile:
    """``profile`` with ``reps`` repetitions per cell of relative noise ``noise`` (seeded); with
    ``accept_extra_ms_per_token``, all-accepted cells cost that much more per accepted draft."""
    rng = np.random.default_rng(seed)

    def cell(k, b, ms, acceptance="reject"):
        r = tuple(float(x) for x in ms * (1.0 + noise * rng.standard_normal(reps)))
        return StepTimeCell(k=k, batch_size=b, median_ms=float(np.median(r)), repetitions_ms=r, acceptance=acceptance,
                            launch_k=None if k is None else identity.max_k)

    cells = [cell(k, b, scripted_ms(k, b)) for b in batch_sizes for k in ks]
    cells += [cell(None, b, scripted_ms(None, b)) for b in batch_sizes]
    if accept_extra_ms_per_token is not None:
        cells += [cell(k, b, scripted_ms(k, b) + k * accept_extra_ms_per_token, "accept")
                  for b in accept_batch_sizes for k in ks if k >= 1]
    return StepTimeProfile(identity=identity, cells=tuple(cells))


def scripted_verification(identity: EngineIdentity, table, rates, opts):
    """A served verification of ``table`` from scripted windows (goodput B·τ(k)/T(B, k) of the scripted
    profile at B = load, 3 rounds, ±1% per round alike for every policy) judged by the real
    ``tuning.served_verdict.judge``."""
    from tabletune_pipelines.core.goodput import tau_curve
    from tabletune_pipelines.tuning import served_plan, served_verdict, served_windows

    K, M = identity.max_k, identity.max_num_seqs
    loads = tuple(opts.loads or served_plan.default_loads(M))
    taus = tau_curve(tuple(rates[:K]))
    lookup = table.draft.vllm_lookup(M, K)[1:]

    def window(policy, k, load, r):
        g = 1000.0 * load * taus[k] / scripted_ms(k, load) * (1.0 + 0.01 * ((r + load) % 3 - 1))
        return served_windows.Window(policy, load, r, int(round(g * 2.0)), 2.0, 100, float(load), 0)

    windows = []
    for load in loads:
        for r in range(3):
            windows += [window(served_windows.fixed_name(k), k, load, r) for k in range(K + 1)]
            windows.append(window(served_windows.CANDIDATE, lookup[load - 1], load, r))
    goodput, verdicts = served_verdict.judge(windows, loads, [served_windows.fixed_name(k) for k in range(K + 1)],
                                     tolerance=opts.tolerance)
    plan = served_plan.VerificationPlan(loads, 3, 2.0, 0.0, 0.0, opts.budget_s or 75.0, 0.0)
    return served_verdict.ServedVerification(
        candidate=tuple(tuple(r) for r in table.ranges), max_k=K, max_num_seqs=M, plan=plan, goodput=tuple(goodput),
        verdicts=tuple(verdicts), tolerance=opts.tolerance, elapsed_s=0.0, budget_cut=False,
        windows=tuple(windows), device="scripted", acceptance="scripted")


def scripted_profile(identity: EngineIdentity, store, batch_sizes=(1, 2, 4, 8, 12, 16), fail_after_cells: int = -1
                     ) -> StepTimeProfile:
    """What a scripted engine's profiling writes: ``scripted_ms`` at every k in 0..K and no speculation,
    three repetitions, resuming from the cells the store has; ``fail_after_cells`` >= 0 crashes the
    "server" after that many new cells (those stay stored, as a real profile's do)."""
    from tabletune_pipelines.errors import EngineCrashedError

    existing = {(c.k, c.batch_size, c.acceptance) for c in store.profile_cells(identity.key)}
    cells = []
    for b in batch_sizes:
        for k in [*range(identity.max_k + 1), None]:
            if (k, b, "reject") in existing:
                continue
            if 0 <= fail_after_cells <= len(cells):
                if cells:
                    store.write_profile_cells(identity, cells)
                raise EngineCrashedError(f"scripted crash: the vLLM server died at B={b}, k={k}",
                                         log_tail="EngineDeadError: scripted")
            ms = scripted_ms(k, b)
            cells.append(StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms * 0.99, ms, ms * 1.02),
                                      launch_k=None if k is None else identity.max_k, timing="engine"))
    if cells:
        store.write_profile_cells(identity, cells)  # one transaction (a real profile writes cell by cell)
    return store.load_profile(identity.key)


def scripted_prior(identity: EngineIdentity, dep, prompts_file, week: str, rates=RATES) -> AcceptancePrior:
    """What a scripted engine's acceptance measurement returns: ``rates`` from 100 drafts per logged prompt."""
    import hashlib

    from tabletune_pipelines.formats.prompts import count_prompts

    n = count_prompts(prompts_file)
    drafts = 100 * n
    rates = tuple(rates[: identity.max_k])
    return AcceptancePrior(
        rates=rates, num_drafts=drafts, drafted_per_pos=tuple([drafts] * identity.max_k),
        accepted_per_pos=tuple(int(round(r * drafts)) for r in rates),
        prompt_fingerprint=hashlib.sha256(prompts_file.read_bytes()).hexdigest(), prompt_count=n,
        week=week, deployment=dep.name, source="measured",
    )
