"""Cost observation: which step intervals are observations of T(B, k), gathered between rebuilds
(docs/controller.md, "Live step-time correction" and "Served steps").

Owned by ``logic.Controller`` (one per published version with a step-time profile); per step one
call, nothing allocated but a cell the first time it is visited; numpy only at the rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tabletune_pipelines.controller.step_correction import StepTimeModel
from tabletune_pipelines.core.stepcost import StepExtra


def _observe(cells: dict[int, list[float]], key: int, ms: float, m: float | None = None) -> None:
    """Add one step to its cell: ``[sum ms, count, sum ms²]`` for a clean step (``m`` None) and
    ``[sum ms, count, sum ms², sum m, sum m², sum ms·m]`` for a served one (m: the extra its own
    prefill is priced at). A list is allocated only the first time a cell is visited."""
    cell = cells.get(key)
    if cell is None:
        cells[key] = [ms, 1.0, ms * ms] if m is None else [ms, 1.0, ms * ms, m, m * m, ms * m]
        return
    cell[0] += ms
    cell[1] += 1.0
    cell[2] += ms * ms
    if m is not None:
        cell[3] += m
        cell[4] += m * m
        cell[5] += ms * m


class CostObserver:
    """Step intervals since the last rebuild, per cell ``row * (n + 1) + B`` (row: the k's row of
    the profile), as ``[sum ms, count, sum of squares]``: only the cells visited (a handful), so
    handing them over costs nothing at max_num_seqs 1024.

    ``ks``: the profile's k (its rows); ``profile_ms``: T(B, k) per row, index B - 1; ``tol``:
    ``step_time_outlier_ratio``; ``max_k``, ``n``: the engine's K and max_num_seqs; ``extra``: the
    published served model's price of one step's prefill (None: the table was priced on decode
    steps alone, and a served step's prefill is priced at 0)."""

    def __init__(self, ks: Sequence[int], profile_ms: np.ndarray, tol: float, max_k: int, n: int,
                 extra: StepExtra | None = None) -> None:
        self.K, self.n = int(max_k), int(n)
        self.tol = float(tol)
        self.extra = extra
        self.k_row = [-1] * (self.K + 1)
        for i, k in enumerate(ks):
            self.k_row[k] = i
        self.tp: list[list[float]] = [[0.0, *row] for row in np.asarray(profile_ms).tolist()]
        self.clean: dict[int, list[float]] = {}
        """Clean decode steps' intervals (the profile's kind of step)."""
        self.served: dict[int, list[float]] = {}
        """Every served step's intervals, with the extra its prefill is priced at (``_observe``)."""

    def observe(self, dt: float, b: int, k: int | None, prev_b: int, prev_k: int | None, decode_only: bool,
                decode_tokens: int = 0, prefill_tokens: int = 0) -> None:
        """One step's interval ``dt`` (s) at ``b`` requests and k = ``k``, after a step of ``prev_b``
        requests at ``prev_k``; ``decode_only``: nothing admitted and no prefill tokens;
        ``decode_tokens`` / ``prefill_tokens``: what the step carried (its decoding requests' tokens
        and drafts; the prompt tokens it admitted).

        Each served step also carries the extra its own prefill is priced at by the published
        served model (``extra``): the served extra then counts what a step cost beyond its own
        priced content, so steps whose prefill serving at that batch size will not keep bringing
        (the ramp-up to a new load admits dozens of prompts a step) do not price the k they ran
        at (docs/controller.md, "Served steps").

        Every served step is an observation of what serving pays at (B, k), prefill and graph changes
        included; but not the first step at a new k, which carries the switch: a k seen only in
        exploration runs would pay it on a third of its steps and the k in force never (one CPU run:
        0.47 ms of extra at the explored k = 1 against 0.15 at the k in force). A clean decode step
        (same requests' count and k as the step before, ``decode_only``) is one whole step at
        (B, k), as the profile timed it. Judged by the k each step reports, not by which lookup was
        handed out last: with the async scheduler the next step is scheduled before this one's
        output arrives. Intervals beyond the outlier ratio are pauses, not steps."""
        if k is None or k != prev_k or not 0 <= k <= self.K or b > self.n or not self.tp:
            return
        row = self.k_row[k]
        if row < 0:
            return
        ms = dt * 1000.0
        tp, tol = self.tp[row][b], self.tol
        key = row * (self.n + 1) + b
        if ms <= tp * tol * tol:
            ex = self.extra
            _observe(self.served, key, ms, 0.0 if ex is None else ex.ms(decode_tokens, prefill_tokens))
        if decode_only and b == prev_b and tp / tol <= ms <= tp * tol:
            _observe(self.clean, key, ms)

    def cells(self, obs: dict[int, list[float]], shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        """Observed cells ``{row * (n + 1) + B: [sum ms, count, sum of squares, ...]}`` as one array
        of the profile's shape per column (sums, counts, sums of squares, and for served cells the
        priced extra's sum, sum of squares and cross sum)."""
        keys = np.fromiter(obs.keys(), dtype=np.int64, count=len(obs))
        vals = np.asarray(list(obs.values()), dtype=float)
        rows, bs = np.divmod(keys, self.n + 1)
        out = tuple(np.zeros(shape) for _ in range(vals.shape[1]))
        for m, arr in enumerate(out):
            arr[rows, bs - 1] = vals[:, m]
        return out

    def hand_over(self, model: StepTimeModel) -> None:
        """Add the cells observed since the last call to ``model`` (clean ones to its decode surface,
        all to its served extra) and start afresh."""
        if self.clean:
            model.add(*self.cells(self.clean, model.profile.shape))
            self.clean = {}
        if self.served:
            model.add_served(*self.cells(self.served, model.profile.shape))
            self.served = {}
