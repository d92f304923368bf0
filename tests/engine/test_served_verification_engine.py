"""A failed served verification keeps the previous table published: real vLLM (CPU build), the session's
shared server, the real published_table asset and its blocking check served_goodput_verified.

The store's evidence says k = 0 (the prior: drafts almost never accepted), but the engine accepts every
draft (synthetic acceptance 1.0 at every position). Served, k = 0 keeps one token per request-step and
k = 3 four, for a step that costs well under 4x as much (the 1-layer draft and the verification of 3
drafts on the tiny target): the table serves far less than the best fixed k. Why this cannot be noise:
a load fails only where the whole paired interval lies below 1 - 3% (ratio + t·s.e. < 0.97, t = 4.30
with 3 rounds, 12.71 with 2); k = 3 keeps 4x the tokens per request-step, so the
ratio k = 0 / best stays near 1/4 × (step-cost ratio), 0.3-0.6 on any CPU where a k = 3 step costs
1.2-2.4x a k = 0 step (measured on a 2-core machine at load average 6-8 from other work: 0.42 ± 0.02
at load 4, 0.55 ± 0.16 at load 8 with 3 rounds, where one round's windows straddled a burst of other
work). Rounds go on until a load is decided, up to four. For the verification not to fail, both loads
would need two or more such rounds out of four. The
test counts nothing in seconds: it asserts the verdict, the pairing and where the windows ran, on a
machine of any speed.
"""

from __future__ import annotations

import dagster as dg
import pytest

from tabletune_pipelines.tuning.deployments import identity_for
from tabletune_pipelines.formats.fleet import load_fleet
from tabletune_pipelines.definitions import ASSETS
from tabletune_pipelines.orchestration.partitions import register_identity
from tabletune_pipelines.formats.published import read_published_table
from tabletune_pipelines.store import TableTuneStore
from tests.pipeline.helpers import ScriptedEngine, deployment_dict, make_resources, write_fleet
from tests.tuning.samples import prior, profile

pytestmark = pytest.mark.engine

_SHARED: dict = {}
"""The session's shared server, handed to the engine resource (Dagster rebuilds resources from config)."""


class SharedServerEngine(ScriptedEngine):
    """Scripted identity and profile, but the served verification runs on the real shared server."""

    def verify_served(self, identity, dep, table, prior, log):
        from tabletune_pipelines.engine.tiny_models import read_vocab_size
        from tabletune_pipelines.tuning.served_verification import verify_on_server

        srv = _SHARED["server"]
        opts = self.served_verification_options()
        result = verify_on_server(srv, [list(r) for r in table.ranges], K=identity.max_k,
                                  max_num_seqs=identity.max_num_seqs, loads=opts.loads, rounds=opts.rounds,
                                  window_s=opts.window_s, budget_s=opts.budget_s, tolerance=opts.tolerance,
                                  vocab_size=read_vocab_size(srv.config.model) or 2048, acceptance="synthetic 1.0",
                                  progress=log.info)
        _SHARED["result"] = result
        return result


def _materialize(resources, instance, key):
    return dg.materialize(ASSETS, selection=["draft_length_table", "published_table"], resources=resources,
                          instance=instance, partition_key=key, raise_on_error=False)


def test_failed_served_verification_keeps_the_previous_table(shared_server, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TABLETUNE_HOME", str(home))
    fleet = write_fleet(home, [deployment_dict("local-cpu", max_num_seqs=8)])
    dep = load_fleet(fleet).deployment("local-cpu")
    identity = identity_for(dep, ScriptedEngine().vllm_version)
    assert (identity.max_k, identity.max_num_seqs) == (3, 8) == (shared_server.config.num_speculative_tokens,
                                                               shared_server.config.max_num_seqs)
    store = TableTuneStore(home / "tabletune_store.duckdb")
    store.upsert_identity(identity)
    store.write_profile_cells(identity, list(profile(batch_sizes=(1, 2, 4, 8), identity=identity).cells))
    store.write_acceptance_prior(prior(rates=(0.7, 0.5, 0.3), week="2026-11-09"), identity.key)
    key = identity.key
    _SHARED["server"] = shared_server

    with dg.DagsterInstance.ephemeral() as instance:
        register_identity(instance, key)
        # v1: the table of a = (0.7, 0.5, 0.3), published without served verification.
        first = make_resources(home, fleet, engine=ScriptedEngine(served_verification={"enabled": False}))
        assert _materialize(first, instance, key).success
        v1 = read_published_table(dep.published_table)
        assert v1["version"] == 1 and any(k > 0 for _, _, k in v1["table"]["ranges"])
        before, before_spec = dep.published_table.read_bytes(), dep.speculative_config_path.read_bytes()

        # A newer prior says drafts are almost never kept: the derived table is k = 0 everywhere and
        # every predicted gate passes. The engine keeps every draft.
        store.write_acceptance_prior(prior(rates=(0.02, 0.01, 0.0), week="2026-11-16"), identity.key)
        shared_server.set_synthetic_rates([1.0, 1.0, 1.0])
        try:
            real = make_resources(home, fleet, engine=SharedServerEngine(served_verification={
                "loads": [4, 8], "rounds": 4, "window_s": 2.0, "budget_s": 240, "tolerance": 0.03}))
            res = _materialize(real, instance, key)
        finally:
            shared_server.set_synthetic_rates([0.7, 0.5, 0.3])
            shared_server.set_k(table=[[1, 8, 3]])

    result = _SHARED.pop("result")
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    for name in ("valid_for_vllm", "predicted_loss_under_threshold", "table_supported_by_evidence"):
        assert checks[name].passed, checks[name].description
    assert [list(r) for r in result.candidate] == [[1, 8, 0]] and result.candidate_is == "k=0"
    # Every planned window was measured, on the real step log, running the table it was given.
    # Rounds run until each load is decided (at most 4): a loss this large decides in 2 or 3.
    assert not result.budget_cut and result.plan.rounds == 4
    assert {load for load, _ in result.stop_reasons} == {4, 8}
    assert all(why in ("decided", "rounds") for _, why in result.stop_reasons), result.stop_reasons
    measured = list(result.windows)
    assert 2 * 4 * 2 <= len(measured) <= 2 * 4 * 4 and sum(w.table_verified for w in measured) >= len(measured) - 2
    assert all(w.steps > 0 and w.kept_tokens > 0 for w in measured)
    # The verdict: k = 0 serves a fraction of the best fixed k (k > 0) at every load, beyond the noise.
    assert not result.passed and result.failed_loads and result.verdict == "failed", result.summary()
    for v in result.verdicts:
        assert v.best_fixed_k is not None and v.best_fixed_k > 0, v.reason
        if v.status == "fail":
            assert v.rounds >= 2 and v.ratio + v.t * v.ratio_se < 0.97 and v.loss > 0.03
    served = checks["served_goodput_verified"]
    assert not served.passed and served.metadata["failed_loads"].value == result.failed_loads
    # Nothing was published: the previous table, its companion and the store's versions stay.
    assert not res.success
    assert dep.published_table.read_bytes() == before and dep.speculative_config_path.read_bytes() == before_spec
    assert [p["version"] for p in store.publications("local-cpu")] == [1]
    # What serving measured is kept: every fixed k at both loads, from the real step log, for the next derive.
    cal = store.latest_served_calibration(key)
    assert cal is not None and {(p.k, p.load) for p in cal.points} == {(k, load) for k in range(4) for load in (4, 8)}
    assert all(p.ms > 0 and p.rounds >= 2 and 1 <= p.batch <= p.load for p in cal.points)
    failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert failure.step_key == "published_table"
    assert "local-cpu v1" in failure.step_failure_data.user_failure_data.description
