"""Scripted documents for the library tests: a step-time surface with a real crossover, priors, tables."""

from __future__ import annotations

import numpy as np

from tabletune_pipelines.documents import AcceptancePrior, EngineIdentity, StepTimeCell, StepTimeProfile

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
