"""A documented GPU step-time cost model T(B, k) for the replay simulator (docs/evaluation.md).

One decode step with B requests and k drafts each verifies ``t = B·(k+1)`` target tokens (``t = B``
without speculation) and runs the drafter. The model, all times in ms::

    t_pad  = the smallest CUDA-graph capture size >= t          (the staircase: vLLM pads a batch
             up to the next captured size; above the largest one it runs eagerly, + eager_ms)
    frac   = 1 − (1 − a/E)^t                                    (MoE: expected share of the E experts
             of a layer that t tokens activate when each picks a of them; 1 for a dense model)
    memory = (dense_bytes + expert_bytes·frac + kv_bytes·B) / bandwidth
    comput = flops_per_token · t_pad / flops
    target = launch_ms + max(memory, comput)                    (roofline: a step is bound by one)
    spec   = spec_ms + drafter_ms(B) · max(k, 1)                (k = 0 still runs the speculative
             machinery and one drafter pass: docs/method.md, "Limitations" 3)
    drafter_ms(B) = draft_base_ms + draft_per_token_ms · pad(B)  (one drafter forward per position)
    T(B, k) = target + spec;   no speculation: T = target at t = B

The bandwidth and FLOP rate are *effective* figures (at most the datasheet's), calibrated by a
small random search (bandwidth capped at the datasheet's, FLOPs at 70% of peak) against the
published anchors and rounded; ``anchors()`` / ``calibration_table()`` show how close each lands.
The MoE's low effective FLOP rate (~17% of peak) stands for small per-expert GEMMs; the dense
surface's launch + drafter cost (~3.8 ms) is what makes fixed k = 1 15% slow at B = 1.
What the model leaves out: prefill work of arriving requests, attention FLOPs growing with
context, and work that grows with accepted tokens (docs/method.md, "Limitations" 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np


def vllm_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then every 8 up to 256, every 16 above."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return tuple(s for s in sizes if s <= max_size)


@dataclass(frozen=True)
class CostParams:
    """Parameters of one (GPU, model, drafter) cost surface."""

    name: str
    """Short name used in reports (``h100-dense-4b-eagle3``)."""
    description: str
    """What the parameter set stands for."""
    dense_bytes: float
    """Bytes of weights every step reads (all weights of a dense model; a MoE's non-expert ones)."""
    flops_per_token: float
    """Target FLOPs per verified token (2 × active parameters)."""
    bandwidth: float
    """Effective memory bandwidth, bytes per ms."""
    flops: float
    """Effective compute rate, FLOPs per ms."""
    launch_ms: float
    """Fixed per-step cost of the target pass (graph launch, scheduling, sampling)."""
    spec_ms: float
    """Fixed per-step cost of running speculation at all (rejection sampler, drafter launch)."""
    draft_base_ms: float
    """Fixed cost of one drafter forward (one draft position)."""
    draft_per_token_ms: float
    """Per-request cost of one drafter forward (its LM head and layer over B tokens)."""
    kv_bytes: float = 0.0
    """KV-cache bytes read per request and step (mean context × bytes per token)."""
    experts: int = 0
    """E: routed experts per MoE layer (0 = dense)."""
    active_experts: int = 0
    """a: experts each token activates."""
    expert_bytes: float = 0.0
    """Bytes of all routed experts (read in proportion to the share activated)."""
    capture_sizes: tuple[int, ...] = field(default_factory=vllm_capture_sizes)
    """CUDA-graph capture sizes (token counts); larger steps run eagerly."""
    eager_ms: float = 0.5
    """Extra launch cost of a step above the largest capture size (no graph)."""
    max_k: int = 3
    """K, the largest k the surface provides."""
    max_num_seqs: int = 512
    """Largest batch size the surface covers."""

    def with_(self, **kw) -> CostParams:
        return replace(self, **kw)


def pad_tokens(tokens: np.ndarray | int, sizes: Sequence[int]) -> np.ndarray:
    """Each token count padded up to the next capture size (unchanged above the largest)."""
    t = np.asarray(tokens, dtype=np.int64)
    s = np.asarray(sizes, dtype=np.int64)
    i = np.searchsorted(s, t, side="left")
    return np.where(i < s.size, s[np.minimum(i, s.size - 1)], t)


def expert_share(tokens: np.ndarray | int, experts: int, active: int) -> np.ndarray:
    """Expected share of a MoE layer's experts activated by ``tokens`` tokens, 1 − (1 − a/E)^t."""
    t = np.asarray(tokens, dtype=float)
    if experts <= 0:
        return np.ones_like(t)
    return 1.0 - (1.0 - active / experts) ** t


def step_ms(p: CostParams, batch: np.ndarray | int, k: int | None) -> np.ndarray:
    """T(B, k) in ms for the batch sizes ``batch``; ``k = None`` is the no-speculation engine."""
    b = np.asarray(batch, dtype=np.int64)
    t = b if k is None else b * (int(k) + 1)
    tp = pad_tokens(t, p.capture_sizes)
    mem = (p.dense_bytes + p.expert_bytes * expert_share(t, p.experts, p.active_experts) + p.kv_bytes * b) / p.bandwidth
    comp = p.flops_per_token * tp / p.flops
    eager = np.where(t > p.capture_sizes[-1], p.eager_ms, 0.0)
    target = p.launch_ms + eager + np.maximum(mem, comp)
    if k is None:
        return target
    drafter = p.draft_base_ms + p.draft_per_token_ms * pad_tokens(b, p.capture_sizes)
    return target + p.spec_ms + drafter * max(int(k), 1)


def dense_surface(p: CostParams, max_num_seqs: int | None = None) -> np.ndarray:
    """T(B, k) for k = 0..K (rows) and B = 1..max_num_seqs (columns)."""
    n = int(max_num_seqs or p.max_num_seqs)
    b = np.arange(1, n + 1)
    return np.vstack([step_ms(p, b, k) for k in range(p.max_k + 1)])


GB = 1e9
TB_S = 1e9  # 1 TB/s = 1e12 bytes/s = 1e9 bytes/ms
TFLOPS = 1e9  # 1 TFLOP/s = 1e9 FLOPs/ms

#: H100 SXM-class GPU, Qwen3-4B (bf16, 8 GB of weights) + an EAGLE-3 drafter.
H100_DENSE_4B = CostParams(
    name="h100-dense-4b-eagle3",
    description="H100-class (3.35 TB/s, 989 TFLOP/s bf16), dense Qwen3-4B-shaped target + EAGLE-3, K = 3",
    dense_bytes=8.0 * GB, flops_per_token=2 * 4.0e9, bandwidth=3.35 * TB_S, flops=610 * TFLOPS,
    launch_ms=3.0, spec_ms=0.009, draft_base_ms=0.75, draft_per_token_ms=2.1e-5, kv_bytes=8e6)

#: H100-class GPU, Qwen3-30B-A3B-shaped MoE (128 experts, 8 active per token) + EAGLE-3.
H100_MOE_30B = CostParams(
    name="h100-moe-30b-a3b-eagle3",
    description="H100-class, Qwen3-30B-A3B-shaped MoE (E = 128, a = 8, 57 GB of experts) + EAGLE-3, K = 3",
    dense_bytes=3.0 * GB, flops_per_token=2 * 3.3e9, bandwidth=3.35 * TB_S, flops=167 * TFLOPS,
    launch_ms=2.71, spec_ms=0.006, draft_base_ms=0.0012, draft_per_token_ms=0.0112, kv_bytes=4e6,
    experts=128, active_experts=8, expert_bytes=57.0 * GB)

#: T4-class GPU (320 GB/s, 65 TFLOP/s fp16), a dense ~1.5B target + a small drafter.
T4_DENSE = CostParams(
    name="t4-dense-1.5b",
    description="T4-class (320 GB/s, 65 TFLOP/s fp16), dense 1.5B-shaped target + a small drafter, K = 3",
    dense_bytes=3.0 * GB, flops_per_token=2 * 1.5e9, bandwidth=0.32 * TB_S, flops=22 * TFLOPS,
    launch_ms=2.23, spec_ms=0.37, draft_base_ms=0.89, draft_per_token_ms=0.02, kv_bytes=2e6)

COST_SURFACES: tuple[CostParams, ...] = (H100_DENSE_4B, H100_MOE_30B, T4_DENSE)


# ---------------------------------------------------------------------------- calibration
RATES = (0.7, 0.5, 0.3)
"""The acceptance the anchors are read with (docs/method.md, "Goodput", worked example)."""


@dataclass(frozen=True)
class Anchor:
    """A published figure and the model's value for it."""

    surface: str
    """Cost surface the figure is about."""
    what: str
    """The figure, in words."""
    published: float
    """Published value."""
    model: float
    """The cost model's value."""
    unit: str
    """``ms``, ``%`` or ``requests``."""

    @property
    def error(self) -> float:
        """Model − published, relative to the published value."""
        return (self.model - self.published) / self.published if self.published else float("nan")


def linear_fit(times: np.ndarray, ks: Sequence[int], batch_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Least-squares coefficients of T ≈ c0 + c1·B + c2·k + c3·B·k over the grid (TurboSpec-style)."""
    bb, kk = np.meshgrid(np.asarray(batch_sizes, float), np.asarray(ks, float))
    x = np.column_stack([np.ones(bb.size), bb.ravel(), kk.ravel(), (bb * kk).ravel()])
    coef, *_ = np.linalg.lstsq(x, np.asarray(times, float).ravel(), rcond=None)
    return coef


def switch_point(p: CostParams, rates: Sequence[float] = RATES, below: int = 3) -> int:
    """Smallest B where the goodput-best k is below ``below`` (the table switches down)."""
    surf = dense_surface(p)
    tau = np.concatenate([[1.0], 1.0 + np.cumsum(rates)])[: p.max_k + 1]
    best = np.argmax(tau[:, None] / surf, axis=0)
    idx = np.flatnonzero(best < below)
    return int(idx[0]) + 1 if idx.size else -1


def anchors() -> list[Anchor]:
    """The published figures (docs/method.md, "Table search") against the model."""
    d, m, t4 = H100_DENSE_4B, H100_MOE_30B, T4_DENSE
    out: list[Anchor] = []
    ns1, ns128 = float(step_ms(m, 1, None)), float(step_ms(m, 128, None))
    out.append(Anchor(m.name, "no-spec step at B = 1", 4.7, ns1, "ms"))
    out.append(Anchor(m.name, "no-spec step at B = 128", 19.7, ns128, "ms"))
    out.append(Anchor(m.name, "k = 3 overhead over no-spec at B = 1", 61.0,
                      100 * (float(step_ms(m, 1, 3)) / ns1 - 1), "%"))
    out.append(Anchor(m.name, "k = 3 overhead over no-spec at B = 128", 31.0,
                      100 * (float(step_ms(m, 128, 3)) / ns128 - 1), "%"))
    out.append(Anchor(d.name, "step at B = 80, k = 3", 9.7, float(step_ms(d, 80, 3)), "ms"))
    bs = np.arange(1, 129)
    grid = np.vstack([step_ms(d, bs, k) for k in range(d.max_k + 1)])
    c = linear_fit(grid, range(d.max_k + 1), bs)
    out.append(Anchor(d.name, "linear fit (B, k <= 128, 3) at B = 80, k = 3", 8.0,
                      float(c[0] + 80 * c[1] + 3 * c[2] + 240 * c[3]), "ms"))
    out.append(Anchor(t4.name, "first B where k < 3 wins (a = 0.7, 0.5, 0.3)", 19.0,
                      float(switch_point(t4)), "requests"))
    out.append(Anchor(d.name, "first B where k < 3 wins (a = 0.7, 0.5, 0.3)", 51.0, float(switch_point(d)), "requests"))
    surf = dense_surface(d, 128)
    tau = np.array([1.0, 1.7, 2.2, 2.5])
    g = tau[:, None] / surf
    out.append(Anchor(d.name, "fixed k = 1 loss at B = 1", 15.0, 100 * (1 - g[1, 0] / g[:, 0].max()), "%"))
    out.append(Anchor(d.name, "fixed k = 3 loss at B = 128", 12.0, 100 * (1 - g[3, 127] / g[:, 127].max()), "%"))
    gm = tau[:, None] / dense_surface(m, 128)
    # the docs' dense table runs k = 1 at 65..128 (docs/method.md, "Table search")
    out.append(Anchor(m.name, "docs' dense table loss at 96 requests", 17.5,
                      100 * (1 - gm[1, 95] / gm[:, 95].max()), "%"))
    return out


def calibration_table(rows: Sequence[Anchor] | None = None) -> str:
    """The anchors as a Markdown table (published, model, relative error)."""
    rows = anchors() if rows is None else rows
    lines = ["| surface | figure | published | model | error |", "|---|---|---|---|---|"]
    for a in rows:
        lines.append(f"| {a.surface} | {a.what} | {a.published:g} {a.unit} | {a.model:.2f} {a.unit} | "
                     f"{100 * a.error:+.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - manual calibration aid
    print(calibration_table())
