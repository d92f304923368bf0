"""The per-step path allocates nothing that stays or grows with the batch.

``next_lookup`` and ``on_step`` run every engine step; they count into preallocated histograms and
add to plain fields of the controller's parts (``evidence.Evidence``, ``window.ExportWindow``,
``search.TableInForce``, ``exploration.Exploration``). Measured with ``tracemalloc`` over steps whose
outcomes are built beforehand, between rebuilds and exports, exploration runs included: the memory
held after the steps is what it was before, and the peak does not grow with the batch size (a list or
dict per request, or one of the batch's length, would).
"""

from __future__ import annotations

import logging
import tracemalloc

from tabletune_pipelines.controller.loader import EngineFacts
from tabletune_pipelines.controller.logic import Controller
from tabletune_pipelines.controller.step import StepOutcome
from tabletune_pipelines.evaluation.synthetic import IDENTITY, linear_profile, publish

K, N = 3, 256
QUIET = {"rebuild_every_steps": 100_000, "export_every_steps": 1_000_000, "export_every_s": 3600.0,
         "step_time_outlier_ratio": 1000.0, "exploration_every_steps": 7}


def outcomes(b: int, count: int, t0: float) -> list[StepOutcome]:
    """``count`` steps of ``b`` requests at k = K, kept drafts varying, 0.1 ms apart from ``t0``."""
    ids = [f"r{i}" for i in range(b)]
    idx = {r: i for i, r in enumerate(ids)}
    nst, spec = {r: 1 + K for r in ids}, {r: [7] * K for r in ids}
    sampled = [[[1] * (1 + (j + i) % (K + 1)) for i in range(b)] for j in range(4)]
    return [StepOutcome(nst, spec, idx, sampled[j % 4], K, 0, b * (1 + K), t0 + 1e-4 * (j + 1)) for j in range(count)]


def test_the_per_step_hooks_keep_nothing_and_do_not_grow_with_the_batch(tmp_path):
    quiet = logging.getLogger("tabletune.tests.hot_path")  # its own logger: the controller's level stays as it is
    quiet.setLevel(logging.ERROR)
    p = publish(tmp_path / "p.json", ranges=[(1, N, K)], rates=[0.7, 0.5, 0.3], profile=linear_profile(N, K),
                allowed_k=[0, 1, 2, 3], n=N, k_max=K, identity=dict(IDENTITY, max_k=K, max_num_seqs=N), controller=QUIET)
    clock = [0.0]
    c = Controller(EngineFacts(K, N, ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, N, K))), p, clock=lambda: clock[0], log=quiet)
    assert c.controlling and c.exploration is not None
    held, peaks = {}, {}
    tracemalloc.start()
    try:
        for b in (1, 64, N):
            steps = outcomes(b, 1000, clock[0])
            for s in steps[:200]:  # warm up: the cells visited for the first time, the first exploration runs
                c.next_lookup()
                c.on_step(s)
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for s in steps[200:]:
                c.next_lookup()
                c.on_step(s)
            now, peak = tracemalloc.get_traced_memory()
            held[b], peaks[b] = now - before, peak - before
            clock[0] = steps[-1].now
    finally:
        tracemalloc.stop()
    assert c.steps == 3000 and c.counters.exploration_steps > 0 and c.rebuilds == 0 and c.exports == 0
    assert max(held.values()) <= 256, held  # nothing kept per step (a few bytes of interpreter caches)
    assert peaks[N] - peaks[1] < 1024, peaks  # 256 requests need no more room than 1
