"""The profiler's adaptive re-measurement with a stand-in server (no engine): only the cells
behind ambiguous decisions get more repetitions, in the same launch, each update is handed to
``on_cell``, and a rerun continues only while a decision is ambiguous."""

from __future__ import annotations

import dataclasses

import numpy as np

from tabletune_pipelines.formats.documents import EngineIdentity, StepTimeCell
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.plan import ProfileOptions, ProfilePlan
from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileServers
from tabletune_pipelines.engine.profiler import profile_step_times
from tests.engine.fakes import FakeServer

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, max_num_seqs=8,
                   device="cpu")
IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="m", drafter="d", method="draft_model",
                       max_k=3, max_num_seqs=8)
PLAN = ProfilePlan(batch_sizes=(1, 2, 4, 8), ks=(0, 1, 3), repetitions=3, include_no_spec=False,
                   accept_batch_sizes=())
RATES = (0.7, 0.5, 0.3)  # tau = 1, 1.7, 2.5 for k = 0, 1, 3


def true_ms(k, b):
    """k = 3 clearly best at B <= 2; k = 1 and k = 3 tie exactly at B = 8 (k = 0 far behind)."""
    t1 = 5.0 + b
    if k == 1:
        return t1
    if k == 3:
        return t1 * 2.5 / 1.7 * (0.6 if b <= 2 else 1.0)
    return t1 * 1.0 / 1.7 * 1.6


class NoisyServer(FakeServer):
    """The fake server with true step times above and 10 % noise per timed batch."""

    rng = np.random.default_rng(0)

    def complete(self, prompts, *, max_tokens, **kw):
        self._noise = 1.0 + 0.10 * self.rng.standard_normal()
        return super().complete(prompts, max_tokens=max_tokens, **kw)

    def read_steps(self, since=None, until=None, offset=0):
        b, k = self._b, self.k_at(self._b)
        d = b * (k or 0)
        ms = true_ms(k, b) * getattr(self, "_noise", 1.0)
        return [{"b": b, "new": b, "dt": 30.0, "d": 0, "k": k}] + [
            {"b": b, "new": 0, "dt": ms, "d": d, "k": k} for _ in range(20)]


def _run(options, existing=()):
    options = dataclasses.replace(options, mixed_steps=False)  # re-measurement only
    NoisyServer.rng = np.random.default_rng(len(existing))  # each run its own noise, whatever ran before
    launched: list[FakeServer] = []
    got: list[StepTimeCell] = []
    prof = profile_step_times(CFG, options, plan=PLAN, hooks=ProfileHooks(existing=existing, on_cell=got.append),
                              servers=ProfileServers(factory=lambda cfg: NoisyServer(cfg, launched=launched)),
                              identity=IDENT, vocab_size=100, progress=lambda m: None)
    return prof, launched, got


def test_only_ambiguous_cells_are_measured_again_in_the_same_launch_and_a_rerun_continues():
    opts = ProfileOptions(decision_rates=RATES, max_repetitions=6, remeasure_budget_s=60.0)
    prof, launched, got = _run(opts)
    assert len(launched) == 1  # the re-measurement ran in the first pass's launch
    reps = {(c.k, c.batch_size): len(c.repetitions_ms) for c in prof.cells}
    more = {key for key, n in reps.items() if n > 3}
    assert more, "the tie at B = 8 is ambiguous after three repetitions"
    # B = 1 is clear and k = 0 never a rival; B = 2's cells stand behind the interpolated B = 3,
    # which is as close as B = 4 when the noise makes it so
    assert all(b >= 2 and k in (1, 3) for k, b in more)
    assert any(b == 8 for _, b in more)
    assert max(reps.values()) <= 6
    assert len(prof.remeasured()) == len(more)
    updates = [c for c in got if len(c.repetitions_ms) > 3]
    assert {(c.k, c.batch_size) for c in updates} == more  # every update went to on_cell
    # A rerun from the stored cells: the tie is still ambiguous but its cells are at the cap.
    _, relaunched, regot = _run(opts, existing=prof.cells)
    capped = all(reps[key] == 6 for key in more)
    assert (relaunched == [] and regot == []) if capped else len(relaunched) == 1


def test_zero_budget_turns_it_off():
    prof, launched, _ = _run(ProfileOptions(decision_rates=RATES, remeasure_budget_s=0))
    assert all(len(c.repetitions_ms) == 3 for c in prof.cells) and len(launched) == 1


def boundary_ms(k, b):
    """k = 3 40 % ahead of k = 1 per token at B <= 2, 40 % behind from B = 3 on (k = 0 far behind)."""
    t1 = 5.0 + b
    if k == 1:
        return t1
    if k == 3:
        return t1 * 2.5 / 1.7 * (0.6 if b <= 2 else 1.4)
    return t1 * 1.0 / 1.7 * 1.6


class BoundaryServer(NoisyServer):
    """The noisy fake with a boundary between B = 2 and B = 3."""

    def read_steps(self, since=None, until=None, offset=0):
        b, k = self._b, self.k_at(self._b)
        ms = boundary_ms(k, b) * getattr(self, "_noise", 1.0)
        return [{"b": b, "new": b, "dt": 30.0, "d": 0, "k": k}] + [
            {"b": b, "new": 0, "dt": ms, "d": b * (k or 0), "k": k} for _ in range(20)]


GRID8 = ProfilePlan(batch_sizes=tuple(range(1, 9)), ks=(0, 1, 3), repetitions=3, include_no_spec=True,
                    accept_batch_sizes=())


def _run_plan(options, plan, existing=()):
    options = dataclasses.replace(options, mixed_steps=False)
    launched: list[FakeServer] = []
    lines: list[str] = []
    prof = profile_step_times(CFG, options, plan=plan, hooks=ProfileHooks(existing=existing),
                              servers=ProfileServers(factory=lambda cfg: BoundaryServer(cfg, launched=launched)),
                              identity=IDENT, vocab_size=100, progress=lines.append)
    return prof, launched, lines


def test_the_adaptive_plan_bisects_to_the_boundary_and_measures_less_than_the_grid():
    # k = 3 wins clearly at B <= 2, k = 1 from B = 3 on: the boundary is between 2 and 3.
    opts = ProfileOptions(decision_rates=RATES, max_repetitions=6, remeasure_budget_s=30.0)
    prof, launched, lines = _run_plan(opts, GRID8)
    by_b = {}
    for c in prof.cells:
        by_b.setdefault(c.batch_size, set()).add(c.k)
    measured = sorted(by_b)
    assert {1, 2, 3, 8} <= set(measured) and len(measured) < 8  # coarse 1, 3, 5, 6, 8 and the bisection's 2
    assert all(by_b[b] == {None, 0, 1, 3} for b in measured)  # every k, and the baseline at the same B only
    assert len(launched) == 2  # the one launch for every k, and the no-speculation launch
    assert any("adaptive plan:" in line and "(bisect)" in line for line in lines)
    # The full grid stays an option: every batch size.
    grid, _, _ = _run_plan(dataclasses.replace(opts, plan_search="grid"), GRID8)
    assert sorted({c.batch_size for c in grid.cells}) == list(range(1, 9))
    # A rerun from the stored cells measures no new batch size.
    again, relaunched, _ = _run_plan(opts, GRID8, existing=prof.cells)
    assert sorted({c.batch_size for c in again.cells}) == measured
