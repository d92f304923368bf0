"""Context levels of the profile plan, without an engine: the levels a deployment gets
(``propose_context_levels``), the plan's levels and their checks, the seed a further level takes from
the boundaries of the level below (``core.remeasure.seeded_batch_sizes``), and a two-level adaptive
profile on a stand-in server whose boundary moves with the context."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tabletune_pipelines.core.remeasure import coarse_batch_sizes, seeded_batch_sizes
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.plan import (
    ProfileOptions,
    ProfilePlan,
    context_config,
    plan_from_options,
    plan_lines,
    propose_context_levels,
)
from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileServers
from tabletune_pipelines.engine.profiler import profile_step_times
from tabletune_pipelines.errors import EngineConfigError
from tabletune_pipelines.formats.documents import EngineIdentity
from tests.engine.test_profiler_remeasure import RATES, NoisyServer

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, max_num_seqs=16,
                   device="cpu")
IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="m", drafter="d", method="draft_model",
                       max_k=3, max_num_seqs=16)


def test_proposed_levels_are_powers_of_two_spread_in_log_scale_up_to_what_fits():
    assert propose_context_levels(2048, 3) == (32, 128, 256, 1024)  # 2048 - 69 reserved: 1024 is the top
    assert propose_context_levels(4096, 3) == (32, 128, 512, 2048)
    assert propose_context_levels(8192, 3, cap=4096) == (32, 128, 1024, 4096)
    assert propose_context_levels(512, 3, count=3) == (32, 128, 256)
    assert propose_context_levels(120, 3) == (32,)  # 120 - 69 = 51: one level
    with pytest.raises(EngineConfigError, match="max_model_len = 90 leaves no context level of at least 32"):
        propose_context_levels(90, 3)


def test_a_plan_without_levels_has_one_level_its_prompt_tokens():
    plan = plan_from_options(CFG, ProfileOptions(prompt_tokens=48))
    assert plan.context_levels == (48,)
    assert plan_from_options(CFG, ProfileOptions()).context_levels == (32,)
    assert context_config(CFG, plan) is CFG  # 48 + 65 + 3 + 1 fits 512


@pytest.mark.parametrize("levels, words", [
    ((128, 32), "context_levels = [128, 32] must be strictly ascending"),
    ((32, 32), "context_levels = [32, 32] must be strictly ascending"),
    ((), "context_levels = [] is empty"),
    ((0, 32), "context_levels[0] = 0 must be"),
    ((32, 2 ** 25), "context_levels[1] = 33554432 must be"),
])
def test_bad_levels_are_refused_naming_the_value(levels, words):
    with pytest.raises(EngineConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        ProfileOptions(context_levels=levels)


def test_grid_plan_cells_at_every_level_and_the_launch_holds_the_longest():
    plan = ProfilePlan(batch_sizes=(1, 4), ks=(0, 3), include_no_spec=False, accept_batch_sizes=(),
                       context_levels=(32, 512))
    assert plan.level_cells("one_launch") == [(32, (0, 1, "reject")), (32, (3, 1, "reject")), (32, (0, 4, "reject")),
                                              (32, (3, 4, "reject")), (512, (0, 1, "reject")),
                                              (512, (3, 1, "reject")), (512, (0, 4, "reject")),
                                              (512, (3, 4, "reject"))]
    assert plan.at_level(512).prompt_tokens == 512 and plan.at_level(512).context_levels == (512,)
    assert context_config(CFG, plan).max_model_len == 512 + 65 + 3 + 1


def test_the_seed_of_a_further_level_is_the_grid_ends_and_both_sides_of_each_boundary():
    grid = (*range(1, 17), 24, 32, 40, 48, 56, 64)
    assert seeded_batch_sizes(grid, [(4, 5), (24, 32)]) == [1, 4, 5, 24, 32, 64]
    assert seeded_batch_sizes(grid, []) == [1, 12, 64]  # no boundary: the ends and the grid's middle
    assert coarse_batch_sizes(grid) == [1, 6, 11, 24, 64]  # what the first level starts with
    opts = ProfileOptions(context_levels=(32, 1024))
    lines = plan_lines(plan_from_options(dataclasses.replace(CFG, max_num_seqs=64), opts), opts)
    assert lines[1] == ("  context 32: prompts of 32 tokens; first pass B [1, 6, 11, 24, 64] (34 cells), then "
                        "bisection where the best k changes")
    assert lines[2].startswith("  context 1024: prompts of 1024 tokens; first pass: B 1, 64 and both sides of each "
                               "boundary context 32 found")


def level_ms(k, b, level):
    """k = 3 40 % ahead of k = 1 per token up to the boundary, 40 % behind after it; the boundary lies
    between B = 2 and 3 at context 32 and between 6 and 7 at context 1024, where every step is 50 % slower."""
    edge = 2 if level < 1024 else 6
    t1 = (5.0 + b) * (1.5 if level >= 1024 else 1.0)
    if k == 1:
        return t1
    if k == 3:
        return t1 * 2.5 / 1.7 * (0.6 if b <= edge else 1.4)
    return t1 * 1.0 / 1.7 * 1.6


class LevelServer(NoisyServer):
    """The noisy fake whose step times follow ``level_ms`` at the length of the prompts it was sent (its
    own noise, so the stand-in it builds on keeps its seeded sequence for its own tests)."""

    rng = np.random.default_rng(1)

    def complete(self, prompts, *, max_tokens, **kw):
        self._level = len(prompts[0])
        self.prompt_lengths.add(self._level)
        return super().complete(prompts, max_tokens=max_tokens, **kw)

    def read_steps(self, since=None, until=None, offset=0):
        b, k = self._b, self.k_at(self._b)
        ms = level_ms(k, b, self._level) * getattr(self, "_noise", 1.0)
        return [{"b": b, "new": b, "dt": 30.0, "d": 0, "k": k}] + [
            {"b": b, "new": 0, "dt": ms, "d": b * (k or 0), "k": k} for _ in range(20)]


def test_two_levels_in_one_launch_the_second_seeded_by_the_first_boundaries():
    plan = ProfilePlan(batch_sizes=tuple(range(1, 17)), ks=(0, 1, 3), include_no_spec=False, accept_batch_sizes=(),
                       context_levels=(32, 1024))
    opts = ProfileOptions(decision_rates=RATES, max_repetitions=6, remeasure_budget_s=30.0, mixed_steps=False)
    launched, lines = [], []
    LevelServer.prompt_lengths = set()
    LevelServer.rng = np.random.default_rng(1)
    prof = profile_step_times(CFG, opts, plan=plan, hooks=ProfileHooks(),
                              servers=ProfileServers(factory=lambda cfg: LevelServer(cfg, launched=launched)),
                              identity=IDENT, vocab_size=100, progress=lines.append)
    assert len(launched) == 1 and launched[0].config.max_model_len == 1024 + 69  # one launch, long enough
    assert LevelServer.prompt_lengths == {32, 1024}  # every request at exactly a level's length
    by_level: dict[int, dict[int, set]] = {}
    for c in prof.cells:
        by_level.setdefault(c.context_tokens, {}).setdefault(c.batch_size, set()).add(c.k)
    assert sorted(by_level) == [32, 1024]
    first, second = sorted(by_level[32]), sorted(by_level[1024])
    assert all(ks == {0, 1, 3} for level in by_level.values() for ks in level.values())
    assert {1, 2, 3, 16} <= set(first)  # the first level brackets its boundary (2, 3)
    seed = seeded_batch_sizes(range(1, 17), [(2, 3)])
    assert seed == [1, 2, 3, 16]
    assert any(f"context 1024: seeded by context 32's boundaries [(2, 3)]: first pass B = {seed}" in x for x in lines)
    assert set(seed) | {6, 7} <= set(second)  # seeded there, then bisected to the moved boundary (6, 7)
    assert len(first) + len(second) < 2 * 16  # both levels together measure fewer batch sizes than one grid twice
    # each cell keeps its own level's time: k = 0 and 1 are 50 % slower at context 1024 in the stand-in
    at = {(c.context_tokens, c.k, c.batch_size): c.median_ms for c in prof.cells}
    pairs = [(at[(32, k, b)], at[(1024, k, b)]) for (lv, k, b) in at if lv == 32 and k < 3 and (1024, k, b) in at]
    assert len(pairs) >= 8 and all(long > short for short, long in pairs)


def test_a_rerun_of_a_complete_two_level_profile_launches_nothing():
    plan = ProfilePlan(batch_sizes=tuple(range(1, 17)), ks=(0, 1, 3), include_no_spec=False, accept_batch_sizes=(),
                       context_levels=(32, 1024))
    opts = ProfileOptions(decision_rates=RATES, max_repetitions=3, remeasure_budget_s=0.0, mixed_steps=False)
    LevelServer.prompt_lengths = set()
    LevelServer.rng = np.random.default_rng(1)

    def run(existing=()):
        launched: list = []
        prof = profile_step_times(CFG, opts, plan=plan, hooks=ProfileHooks(existing=existing),
                                  servers=ProfileServers(factory=lambda cfg: LevelServer(cfg, launched=launched)),
                                  identity=IDENT, vocab_size=100, progress=lambda m: None)
        return prof, launched

    prof, launched = run()
    again, relaunched = run(existing=prof.cells)
    assert len(launched) == 1 and relaunched == []
    assert sorted((c.context_tokens, c.k, c.batch_size) for c in again.cells) == \
        sorted((c.context_tokens, c.k, c.batch_size) for c in prof.cells)


def test_the_grid_plan_without_re_measurement_measures_every_cell_at_every_level():
    plan = ProfilePlan(batch_sizes=(1, 4), ks=(0, 3), include_no_spec=True, accept_batch_sizes=(4,),
                       context_levels=(32, 256))
    opts = ProfileOptions(plan_search="grid", remeasure_budget_s=0, mixed_steps=False)
    launched: list = []
    prof = profile_step_times(CFG, opts, plan=plan, hooks=ProfileHooks(),
                              servers=ProfileServers(factory=lambda cfg: LevelServer(cfg, launched=launched)),
                              identity=IDENT, vocab_size=100, progress=lambda m: None)
    assert sorted((c.context_tokens, c.acceptance, -1 if c.k is None else c.k, c.batch_size) for c in prof.cells) == \
        sorted([(lv, "reject", k, b) for lv in (32, 256) for k in (-1, 0, 3) for b in (1, 4)]
               + [(lv, "accept", 3, 4) for lv in (32, 256)])
    assert len(launched) == 2  # the one launch of every k (all-accepted switched at runtime), the no-spec launch
