"""The profiler's orchestration with a stand-in server: launches, k switching, warm-up, resume."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from tabletune_pipelines.formats.documents import EngineIdentity
from tabletune_pipelines.engine.config import ServerConfig
from tabletune_pipelines.engine.plan import ProfileOptions, ProfilePlan
from tabletune_pipelines.engine.profile_run import ProfileHooks, ProfileServers
from tabletune_pipelines.engine.profiler import profile_step_times
from tabletune_pipelines.engine.progress import ProfilerProgress
from tabletune_pipelines.formats.documents import StepTimeCell
from tabletune_pipelines.errors import EngineConfigError
from tests.engine.fakes import FakeServer, step_ms

CFG = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, max_num_seqs=8,
                   device="cpu")
IDENT = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model="m", drafter="d", method="draft_model",
                       max_k=3, max_num_seqs=8)
PLAN = ProfilePlan(batch_sizes=(1, 8), ks=(0, 1, 3), repetitions=2, accept_batch_sizes=(1,))


def _run(options=None, plan=PLAN, mixed=False, server=None, **hooks):
    # the mixed phase has its own test below
    options = dataclasses.replace(options or ProfileOptions(), mixed_steps=mixed)
    launched: list[FakeServer] = []
    servers = ProfileServers(server=server, factory=lambda cfg: FakeServer(cfg, launched=launched))
    prof = profile_step_times(CFG, options, plan=plan, hooks=ProfileHooks(**hooks), servers=servers, identity=IDENT,
                              vocab_size=100, progress=lambda m: None)
    return prof, launched


def test_one_launch_switches_k_in_one_server_whose_table_lists_every_k():
    prof, launched = _run()
    spec, nospec = launched  # the CPU build switches to all-accepted rates in the same launch
    assert spec.config.table == ((1, 1, 0), (2, 2, 1), (3, 8, 3))
    assert spec.config.synthetic_acceptance_rates == (0.0, 0.0, 0.0) and nospec.config.method is None
    assert [c for c in spec.calls if c[0] == "rates"] == [("rates", (1.0, 1.0, 1.0))]
    assert prof.reject_cells() == {k: {b: step_ms(k, b) for b in (1, 8)} for k in (0, 1, 3)}
    assert prof.no_spec_ms() == {1: step_ms(None, 1), 8: step_ms(None, 8)}
    assert set(prof.accept_cells()) == {1, 3}
    assert all(c.timing == "engine" and len(c.repetitions_ms) == 2 for c in prof.cells)
    assert all(c.launch_k == 3 for c in prof.cells if c.k is not None)
    # Repetitions interleave the k values (k0 k1 k3, then k1 k3 k0) at each batch size; k is
    # switched only when it changes. Then the all-accepted cells (k1 k3, then k3 k1).
    switches = [c[1] for c in spec.calls if c[0] == "set_k"]
    assert switches == [0, 1, 3, 1, 3, 0] + [1, 3, 1, 3, 0] + [1, 3, 1]
    assert all(c == ("stop", None) for s in launched for c in s.calls[-1:])


def test_mixed_steps_run_in_the_same_launch_after_the_decode_cells_and_resume():
    got: list = []
    prof, launched = _run(ProfileOptions(), mixed=True, on_samples=got.append)
    spec = launched[0]
    switches = [c[1] for c in spec.calls if c[0] == "set_k"]
    # decode cells as above, then mixed steps at B = 1 (k 0 1 3) and B = 7 (k 1 3 0: the order rotates;
    # at max_num_seqs = 8 no request could join a batch of 8), then the all-accepted cells.
    assert switches == [0, 1, 3, 1, 3, 0] + [1, 3, 1, 3, 0] + [0, 1, 3] + [1, 3, 0] + [1, 3, 1]
    assert len(got) == 1 and list(prof.samples) == got[0]
    # A rerun with the stored samples measures none again.
    _, launched = _run(ProfileOptions(), mixed=True, existing=prof.cells, existing_samples=list(prof.samples))
    assert not launched or not [c for c in launched[0].calls if c[0] == "set_k"]


def test_the_plans_decode_steps_set_every_timed_batch_and_the_mixed_batch():
    # 64 steps by default: 65-token repetitions, 129-token mixed batches; 16 steps: 17 and 33
    for steps, want in ((None, {1, 65, 129}), (16, {1, 17, 33})):
        plan = PLAN if steps is None else dataclasses.replace(PLAN, decode_steps=steps)
        _, launched = _run(ProfileOptions(), plan=plan, mixed=True)
        assert {t for b, t, k in launched[0].completes()} == want


def test_warmup_runs_each_k_and_batch_size_once_before_timing_it():
    _, launched = _run(ProfileOptions(warmup=True))
    spec = launched[0]
    warm = [(b, k) for b, t, k in spec.completes() if t == 4]
    assert sorted(warm) == sorted({(b, k) for b in (1, 8) for k in (0, 1, 3)})
    first = {}
    for i, (b, t, k) in enumerate(spec.completes()):
        first.setdefault((b, k, t == 4), i)
    assert all(first[(b, k, True)] < first[(b, k, False)] for b, k in warm)  # before its first timed batch


def test_no_warmup_by_default_on_the_cpu_build():
    _, launched = _run()
    assert not any(t == 4 for s in launched for _, t, _ in s.completes())


def test_launch_per_k_and_fixed_k():
    prof, launched = _run(ProfileOptions(mode="launch_per_k"), plan=ProfilePlan(batch_sizes=(1,), ks=(0, 3),
                                                                              include_no_spec=False,
                                                                              accept_batch_sizes=()))
    assert [s.config.table for s in launched] == [((1, 8, 0),), ((1, 8, 3),)]
    assert all(s.config.num_speculative_tokens == 3 for s in launched)
    assert not any(c[0] == "set_k" for s in launched for c in s.calls)
    got: list[StepTimeCell] = []
    prof, launched = _run(ProfileOptions(mode="fixed_k"), on_cell=got.append)
    assert [(s.config.num_speculative_tokens, s.config.table, s.config.synthetic_acceptance_rates)
            for s in launched] == [(1, None, (0.0,)), (3, None, (0.0, 0.0, 0.0))]
    assert prof.mode == "fixed_k" and len(got) == 4
    assert all(c.k >= 1 and c.acceptance == "reject" and c.launch_k == c.k for c in got)
    assert prof.reject_cells() == {k: {b: step_ms(k, b) for b in (1, 8)} for k in (1, 3)}
    _, launched = _run(ProfileOptions(mode="fixed_k"), existing=got)
    assert launched == []  # everything measured already
    with pytest.raises(EngineConfigError, match="needs some k >= 1"):
        _run(ProfileOptions(mode="fixed_k"), plan=ProfilePlan(batch_sizes=(1,), ks=(0,), accept_batch_sizes=()))


def test_resume_measures_only_missing_cells():
    first: list[StepTimeCell] = []
    _run(on_cell=first.append, plan=ProfilePlan(batch_sizes=(1,), ks=(0, 1), include_no_spec=False,
                                                accept_batch_sizes=()))
    again: list[StepTimeCell] = []
    prof, launched = _run(on_cell=again.append, existing=first,
                          plan=ProfilePlan(batch_sizes=(1, 2), ks=(0, 1), include_no_spec=False,
                                                          accept_batch_sizes=()))
    assert sorted((c.k, c.batch_size) for c in again) == [(0, 2), (1, 2)]
    assert len(prof.cells) == 4 and len(launched) == 1


def test_given_server_is_used_and_left_as_found():
    srv = FakeServer(ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3,
                                  table=((1, 8, 3),), synthetic_acceptance_rates=(0.7, 0.5, 0.3), max_num_seqs=8))
    srv.start()
    prof, launched = _run(server=srv, plan=ProfilePlan(batch_sizes=(1,), ks=(0, 3), include_no_spec=False,
                                                       accept_batch_sizes=(1,)))
    assert launched == [] and srv.alive and len(prof.cells) == 3
    rates = [c[1] for c in srv.calls if c[0] == "rates"]
    assert rates == [(0.0,) * 3, (1.0,) * 3, (0.7, 0.5, 0.3)] and srv.k == 3  # restored: K everywhere


def test_given_server_must_fit_the_plan():
    def given(table, rates, device="cpu"):
        cfg = ServerConfig(model="/m", drafter="/d", method="draft_model", num_speculative_tokens=3, table=table,
                           synthetic_acceptance_rates=rates, max_num_seqs=8)
        return FakeServer(cfg, device=device)

    with pytest.raises(EngineConfigError, match="table and synthetic_acceptance_rates"):
        _run(server=given(None, (0.0,) * 3))
    # Where rates cannot switch at runtime (a GPU), a reject profile needs rates 0 at launch ...
    with pytest.raises(EngineConfigError, match="not 0, and cannot switch them"):
        _run(server=given(((1, 8, 3),), (0.7, 0.5, 0.3), device="gpu"))
    # ... and the launch table must list every k (graphs are captured for those only).
    with pytest.raises(EngineConfigError, match=r"lacks k = \[0, 1\]"):
        _run(server=given(((1, 8, 3),), (0.0,) * 3, device="gpu"))
    with pytest.raises(EngineConfigError, match="launches its own servers"):
        _run(ProfileOptions(mode="fixed_k"), server=given(((1, 8, 3),), (0.0,) * 3))


def test_server_overrides_reach_every_launch():
    _, launched = _run(ProfileOptions(startup_timeout=900, max_model_len=1024))
    assert {(s.config.startup_timeout, s.config.max_model_len) for s in launched} == {(900, 1024)}


def test_progress_lines_count_cells_and_estimate_time():
    lines: list[str] = []
    prog = ProfilerProgress(total=4, done=2, printer=lines.append)
    prog.cell(StepTimeCell(k=1, batch_size=8, median_ms=5.0, repetitions_ms=(4.9, 5.0, 5.2)))
    assert lines and "3/4" in lines[0] and "k=1" in lines[0] and "ETA" in lines[0] and "spread  6.0%" in lines[0]


class _DriftingServer(FakeServer):
    """Each batch's steps run slower by the next of ``OFFSETS`` ms: repetitions of a cell differ."""

    OFFSETS = (0.0, 3.0, 1.0, 0.5, 2.0)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.n = 0

    def read_steps(self, since=None, until=None, offset=0):
        extra = self.OFFSETS[self.n % len(self.OFFSETS)]
        self.n += 1
        return [dict(s, dt=s["dt"] + extra) if s["new"] == 0 else s for s in super().read_steps(since, until, offset)]


def test_a_cell_is_the_median_of_its_repetitions():
    launched: list = []
    servers = ProfileServers(factory=lambda cfg: _DriftingServer(cfg, launched=launched))
    plan = dataclasses.replace(PLAN, repetitions=3)
    prof = profile_step_times(CFG, dataclasses.replace(ProfileOptions(), mixed_steps=False), plan=plan,
                              hooks=ProfileHooks(), servers=servers, identity=IDENT, vocab_size=100,
                              progress=lambda m: None)
    # The drift reached the repetitions: their fastest is not their median.
    assert any(min(c.repetitions_ms) < statistics.median(c.repetitions_ms) for c in prof.cells)
    for c in prof.cells:
        assert c.median_ms == pytest.approx(statistics.median(c.repetitions_ms)), (c.k, c.batch_size, c.repetitions_ms)


@pytest.mark.parametrize("plan_search", ["grid", "adaptive"])
def test_an_engine_that_dies_mid_profile_ends_it_with_engine_error_and_the_cells_handed_on(plan_search):
    """The profiler's side of an engine death on either plan: the request that finds the engine dead
    raises EngineError, the profile ends with it (no plan stops early and calls itself done), and the
    cells measured before reached ``on_cell``. The real engine's death (a killed launch) is
    tests/engine/test_engine_real.py's."""
    from tabletune_pipelines.errors import EngineError

    dead: list[bool] = []

    class DyingServer(FakeServer):
        def complete(self, prompts, *, max_tokens, **kw):
            if dead:
                raise EngineError("the engine died (connection refused)")
            return super().complete(prompts, max_tokens=max_tokens, **kw)

    cells: list[StepTimeCell] = []

    def on_cell(cell):
        cells.append(cell)
        if len(cells) == 2:
            dead.append(True)  # the engine dies after the B = 1 cells

    launched: list[FakeServer] = []
    plan = ProfilePlan(batch_sizes=(1, 2), ks=(0, 1), repetitions=1, include_no_spec=False, accept_batch_sizes=())
    with pytest.raises(EngineError, match="engine died"):
        profile_step_times(CFG, ProfileOptions(mixed_steps=False, plan_search=plan_search), plan=plan,
                           hooks=ProfileHooks(on_cell=on_cell),
                           servers=ProfileServers(factory=lambda cfg: DyingServer(cfg, launched=launched)),
                           identity=IDENT, vocab_size=100, progress=lambda m: None)
    assert sorted((c.k, c.batch_size) for c in cells) == [(0, 1), (1, 1)] and len(launched) == 1
