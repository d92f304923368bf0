"""Two adaptive baselines as controller variants (evaluation only: a production engine, whose plugin is
``controller.scheduler``, never imports this module; ``evaluation.scheduler`` runs them in vLLM):
the same hooks as ``logic.Controller`` (``next_lookup()`` before a step, ``on_step(step)`` after it,
``close()``), so the vLLM adapter or the replay simulator
(``tabletune_pipelines.evaluation.simulator``) drives them unchanged. Stdlib + numpy, no vLLM. What
each implements from its paper is in docs/evaluation.md, "Baselines".

* ``TurboSpecPolicy`` (SmartSpec/TurboSpec, arXiv 2406.14066, "Optimizing Speculative Decoding for
  Serving Large Language Models Using Goodput"): every step, for every batch size B, the k that
  maximises the predicted goodput B·τ̂(k) / T_lin(B, k). T_lin is a *linear* least-squares model
  of the profile, T ≈ c0 + c1·B + c2·k + c3·B·k (the paper models batch time as linear in the
  batched tokens B·(k+1) and the drafter's time as linear per proposal step). τ̂ follows the
  paper's acceptance model: one per-token acceptance rate α̂, estimated from live counts with an
  exponential forgetting, and τ̂(k) = (1 − α̂^(k+1)) / (1 − α̂).
  The live counts follow the controller's rule (``controller.step.count_drafts``: a request with
  an empty output counts nothing).
* ``NightjarPolicy`` ("Nightjar: Dynamic Adaptive Speculative Decoding for Large Language Models
  Serving", arXiv 2512.22420): an independent multi-armed bandit per batch size choosing k from
  the observed goodput of its own steps. The paper's planner is a MAB per batch size; the exact
  bandit rule is not reproduced here: this is UCB1 (Auer et al. 2002) with exploration constant
  ``c`` on rewards normalised by the largest seen. Its offloading of the drafter under memory
  pressure is out of scope (no KV-cache model here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from tabletune_pipelines.controller.step import StepOutcome, count_drafts
from tabletune_pipelines.core.table import vllm_layout
from tabletune_pipelines.errors import EmptyProfileError, InvalidValueError, PublishedTableError


def linear_step_model(step_ms: Mapping[int, Mapping[int, float]]) -> np.ndarray:
    """Least-squares (c0, c1, c2, c3) of T ≈ c0 + c1·B + c2·k + c3·B·k over a profile ``{k: {B: ms}}``."""
    rows, y = [], []
    for k, cells in step_ms.items():
        for b, ms in cells.items():
            rows.append((1.0, float(b), float(k), float(b) * float(k)))
            y.append(float(ms))
    if len(rows) < 4:
        raise EmptyProfileError(f"a linear step-time model needs at least 4 profile cells, got {len(rows)}")
    coef, *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(y), rcond=None)
    return coef


class _Counts:
    """A policy's per-step counts of kept drafts (``controller.step.count_drafts``, the controller's
    rule), with its own histograms of length ``max_k + 1``."""

    def __init__(self, max_k: int) -> None:
        self.max_k = int(max_k)
        self.hist_d = [0] * (self.max_k + 1)
        self.hist_a = [0] * (self.max_k + 1)

    def __call__(self, step: StepOutcome) -> tuple[int, int, int]:
        """(drafted tokens, kept drafts, positions tried) of one step; a position is tried when it
        was drafted and every draft before it was kept."""
        drafted, kept, rejections = count_drafts(step.spec_tokens, step.req_id_to_index, step.sampled, self.max_k,
                                                 self.hist_d, self.hist_a)
        return drafted, kept, kept + rejections


class TurboSpecPolicy:
    """k per step from a linear step-time model and a live per-token acceptance rate (module docstring).
    ``max_k``: the engine's K, at which longer drafts are clamped when counted (default: the largest allowed k)."""

    def __init__(self, step_ms: Mapping[int, Mapping[int, float]], max_num_seqs: int, allowed_k: Sequence[int], *,
                 initial_alpha: float = 0.5, forget: float = 0.995, prior_tokens: float = 50.0,
                 max_k: int | None = None) -> None:
        self.ks = np.asarray(sorted(int(k) for k in allowed_k), dtype=np.int64)
        self._counts = _Counts(int(self.ks[-1]) if max_k is None else max_k)
        self.n = int(max_num_seqs)
        self.coef = linear_step_model(step_ms)
        b = np.arange(1, self.n + 1, dtype=float)
        # T_lin for every (k, B); floored so an extrapolated fit never predicts a free step.
        t = self.coef[0] + self.coef[1] * b[None, :] + (self.coef[2] + self.coef[3] * b[None, :]) * self.ks[:, None]
        self.t_lin = np.maximum(t, 1e-3)
        self.forget = float(forget)
        self.kept = float(initial_alpha) * prior_tokens
        self.tried = float(prior_tokens)
        self.steps = 0
        self._lookup = self._build()

    @property
    def alpha(self) -> float:
        return min(0.999, self.kept / self.tried) if self.tried > 0 else 0.0

    def tau(self) -> np.ndarray:
        a = self.alpha
        return (1.0 - a ** (self.ks + 1)) / (1.0 - a)

    def _build(self) -> list[int]:
        best = np.argmax(self.tau()[:, None] / self.t_lin, axis=0)  # B cancels at a fixed B
        return vllm_layout(self.ks[best])

    def next_lookup(self) -> list[int]:
        return self._lookup

    def on_step(self, step: StepOutcome) -> None:
        if not step.num_scheduled_tokens:
            return
        self.steps += 1
        _, kept, tried = self._counts(step)
        if tried:
            self.kept = self.kept * self.forget + kept
            self.tried = self.tried * self.forget + tried
            self._lookup = self._build()

    def close(self) -> None:
        pass


class NightjarPolicy:
    """UCB1 per batch size over the allowed k, rewarded with the step's goodput (module docstring).
    ``max_k``: the engine's K, at which longer drafts are clamped when counted (default: the largest allowed k)."""

    def __init__(self, max_num_seqs: int, allowed_k: Sequence[int], *, c: float = 1.0,
                 max_k: int | None = None) -> None:
        self.ks = [int(k) for k in sorted(allowed_k)]
        self._counts = _Counts(max(self.ks) if max_k is None else max_k)
        self.n = int(max_num_seqs)
        self.c = float(c)
        arms = len(self.ks)
        self.count = np.zeros((self.n + 1, arms))
        self.total = np.zeros((self.n + 1, arms))
        self.r_max = 0.0
        self.steps = 0
        # Untried arms go first, the largest k first (index = batch size, vLLM's layout).
        self._lookup = vllm_layout(np.full(self.n, self.ks[-1]))
        self._last_t: float | None = None
        self._pending: tuple[int, int] | None = None

    def _choose(self, b: int) -> int:
        cnt, tot = self.count[b], self.total[b]
        untried = np.flatnonzero(cnt == 0)
        if untried.size:
            return self.ks[int(untried[-1])]
        scale = self.r_max if self.r_max > 0 else 1.0
        ucb = tot / cnt / scale + self.c * np.sqrt(2.0 * math.log(cnt.sum()) / cnt)
        return self.ks[int(np.argmax(ucb))]

    def next_lookup(self) -> list[int]:
        return self._lookup

    def on_step(self, step: StepOutcome) -> None:
        b, k_next, now = len(step.num_scheduled_tokens), step.k_next, step.now
        last, self._last_t = self._last_t, now
        if b == 0 or b > self.n:
            return
        self.steps += 1
        k = self._lookup[b] if k_next is None else int(k_next)
        if last is None or k not in self.ks:
            return
        dt = now - last
        if dt <= 0:
            return
        _, kept, _ = self._counts(step)
        reward = (b + kept) / (b * dt)  # tokens per request per second: the step's goodput over B
        arm = self.ks.index(k)
        self.count[b, arm] += 1
        self.total[b, arm] += reward
        self.r_max = max(self.r_max, reward)
        self._lookup[b] = self._choose(b)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# The selector: the baselines as controller variants inside the engine.

from tabletune_pipelines.controller.logic import Controller  # noqa: E402 (after the policies it selects)
from tabletune_pipelines.controller.search import compact  # noqa: E402
from tabletune_pipelines.controller.version import Installed  # noqa: E402

#: Nightjar-style arm statistics exported for at most this many batch sizes (the most visited).
EXPORT_ARMS = 32


def build_policy(name: str, start: Any, max_num_seqs: int,
                 max_k: int | None = None) -> TurboSpecPolicy | NightjarPolicy:
    """The baseline ``name`` (``turbospec`` / ``nightjar``) for a validated published file
    (``loader.StartPoint``): allowed k = the file's allowed k that the launch lists; TurboSpec's
    linear model is fitted to the file's profiled cells of those k, and its initial per-token
    acceptance is the prior's a_1 (0.5 without a prior; it counts as 50 tokens, so live counts
    take over within a few steps). ``max_k``: the engine's K, where drafts are clamped when counted
    (default: the largest allowed k)."""
    s, ks = start.settings, tuple(start.allowed_k)
    if not ks:
        raise PublishedTableError("the published file allows no k")
    if name == "turbospec":
        cells = {int(k): dict(start.published.step_ms.get(int(k)) or {}) for k in ks}
        alpha = float(start.prior[0]) if start.prior else 0.5
        return TurboSpecPolicy(cells, max_num_seqs, ks, initial_alpha=min(max(alpha, 0.0), 0.999),
                               forget=float(s.turbospec_forget), max_k=max_k)
    if name == "nightjar":
        return NightjarPolicy(max_num_seqs, ks, c=float(s.nightjar_exploration), max_k=max_k)
    raise InvalidValueError(f"no baseline policy {name!r}")


@dataclass(frozen=True)
class PolicyInstalled(Installed):
    """A version as ``PolicyController`` runs it: ``Installed`` and the baseline built with it."""

    policy: TurboSpecPolicy | NightjarPolicy | None = None
    """The baseline choosing k (None: TableTune's, or one that cannot run: the published table is served)."""
    policy_name: str = "tabletune"
    policy_k_steps: list[int] = field(default_factory=list)
    """Steps served per k while the baseline runs (K + 1 counters, from 0)."""
    policy_failed: str | None = None
    """Why the baseline does not run (None: it runs, or the policy is TableTune's)."""
    policy_build_error: Exception | None = None
    """The exception building the baseline raised (counted and logged when the version is announced)."""


class PolicyController(Controller):
    """``logic.Controller`` with the ``policy`` setting honoured: for ``turbospec``/``nightjar``
    the baseline chooses vLLM's lookup every step while the controller itself runs as in observe
    mode (counts, estimate, candidate table, export). Built at every newly installed published
    version (a restart of the baseline: its state does not carry over). Whatever goes wrong in a
    baseline — it cannot be built, it raises, it hands back a lookup of the wrong length — is
    counted and logged once (``Controller.fail``) and the published table is served from then on
    (until the next published version). The evaluation's vLLM adapter (``evaluation/scheduler.py``)
    builds this class."""

    honours_policy = True
    policy: TurboSpecPolicy | NightjarPolicy | None = None
    policy_name: str = "tabletune"

    def _prepare(self, start: Any) -> PolicyInstalled:
        # Built with the rest of the version (``Controller._prepare``: all or nothing). A baseline that
        # cannot be built is not a failed install: the version goes in force serving its published
        # table, and ``_announce`` counts and logs the baseline's failure. Under a baseline the version
        # does not control (``version.prepare``): TableTune's rebuilds are observed.
        base = super()._prepare(start)
        new = PolicyInstalled(**{f.name: getattr(base, f.name) for f in fields(Installed)},
                              policy_k_steps=[0] * (self._K + 1))
        name = start.settings.policy
        if name == "tabletune":
            return new
        if not new.applying:
            return replace(new, policy_name=name, policy_failed="the launch has no table, so k cannot change")
        try:
            return replace(new, policy_name=name, policy=build_policy(name, start, self._n, self._K))
        except Exception as exc:  # noqa: BLE001 - the published table is served instead
            return replace(new, policy_name=name, policy_build_error=exc,
                           policy_failed=f"building the {name} policy: {type(exc).__name__}")

    def _commit(self, new: Installed) -> None:
        assert isinstance(new, PolicyInstalled)
        self.policy, self.policy_name, self.policy_failed = new.policy, new.policy_name, new.policy_failed
        self.policy_k_steps = new.policy_k_steps
        super()._commit(new)

    def _announce(self, new: Installed) -> None:
        super()._announce(new)
        name = self.policy_name
        exc = new.policy_build_error if isinstance(new, PolicyInstalled) else None
        if name == "tabletune":
            return
        if not self.applying:
            self.log.warning("TableTune controller: policy %s needs a launch table to switch k; serving the "
                             "configured table", name)
        elif exc is not None:
            self.fail("building the " + name + " policy", exc)
        else:
            self.log.info("TableTune controller: policy %s chooses k (allowed k %s); the published table %s is "
                          "the fallback", name, list(new.start.allowed_k), _ranges(self.ranges))

    def _policy_failed(self, where: str, exc: BaseException) -> None:
        self.policy = None
        self.policy_failed = f"{where}: {type(exc).__name__}"
        self.fail(where, exc)

    def next_lookup(self, lengths: Sequence[int] | None = None) -> list[int] | None:
        pol = self.policy
        if pol is not None:
            try:
                lookup = pol.next_lookup()
                if len(lookup) != self._n + 1:  # a policy's bug, not an input: caught below, recorded as policy_failed
                    raise ValueError(f"lookup of length {len(lookup)}, not max_num_seqs + 1 = {self._n + 1}")
                return lookup
            except Exception as exc:  # noqa: BLE001
                self._policy_failed(f"the {self.policy_name} policy's lookup", exc)
        return super().next_lookup(lengths)

    def on_step(self, step: StepOutcome) -> None:
        pol = self.policy
        super().on_step(step)
        if pol is None or pol is not self.policy:  # none, or a new version was installed in this step
            return
        try:
            k_next = step.k_next
            if step.num_scheduled_tokens and k_next is not None and 0 <= k_next <= self._K:
                self.policy_k_steps[k_next] += 1
            pol.on_step(step)
        except Exception as exc:  # noqa: BLE001
            self._policy_failed(f"the {self.policy_name} policy's update", exc)

    def state(self) -> dict[str, Any]:
        st = super().state()
        st["policy"] = self.policy_name
        st["policy_active"] = self.policy is not None
        st["policy_failed"] = getattr(self, "policy_failed", None)
        st["policy_k_steps"] = list(getattr(self, "policy_k_steps", []))
        pol = self.policy
        if pol is None:
            return st
        st["policy_table"] = [list(r) for r in compact(pol.next_lookup()[1:])]
        if isinstance(pol, TurboSpecPolicy):
            st["policy_alpha"] = round(pol.alpha, 6)
            st["policy_coef"] = [round(float(c), 6) for c in pol.coef]
        else:
            visited = np.flatnonzero(pol.count.sum(axis=1) > 0)
            top = visited[np.argsort(-pol.count[visited].sum(axis=1), kind="stable")][:EXPORT_ARMS]
            st["policy_r_max"] = round(pol.r_max, 6)
            st["policy_arms"] = {str(int(b)): {"count": pol.count[b].astype(int).tolist(),
                                               "mean": [round(float(t / c), 6) if c else None
                                                        for t, c in zip(pol.total[b], pol.count[b], strict=True)]}
                                 for b in sorted(int(x) for x in top)}
        return st


def _ranges(ranges: Sequence[Sequence[int]]) -> str:
    return "[" + ",".join(f"[{s},{e},{k}]" for s, e, k in ranges) + "]"
