"""Step-time surfaces the simulator runs on: T(B, k) for k = 0..K and B = 1..max_num_seqs.

Two sources:

* ``from_cost_model``: the documented cost model (``evaluation.costmodel``), with the no-speculation
  baseline. Its ``profile()`` is what the tuner would have measured on that engine (its identity
  built by ``engine.identity.engine_identity``, like any other launch's): the method's
  grid (``core.steptime.batch_size_grid``: every B to 16, then every 8, ending at max_num_seqs),
  three repetitions per cell at ±0.5% (deterministic), so the evidence rule has an error to work with.
* ``from_profile``: a stored ``StepTimeProfile`` (e.g. ``benchmarks/data/h200/*.one_launch.json``).
  The simulator's *true* step time is the profile with its hiccups removed: a cell more than
  ``OUTLIER_RATIO`` times the fastest k at the same B is treated as a measurement hiccup (a step
  with k drafts costs at most ~1.4× one with k = 0 on both H200 engines), left out and
  interpolated over; then each k is made non-decreasing in B (docs/method.md, "Step time
  T(B, k)"). ``profile()`` returns the stored profile unchanged: the tuner sees what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune_pipelines.core.steptime import batch_size_grid, every_batch_size, non_decreasing_fit
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.identity import engine_identity
from tabletune_pipelines.errors import SurfaceError
from tabletune_pipelines.evaluation.costmodel import CostParams, dense_surface, step_ms
from tabletune_pipelines.formats.documents import StepTimeCell, StepTimeProfile

OUTLIER_RATIO = 1.6
"""A profile cell above this multiple of the fastest k at its B is a hiccup (see the module docstring)."""


@dataclass(frozen=True)
class Surface:
    """True step times for the simulator (ms)."""

    name: str
    """Report name."""
    description: str
    """Where the numbers come from."""
    ms: np.ndarray
    """T(B, k): shape (K + 1, max_num_seqs), row k, column B − 1."""
    nospec_ms: np.ndarray | None
    """T(B) of the engine launched without speculation (None: not measured)."""
    source_profile: StepTimeProfile | None = None
    """The stored profile (profile surfaces only)."""
    params: CostParams | None = None
    """The cost-model parameters (cost-model surfaces only)."""
    outliers: int = 0
    """Profile cells left out as hiccups."""

    @property
    def max_k(self) -> int:
        return self.ms.shape[0] - 1

    @property
    def max_num_seqs(self) -> int:
        return self.ms.shape[1]

    def t(self, batch: int, k: int | None) -> float:
        """T(B, k) in ms; ``k = None`` is the no-speculation engine."""
        if k is None:
            if self.nospec_ms is None:
                raise SurfaceError(f"surface {self.name} has no no-speculation baseline")
            return float(self.nospec_ms[batch - 1])
        return float(self.ms[k, batch - 1])

    def profile(self) -> StepTimeProfile:
        """The profile a tuner has of this engine (module docstring)."""
        if self.source_profile is not None:
            return self.source_profile
        n, K = self.max_num_seqs, self.max_k
        config = ServerConfig(model=self.name, drafter=self.name + "-drafter", method="eagle3",
                              num_speculative_tokens=K, max_num_seqs=n, device="gpu")
        ident = engine_identity(config, vllm_version="0.26.0", gpu=self.name.split("-")[0].upper(),
                                declared_cudagraph_mode="FULL_AND_PIECEWISE")
        cells = []
        for k in range(K + 1):
            for b in batch_size_grid(n):
                v = float(self.ms[k, b - 1])
                cells.append(StepTimeCell(k=k, batch_size=b, median_ms=v, repetitions_ms=(0.995 * v, v, 1.005 * v),
                                          launch_k=K))
        return StepTimeProfile(identity=ident, cells=tuple(cells), mode="one_launch")


def from_cost_model(p: CostParams, max_num_seqs: int | None = None) -> Surface:
    n = int(max_num_seqs or p.max_num_seqs)
    return Surface(name=p.name, description=p.description, ms=dense_surface(p, n),
                   nospec_ms=step_ms(p, np.arange(1, n + 1), None), params=p)


def clean_rows(cells: dict[int, dict[int, float]], ratio: float = OUTLIER_RATIO) -> tuple[np.ndarray, list[int], int]:
    """Per k, the measured T on the common grid with hiccups removed; (rows, grid, cells dropped)."""
    ks = sorted(cells)
    grid = sorted(set.intersection(*(set(cells[k]) for k in ks)))
    if not grid or grid[0] != 1:
        raise SurfaceError(f"profile grid {grid[:3]}... must start at B = 1 and be shared by every k")
    raw = np.array([[cells[k][b] for b in grid] for k in ks], dtype=float)
    keep = raw <= ratio * raw.min(axis=0, keepdims=True)
    xs = np.asarray(grid, dtype=float)
    rows = []
    for i in range(len(ks)):
        row = np.interp(xs, xs[keep[i]], raw[i, keep[i]])
        rows.append(non_decreasing_fit(row))
    return np.vstack(rows), grid, int((~keep).sum())


def from_profile(profile: StepTimeProfile, name: str | None = None) -> Surface:
    cells = profile.reject_cells()
    ks = sorted(cells)
    if ks != list(range(len(ks))):
        raise SurfaceError(f"profile {profile.identity.key} has k = {ks}; the simulator needs every k from 0 to K")
    rows, grid, dropped = clean_rows(cells)
    n = profile.identity.max_num_seqs
    ms = every_batch_size(grid, rows, n)
    ns = profile.no_spec_ms()
    nospec = None
    if ns and 1 in ns:
        xs = sorted(ns)
        nospec = every_batch_size(xs, [non_decreasing_fit([float(ns[x]) for x in xs])], n)[0]
    ident = profile.identity
    return Surface(name=name or f"{ident.gpu}-{ident.model.rsplit('/', 1)[-1]}",
                   description=f"{ident.gpu}, vLLM {ident.vllm_version}, {ident.model.rsplit('/', 1)[-1]} + "
                               f"{ident.method}, K = {ident.max_k}, measured profile ({len(profile.cells)} cells, "
                               f"{dropped} hiccup cells left out)",
                   ms=ms, nospec_ms=nospec, source_profile=profile, outliers=dropped)
