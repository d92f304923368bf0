"""The profile at two context levels on a real vLLM (CPU build, the tiny draft-model engine the
suite shares): every cell measured at both levels in the one running launch, stored per level, and
the longer context not clearly faster at any (B, k) (every repetition of one cell below every
repetition of the other would be an inversion; timings are not compared otherwise: 2 noisy cores)."""

from __future__ import annotations

import pytest

from tabletune_pipelines.engine.identity import engine_identity
from tabletune_pipelines.engine.plan import ProfileOptions, ProfilePlan
from tabletune_pipelines.engine.profile_run import ProfileServers
from tabletune_pipelines.engine.profiler import profile_step_times, store_hooks
from tabletune_pipelines.store import TableTuneStore

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def test_two_context_levels_in_one_launch_are_stored_per_level(shared_server, shared_config, tmp_path):
    store = TableTuneStore(tmp_path / "levels.duckdb")
    identity = engine_identity(shared_config)
    plan = ProfilePlan(batch_sizes=(1, 8), ks=(0, 3), repetitions=3, include_no_spec=False, accept_batch_sizes=(),
                       context_levels=(16, 384))
    rates = list(shared_server.config.synthetic_acceptance_rates)
    lines: list[str] = []
    prof = profile_step_times(shared_config, ProfileOptions(mixed_steps=False, plan_search="grid",
                                                            remeasure_budget_s=0), plan=plan,
                              hooks=store_hooks(store, identity, "one_launch"),
                              servers=ProfileServers(server=shared_server), identity=identity, progress=lines.append)
    assert not any("server up" in line for line in lines)  # both levels on the running server, no launch
    assert list(shared_server.config.synthetic_acceptance_rates) == rates
    cells = {(c.context_tokens, c.k, c.batch_size): c for c in prof.cells}
    assert sorted(cells) == [(lv, k, b) for lv in (16, 384) for k in (0, 3) for b in (1, 8)]
    stored = {(c.context_tokens, c.k, c.batch_size): c.median_ms for c in store.profile_cells(identity.key)}
    assert stored == {key: c.median_ms for key, c in cells.items()}
    surface = store.step_time_surface(identity.key)
    assert sorted(surface) == [16, 384] and surface[16].ks == (0, 3)
    for k in (0, 3):
        for b in (1, 8):
            short, long = cells[(16, k, b)].repetitions_ms, cells[(384, k, b)].repetitions_ms
            assert len(short) == len(long) == 3
            assert not max(long) < min(short), (k, b, short, long)  # context 384 not clearly faster than 16
