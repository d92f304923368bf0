"""The one step-cost model: what a served step costs (docs/method.md, "What a served step costs").

A profiled cell T(B, k) is a *pure decode* step: B requests, k drafts each, no prompt in the
batch. A served step also carries the prefill of the requests that arrived since the last one, and
on a GPU it runs with full, piecewise or no CUDA graphs depending on its total tokens and on
whether it carries prefill (docs/engine-facts.md, "Served steps are not profiled steps"). The model:

    D = B·(1 + k)                       decode tokens (each request's token plus its drafts)
    P                                   prefill tokens in the step
    T(B, k, 0) = T_dec(B, k)            the measured decode surface (the profile)
    T(B, k, P) = T_dec(B, k) + a_m + b_m·D + c_m·P     for P > 0

where m is the *transition* ``"<decode mode>><step mode>"``: the graph mode the pure decode step
ran in and the one the mixed step runs in (``GraphEnvelope.graph_mode``). The graph ceiling is a
discontinuity, not a smooth fit: a step of D + P tokens above ``capture_ceiling`` is priced by the
``...>none`` fit, measured beyond the ceiling, never by extrapolating the fit below it. Each
transition's (a, b, c) is a least-squares fit over mixed steps timed on the serving path, stored
with its covariance (``PrefillFit``).

A workload (``Workload``: mean prompt and output tokens) sets the prefill per step. In a closed
loop at B requests, B·τ(k)/L_out requests finish per step and are replaced; their number per step
is taken as Poisson with that mean, each bringing L_in prompt tokens (capped by the token budget
``max_num_batched_tokens`` − D, as vLLM's chunked prefill does). The served step time is the
expectation over that distribution, so a step that crosses the ceiling with one arrival is priced
at its real probability; goodput is B·τ(k) / E[T(B, k, P)] (``core.goodput``).

What the price cannot see (stalls between steps, arrivals that bunch unlike Poisson) shows in the
wall time per step that a closed loop measures for each fixed k: ``StepCost.served(...,
calibration=...)`` corrects the price with it (``core.served_calibration``).

Pure numpy, no I/O: the tuner, the controller and the simulator all price steps here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tabletune_pipelines.core.goodput import tau_curve
from tabletune_pipelines.core.served_calibration import ServedCalibration
from tabletune_pipelines.core.stats import theil_sen
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.vocab import GRAPH_MODES

#: cudagraph modes (vLLM ``CUDAGraphMode`` names, lower case) under which a pure decode step can run
#: as one FULL graph; the others run it piecewise or eagerly.
_FULL_DECODE = ("full", "full_and_piecewise", "full_decode_only")
#: cudagraph modes under which a mixed (prefill + decode) step gets a FULL graph.
_FULL_MIXED = ("full",)
#: cudagraph modes with piecewise graphs (used for mixed steps where no FULL graph applies).
_PIECEWISE = ("piecewise", "full_and_piecewise")
#: What an undeclared mode ("default") means on a GPU: vLLM's default since V1 (0.26 runs it on V2).
GPU_DEFAULT_CUDAGRAPH_MODE = "full_and_piecewise"
#: Smallest probability of an unmeasured transition that counts (``StepCost.served``).
UNMEASURED_MIN_PROBABILITY = 0.01


#: vLLM 0.26's cap on the CUDA-graph capture size when none is configured (``vllm/config/vllm.py``,
#: ``_set_cudagraph_sizes``; 1024 on Blackwell, not modelled here).
VLLM_DEFAULT_CAPTURE_CAP = 512


def default_capture_ceiling(max_num_seqs: int, max_k: int) -> int:
    """vLLM 0.26's default ``max_cudagraph_capture_size``: ``min(max_num_seqs·(1 + K)·2, 512)`` tokens."""
    return min(int(max_num_seqs) * (1 + int(max_k)) * 2, VLLM_DEFAULT_CAPTURE_CAP)


def _norm_mode(mode: str | None) -> str:
    m = str(mode or "none").strip().lower()
    return GPU_DEFAULT_CUDAGRAPH_MODE if m == "default" else m


@dataclass(frozen=True)
class GraphEnvelope:
    """The CUDA-graph envelope steps run in: which steps get graphs, and how many tokens fit a step."""

    cudagraph_mode: str = "none"
    """vLLM's ``cudagraph_mode`` (``none``, ``piecewise``, ``full``, ``full_decode_only``,
    ``full_and_piecewise``; ``default`` = ``full_and_piecewise``)."""
    capture_ceiling: int | None = None
    """Largest captured batch, in tokens (``max_cudagraph_capture_size``); a step above it runs
    without graphs. None: no graphs at all (the CPU build, ``enforce_eager``)."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget per step: prefill beyond budget − D waits (chunked prefill).
    None: no cap is modelled."""

    def __post_init__(self) -> None:
        for name in ("capture_ceiling", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidValueError(f"graph envelope: {name} = {v!r} must be a positive integer or None")

    @property
    def has_graphs(self) -> bool:
        return self.capture_ceiling is not None and _norm_mode(self.cudagraph_mode) != "none"

    def graph_mode(self, decode_tokens: Any, prefill_tokens: Any) -> np.ndarray:
        """Index into ``vocab.GRAPH_MODES`` (0 full, 1 piecewise, 2 none) of steps of D decode and
        P prefill tokens (arrays broadcast)."""
        d = np.asarray(decode_tokens, dtype=np.int64)
        p = np.asarray(prefill_tokens, dtype=np.int64)
        d, p = np.broadcast_arrays(d, p)
        none = GRAPH_MODES.index("none")
        out = np.full(d.shape, none, dtype=np.int64)
        ceiling = self.capture_ceiling
        if not self.has_graphs or ceiling is None:
            return out
        mode = _norm_mode(self.cudagraph_mode)
        under = (d + p) <= int(ceiling)
        pure = p == 0
        full_here = np.where(pure, mode in _FULL_DECODE, mode in _FULL_MIXED)
        piece_here = mode in _PIECEWISE
        out[under & full_here] = GRAPH_MODES.index("full")
        out[under & ~full_here & piece_here] = GRAPH_MODES.index("piecewise")
        return out

    def transition(self, decode_tokens: int, prefill_tokens: int) -> str:
        """``"<mode of the pure decode step>><mode of this step>"``, e.g. ``full>none``."""
        dm = GRAPH_MODES[int(self.graph_mode(decode_tokens, 0))]
        sm = GRAPH_MODES[int(self.graph_mode(decode_tokens, prefill_tokens))]
        return f"{dm}>{sm}"

    def to_dict(self) -> dict[str, Any]:
        return {"cudagraph_mode": self.cudagraph_mode, "capture_ceiling": self.capture_ceiling,
                "max_num_batched_tokens": self.max_num_batched_tokens}


@dataclass(frozen=True)
class Workload:
    """What the traffic brings per request: it sets the prefill each served step carries."""

    prompt_tokens: float
    """L_in: mean prompt length in tokens (from the logged prompts)."""
    output_tokens: float
    """L_out: mean output length in tokens (from the live counters or a served measurement)."""
    source: str = ""
    """Where the figures come from, in words (shown in the table's provenance)."""

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidValueError(f"workload: {name} = {v!r} must be a finite number of tokens > 0")
        if self.output_tokens < 1:
            raise InvalidValueError(f"workload: output_tokens = {self.output_tokens!r} must be >= 1")

    def arrivals_per_step(self, batch: Any, tau: float) -> np.ndarray:
        """Mean requests admitted per step in a closed loop of B requests: B·τ(k) / L_out."""
        return np.asarray(batch, dtype=float) * float(tau) / float(self.output_tokens)

    def describe(self) -> str:
        """The workload in words, as gates and metadata show it."""
        return f"{self.prompt_tokens:g}-token prompts and {self.output_tokens:g}-token outputs"

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": float(self.prompt_tokens), "output_tokens": float(self.output_tokens),
                "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Workload:
        return cls(prompt_tokens=d["prompt_tokens"], output_tokens=d["output_tokens"], source=str(d.get("source", "")))


@dataclass(frozen=True)
class StepSample:
    """One timed step, described by what it carried."""

    batch: int
    """Requests decoding in the step (arrivals not counted)."""
    k: int
    """Drafts per decoding request."""
    decode_tokens: int
    """Tokens of the decoding requests: their own plus their drafts."""
    prefill_tokens: int
    """Prompt tokens of the requests admitted (or continuing a chunked prefill) in the step."""
    ms: float
    """The step's wall interval, milliseconds."""


def samples_from_step_log(steps: Iterable[Mapping[str, Any]], *, max_batch: int | None = None,
                          full_drafts: bool = True) -> list[StepSample]:
    """Step-log records (``engine.timing_scheduler``) as samples.

    A record counts when the step before it was busy too (its ``dt`` is one step, not an idle
    gap), it says its k, and, with ``full_drafts``, every decoding request verified all k drafts
    (a request near its end may draft fewer: its cost is not the cell's). Decoding requests are
    ``b − new``; prefill tokens are ``tok − (b − new) − d``.
    """
    out: list[StepSample] = []
    prev_b = 0
    for s in steps:
        b, new, dt, k = s.get("b"), int(s.get("new", 0) or 0), s.get("dt"), s.get("k")
        before, prev_b = prev_b, (b if isinstance(b, int) else 0)
        if not (isinstance(b, int) and b > 0 and before > 0 and dt is not None and isinstance(k, int) and k >= 0):
            continue
        dec = b - new
        d = int(s.get("d", 0) or 0)
        if dec < 1 or (max_batch is not None and dec > max_batch):
            continue
        if full_drafts and d != dec * k:
            continue
        tok = int(s.get("tok", dec + d) or 0)
        p = tok - dec - d
        if p < 0:
            continue
        out.append(StepSample(batch=dec, k=k, decode_tokens=dec + d, prefill_tokens=p, ms=float(dt)))
    return out


def attribute_mixed_steps(batch: Sequence[StepSample]) -> list[StepSample]:
    """The samples of ONE decoding batch (same B and k, in log order) with each mixed step's cost
    counted wherever the scheduler put it.

    A step's interval (``dt``) ends at its output. With vLLM's async scheduling (the GPU default) the
    engine prepares step n+1 (the kernel launches of an eager step among it) before it processes
    output n, so part of a mixed step's cost lands in the interval before it and the steps around it
    look cheaper: on an H200 a mixed step at B = 127, k = 3 above the capture ceiling logged 6.5 ms,
    and the step before it 31-33 ms, against 10 ms for a quiet decode step. So a mixed step n whose
    neighbours are pure decode steps costs ``dt(n−1) + dt(n) + dt(n+1) − 2·q``, with ``q`` the
    median interval of quiet decode steps (pure, with pure neighbours) of the same batch; on a
    synchronous scheduler (the CPU build) this is dt(n). Returns the quiet decode steps and the
    mixed steps so attributed (mixed steps next to another mixed step are dropped).
    """
    s = list(batch)
    pure = [x.prefill_tokens == 0 for x in s]
    quiet = [s[i] for i in range(1, len(s) - 1) if pure[i - 1] and pure[i] and pure[i + 1]]
    if len(quiet) < 3:
        return []
    q = float(np.median([x.ms for x in quiet]))
    out = list(quiet)
    for i in range(1, len(s) - 1):
        if not pure[i] and pure[i - 1] and pure[i + 1]:
            cost = s[i - 1].ms + s[i].ms + s[i + 1].ms - 2.0 * q
            out.append(dataclasses.replace(s[i], ms=max(cost, 1e-3)))
    return out


@dataclass(frozen=True)
class PrefillFit:
    """Extra cost of a mixed step over its pure decode step, for one graph transition:
    ``a + b·D + c·P`` ms, with the covariance of (a, b, c)."""

    transition: str
    """``"<decode mode>><step mode>"`` (``GraphEnvelope.transition``)."""
    coef: tuple[float, float, float]
    """(a ms, b ms per decode token, c ms per prefill token)."""
    cov: tuple[tuple[float, float, float], ...]
    """3 × 3 covariance of ``coef`` (zero row/column for a term held at 0)."""
    n: int
    """Steps the fit used."""
    rmse_ms: float
    """Root mean square residual, ms."""
    decode_tokens_range: tuple[int, int]
    """Smallest and largest D fitted."""
    prefill_tokens_range: tuple[int, int]
    """Smallest and largest P fitted."""

    def extra_ms(self, decode_tokens: Any, prefill_tokens: Any) -> np.ndarray:
        a, b, c = self.coef
        return a + b * np.asarray(decode_tokens, float) + c * np.asarray(prefill_tokens, float)

    def extra_var(self, decode_tokens: Any, prefill_tokens: Any) -> np.ndarray:
        d = np.asarray(decode_tokens, float)
        p = np.asarray(prefill_tokens, float)
        x = np.stack(np.broadcast_arrays(np.ones_like(d * p), d, p), axis=-1)
        c = np.asarray(self.cov, float)
        return np.einsum("...i,ij,...j->...", x, c, x)

    def to_dict(self) -> dict[str, Any]:
        a, b, c = self.coef
        se = [math.sqrt(max(self.cov[i][i], 0.0)) for i in range(3)]
        return {"transition": self.transition, "a_ms": a, "b_ms_per_decode_token": b, "c_ms_per_prefill_token": c,
                "a_se": se[0], "b_se": se[1], "c_se": se[2], "cov": [list(r) for r in self.cov], "n": self.n,
                "rmse_ms": self.rmse_ms, "decode_tokens_range": list(self.decode_tokens_range),
                "prefill_tokens_range": list(self.prefill_tokens_range)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrefillFit:
        rows = tuple(tuple(float(x) for x in row) for row in d["cov"])
        if len(rows) != 3 or any(len(r) != 3 for r in rows):
            raise InvalidValueError(f"prefill fit {d.get('transition')!r}: cov must be 3 x 3")
        ranges: dict[str, tuple[int, int]] = {}
        for name in ("decode_tokens_range", "prefill_tokens_range"):
            pair = tuple(int(x) for x in d[name])
            if len(pair) != 2:
                raise InvalidValueError(f"prefill fit {d.get('transition')!r}: {name} {list(pair)} must be "
                                        "[smallest, largest]")
            ranges[name] = (pair[0], pair[1])
        return cls(transition=str(d["transition"]),
                   coef=(float(d["a_ms"]), float(d["b_ms_per_decode_token"]), float(d["c_ms_per_prefill_token"])),
                   cov=tuple((r[0], r[1], r[2]) for r in rows), n=int(d["n"]), rmse_ms=float(d["rmse_ms"]),
                   decode_tokens_range=ranges["decode_tokens_range"],
                   prefill_tokens_range=ranges["prefill_tokens_range"])


#: Fewest mixed steps a transition's fit needs.
MIN_FIT_STEPS = 6
#: Residuals beyond this many robust standard deviations are dropped before the final fit (pauses).
OUTLIER_SIGMAS = 4.0


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = max(1, x.shape[0] - x.shape[1])
    s2 = float(resid @ resid) / dof
    xtx_inv = np.linalg.pinv(x.T @ x)
    return coef, s2 * xtx_inv, math.sqrt(float(resid @ resid) / max(1, x.shape[0]))


def _decode_base(rows: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """The pure decode steps' time at D decode tokens (``fit_prefill_costs``): their median where
    every step carried the same D, else their Theil-Sen line (verifying more tokens is never
    cheaper) at D held within the D they carried."""
    ds = [d for d, _ in rows]
    lo, hi = min(ds), max(ds)
    if lo == hi:
        med = float(np.median([ms for _, ms in rows]))
        return lambda d: med
    intercept, slope = theil_sen(((float(d), ms) for d, ms in rows), min_slope=0.0)
    return lambda d: intercept + slope * min(max(float(d), lo), hi)


def fit_prefill_costs(samples: Sequence[StepSample], decode_ms: Any, envelope: GraphEnvelope) -> dict[str, PrefillFit]:
    """One ``PrefillFit`` per transition seen in ``samples`` (those with P > 0 and ≥ ``MIN_FIT_STEPS``).

    The extra cost is measured against the pure decode steps of the same batch size and k among
    ``samples`` (same launch, so launch-to-launch drift cancels) where there are
    ``MIN_FIT_STEPS`` of them, else against ``decode_ms(k, B)`` (the profile's surface). Where
    those pure steps carry different decode tokens (a drafter that proposes fewer than k tokens for
    part of the batch: n-gram lookup), the base is their Theil-Sen line over decode tokens at the
    mixed step's own D (held within the pure steps' range); else their median. A term whose
    regressor does not vary (one D, or one P) is held at 0.
    """
    pure: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for s in samples:
        if s.prefill_tokens == 0:
            pure.setdefault((s.k, s.batch), []).append((s.decode_tokens, s.ms))
    bases = {key: _decode_base(rows) for key, rows in pure.items() if len(rows) >= MIN_FIT_STEPS}
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for s in samples:
        if s.prefill_tokens <= 0:
            continue
        tr = envelope.transition(s.decode_tokens, s.prefill_tokens)
        at = bases.get((s.k, s.batch))
        base = float(decode_ms(s.k, s.batch)) if at is None else at(s.decode_tokens)
        groups.setdefault(tr, []).append((float(s.decode_tokens), float(s.prefill_tokens), s.ms - base))
    fits: dict[str, PrefillFit] = {}
    for tr, rows in sorted(groups.items()):
        if len(rows) < MIN_FIT_STEPS:
            continue
        arr = np.asarray(rows, float)
        d, p, y = arr[:, 0], arr[:, 1], arr[:, 2]
        cols = [0] + [i for i, v in ((1, d), (2, p)) if np.ptp(v) > 0]
        full = np.column_stack([np.ones_like(d), d, p])
        keep = np.ones(len(y), bool)
        for _ in range(2):
            x = full[keep][:, cols]
            coef, _, _ = _ols(x, y[keep])
            resid = y - full[:, cols] @ coef
            mad = float(np.median(np.abs(resid[keep] - np.median(resid[keep])))) * 1.4826
            if mad <= 0:
                break
            new_keep = np.abs(resid) <= OUTLIER_SIGMAS * mad
            if new_keep.sum() < MIN_FIT_STEPS or np.array_equal(new_keep, keep):
                break
            keep = new_keep
        x = full[keep][:, cols]
        coef_c, cov_c, rmse = _ols(x, y[keep])
        coef3 = np.zeros(3)
        cov3 = np.zeros((3, 3))
        coef3[cols] = coef_c
        cov3[np.ix_(cols, cols)] = cov_c
        fits[tr] = PrefillFit(transition=tr, coef=(float(coef3[0]), float(coef3[1]), float(coef3[2])),
                              cov=tuple((float(r[0]), float(r[1]), float(r[2])) for r in cov3), n=int(keep.sum()),
                              rmse_ms=float(rmse),
                              decode_tokens_range=(int(d[keep].min()), int(d[keep].max())),
                              prefill_tokens_range=(int(p[keep].min()), int(p[keep].max())))
    return fits


@dataclass(frozen=True)
class ServedCost:
    """E[T(B, k, P)] under a workload, per (k, B), with what it rests on."""

    ms: np.ndarray
    """Expected served step time, shape (len(ks), N)."""
    var: np.ndarray
    """Variance of ``ms`` from the prefill fits (the decode surface's own error is not included)."""
    extra_ms: np.ndarray
    """The expected prefill/graph extra alone (``ms`` − the decode surface)."""
    unmeasured: np.ndarray
    """Per (k, B): probability that a served step falls in a transition no fit covers."""
    cliff: np.ndarray
    """Per (k, B): probability that a served step falls off the graphs (a graphed decode step whose
    prefill takes it above the capture ceiling) in a transition no fit covers: the cliff unmeasured."""
    arrivals: np.ndarray
    """Mean requests admitted per step (B·τ(k)/L_out)."""
    offset_ms: np.ndarray | None = None
    """The served calibration's correction alone (already in ``ms``); None: not calibrated."""
    cross_cov: np.ndarray | None = None
    """Covariance of ``ms`` between ks at each B, (K, K, N), zero diagonal: ks measured in the same
    rounds (None: independent)."""
    calibration: ServedCalibration | None = None
    """The served measurements ``ms`` was corrected by (None: priced only)."""


@dataclass(frozen=True)
class StepExtra:
    """One step's mixed-step extra, ``a + b·D + c·P`` ms of its transition's fit, in closed form
    (``StepCost.step_extra``): the same price as ``StepCost.step_ms`` minus the decode surface, in a
    few float operations and no numpy, for a loop that runs once per engine step (the controller
    prices every served step it observes by the prefill that step carried).

    On a graphed engine a step falls in one of three classes, each one transition of
    ``GraphEnvelope``: its pure decode step (D tokens) and the step itself (D + P) both within the
    capture ceiling; the decode step within and the step above (the cliff); both above. Without
    graphs there is one class. A class no fit covers is priced at 0, as ``step_ms`` prices it."""

    ceiling: int | None
    """The capture ceiling in tokens; None: no graphs (every step in the last class)."""
    coefs: tuple[tuple[float, float, float] | None, ...]
    """(a, b, c) of the fit per class, in the order above; None: no fit covers it."""

    def ms(self, decode_tokens: int, prefill_tokens: int) -> float:
        """The extra ms of a step of ``decode_tokens`` decode and draft tokens and ``prefill_tokens``
        prompt tokens (0 for a pure decode step)."""
        if prefill_tokens <= 0:
            return 0.0
        c = self.ceiling
        cls = 2 if c is None or decode_tokens > c else (1 if decode_tokens + prefill_tokens > c else 0)
        f = self.coefs[cls]
        return 0.0 if f is None else f[0] + f[1] * decode_tokens + f[2] * prefill_tokens


@dataclass(frozen=True)
class StepCost:
    """The served step cost of one engine: decode surface + graph envelope + prefill fits."""

    ks: tuple[int, ...]
    """Draft lengths, ascending (rows of ``decode_ms``)."""
    decode_ms: np.ndarray
    """Pure decode T(B, k), shape (len(ks), N) for B = 1..N."""
    envelope: GraphEnvelope = field(default_factory=GraphEnvelope)
    """Which steps get graphs."""
    fits: Mapping[str, PrefillFit] = field(default_factory=dict)
    """Mixed-step extra cost per transition."""

    def __post_init__(self) -> None:
        dm = np.asarray(self.decode_ms, float)
        if dm.ndim != 2 or dm.shape[0] != len(self.ks):
            raise InvalidValueError(f"decode_ms has shape {dm.shape}; expected ({len(self.ks)}, N)")
        object.__setattr__(self, "decode_ms", dm)

    @property
    def max_num_seqs(self) -> int:
        return int(self.decode_ms.shape[1])

    def _row(self, k: int) -> int:
        if k not in self.ks:
            raise InvalidValueError(f"k = {k!r} is not in this cost model (ks: {list(self.ks)})")
        return self.ks.index(k)

    def fit_for(self, transition: str) -> PrefillFit | None:
        """The fit of ``transition``, else one with the same step mode (the decode mode shifts only
        a, measured elsewhere), else None."""
        if transition in self.fits:
            return self.fits[transition]
        step_mode = transition.split(">")[1]
        same = [f for t, f in sorted(self.fits.items()) if t.split(">")[1] == step_mode]
        return same[0] if same else None

    def step_ms(self, batch: Any, k: int, prefill_tokens: Any = 0) -> np.ndarray:
        """T(B, k, P) for arrays B (1..N) and P; an unmeasured transition is priced as pure decode
        (``served`` reports where that happens)."""
        b = np.asarray(batch, dtype=np.int64)
        p = np.asarray(prefill_tokens, dtype=np.int64)
        b, p = np.broadcast_arrays(b, p)
        if b.size and (b.min() < 1 or b.max() > self.max_num_seqs):
            raise InvalidValueError(f"batch sizes {int(b.min())}..{int(b.max())} are outside 1..{self.max_num_seqs}")
        base = self.decode_ms[self._row(k)][b - 1]
        d = b * (1 + int(k))
        out = np.array(base, dtype=float, copy=True)
        mixed = p > 0
        if mixed.any():
            dmode = self.envelope.graph_mode(d, 0)
            smode = self.envelope.graph_mode(d, p)
            for dm in np.unique(dmode[mixed]):
                for sm in np.unique(smode[mixed & (dmode == dm)]):
                    sel = mixed & (dmode == dm) & (smode == sm)
                    fit = self.fit_for(f"{GRAPH_MODES[dm]}>{GRAPH_MODES[sm]}")
                    if fit is not None:
                        out[sel] += fit.extra_ms(d[sel], p[sel])
        return out

    def step_extra(self) -> StepExtra:
        """This model's mixed-step extra of one step in closed form (``StepExtra``): the price
        ``step_ms`` adds to the decode surface, for a per-step hot loop."""
        env = self.envelope
        if not env.has_graphs or env.capture_ceiling is None:
            fit = self.fit_for(env.transition(1, 1))
            return StepExtra(ceiling=None, coefs=(None, None, None if fit is None else fit.coef))
        c = int(env.capture_ceiling)
        # One step of each class (StepExtra): within the ceiling (none when it is 1 token), the cliff, above.
        within = self.fit_for(env.transition(1, 1)) if c >= 2 else None
        cliff = self.fit_for(env.transition(1, c))
        above = self.fit_for(env.transition(c + 1, 1))
        return StepExtra(ceiling=c, coefs=tuple(None if f is None else f.coef for f in (within, cliff, above)))

    def served(self, rates: Sequence[float] | np.ndarray, workload: Workload | None,
               calibration: ServedCalibration | None = None) -> ServedCost:
        """Expected served step time per (k, B) under ``workload`` (module docstring); with no
        workload, the decode surface itself. ``calibration``: served measurements that correct
        the price (``ServedCalibration``)."""
        priced = self._priced(rates, workload)
        if calibration is None:
            return priced
        off, var, cross = calibration.offsets(priced.ms, priced.var, self.ks)
        return dataclasses.replace(priced, ms=np.maximum(priced.ms + off, 1e-6), var=var,
                                   extra_ms=priced.extra_ms + off, offset_ms=off, cross_cov=cross,
                                   calibration=calibration)

    def _priced(self, rates: Sequence[float] | np.ndarray, workload: Workload | None) -> ServedCost:
        n = self.max_num_seqs
        shape = self.decode_ms.shape
        if workload is None:
            z = np.zeros(shape)
            return ServedCost(ms=self.decode_ms.copy(), var=z, extra_ms=z.copy(), unmeasured=z.copy(), cliff=z.copy(),
                              arrivals=z.copy())
        taus = tau_curve(rates)
        b = np.arange(1, n + 1)
        extra = np.zeros(shape)
        var = np.zeros(shape)
        unmeasured = np.zeros(shape)
        cliff = np.zeros(shape)
        arrivals = np.zeros(shape)
        none = GRAPH_MODES.index("none")
        for i, k in enumerate(self.ks):
            if k >= len(taus):
                raise InvalidValueError(f"k = {k} needs a_{k}; only {len(taus) - 1} acceptance rates given")
            lam = workload.arrivals_per_step(b, float(taus[k]))
            arrivals[i] = lam
            d = b * (1 + k)
            nmax = int(math.ceil(lam.max() + 8.0 * math.sqrt(lam.max()) + 8.0))
            pmf = np.exp(-lam)  # P(n = 0)
            dmode = self.envelope.graph_mode(d, 0)
            for m in range(1, nmax + 1):
                pmf = pmf * lam / m
                p = np.full(n, m * float(workload.prompt_tokens))
                if self.envelope.max_num_batched_tokens is not None:
                    p = np.minimum(p, np.maximum(self.envelope.max_num_batched_tokens - d, 0))
                p = np.round(p).astype(np.int64)
                smode = self.envelope.graph_mode(d, p)
                for dm in np.unique(dmode):
                    for sm in np.unique(smode[dmode == dm]):
                        sel = (dmode == dm) & (smode == sm) & (p > 0)
                        if not sel.any():
                            continue
                        fit = self.fit_for(f"{GRAPH_MODES[dm]}>{GRAPH_MODES[sm]}")
                        if fit is None:
                            unmeasured[i, sel] += pmf[sel]
                            if sm == none and dm != none:
                                cliff[i, sel] += pmf[sel]
                            continue
                        extra[i, sel] += pmf[sel] * fit.extra_ms(d[sel], p[sel])
                        var[i, sel] += pmf[sel] ** 2 * fit.extra_var(d[sel], p[sel])
        ms = self.decode_ms + extra
        return ServedCost(ms=np.maximum(ms, 1e-6), var=var, extra_ms=extra, unmeasured=unmeasured, cliff=cliff,
                          arrivals=arrivals)

    def summary(self) -> dict[str, Any]:
        """The envelope and every fit, as stored with a profile and shown in metadata."""
        return {"envelope": self.envelope.to_dict(), "fits": {t: f.to_dict() for t, f in sorted(self.fits.items())}}


def unmeasured_cells(cost: ServedCost, ks: Sequence[int], dense_k: Sequence[int],
                     min_probability: float = UNMEASURED_MIN_PROBABILITY, *,
                     cliff_only: bool = False) -> list[tuple[int, int, float]]:
    """``(B, k, probability)`` where the table's k (``dense_k``, index B−1) runs served steps in a
    transition no fit covers (``cliff_only``: across the capture ceiling) with at least
    ``min_probability``."""
    out = []
    grid = cost.cliff if cliff_only else cost.unmeasured
    for b, k in enumerate(dense_k, start=1):
        i = list(ks).index(int(k))
        pr = float(grid[i, b - 1])
        if pr >= min_probability:
            out.append((b, int(k), pr))
    return out
