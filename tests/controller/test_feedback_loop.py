"""The whole loop once, on real vLLM (CPU build): a served engine with the controller exports its
live counters; the pipeline's own functions ingest them into a live prior; the next table changes
because of them; the engine picks that table up while serving (and serves it: observe mode, so the
controller itself changes nothing).

Pipeline side, all library functions the Dagster assets call (no Dagster here): the DuckDB store
(identity, profile, prior, tables, publications), ``tuning.derive.derive_table`` (the table search),
``TableTuneStore.publish`` with ``published_build.controller_fields`` (what ``published_table`` writes:
identity, prior and its count, the deployment's controller settings, the fleet's ``live_counters``
path as the export path), ``live_counters.read_live_counters`` + ``tuning.feedback.windows_in_week``
+ ``tuning.feedback.live_prior`` (what ``live_acceptance_counters`` does). Engine side: the tiny
target + draft model, synthetic acceptance (0.3, 0.1, 0.05) as the live truth, while the first
published prior says (0.9, 0.8, 0.7). The step-time profile is the synthetic linear one.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.formats.documents import AcceptancePrior, EngineIdentity, StepTimeCell, StepTimeProfile
from tabletune_pipelines.evaluation.rig import closed_loop, tiny
from tabletune_pipelines.evaluation.synthetic import linear_profile
from tabletune_pipelines.formats.live_counters import read_live_counters
from tabletune_pipelines.formats.published import load_published
from tabletune_pipelines.formats.published_build import controller_fields
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning.derive import derive_table
from tabletune_pipelines.tuning.feedback import live_prior, windows_in_week

from tests.controller.conftest import DEPLOYMENT, published_path

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


#: The acceptance the engine serves (its synthetic rates) and the prior weight the pipeline blends with.
TRUE_RATES = (0.3, 0.1, 0.05)
PRIOR_WEIGHT = 2000.0
#: Drafts at position 3 the served load must export before the pipeline's week run. Sized by what the
#: test asserts, the next table differing from v1: blended with the measured prior (0.9, 0.8, 0.7) at
#: weight 2000, counts at the served rates (0.3, 0.1, 0.05) first change the derived table (linear
#: profile) at about 1000 drafts a position, and at 1200 where the live rates read 3 binomial standard
#: errors high (1200 drafts: +0.040, +0.026, +0.019); LIVE_DRAFTS is twice that, and the test checks
#: that half of it moves the table at +3 standard errors (``blended``). Each position is drafted once
#: per k = 3 step and request (observe mode on v1, k = 3 everywhere), so all three see LIVE_DRAFTS.
LIVE_DRAFTS = 2400


def blended(measured: AcceptancePrior, drafts: int, rates, z: float) -> AcceptancePrior:
    """What ``live_prior`` makes of one window of ``drafts`` drafts a position whose kept fraction reads
    ``z`` binomial standard errors above ``rates``, blended with ``measured`` at ``PRIOR_WEIGHT``."""
    import math

    from tabletune_pipelines.formats.live_counters import CounterWindow

    t0 = datetime(2026, 11, 30, 9, tzinfo=timezone.utc)
    kept = [int(drafts * min(1.0, a + z * math.sqrt(a * (1 - a) / drafts))) for a in rates]
    w = CounterWindow(deployment=DEPLOYMENT, window_start=t0, window_end=t0 + timedelta(minutes=5), num_drafts=drafts,
                      drafted_per_pos=(drafts,) * len(rates), accepted_per_pos=tuple(kept))
    lp = live_prior(DEPLOYMENT, "2026-11-30", [w], max_k=len(rates), measured=measured, prior_weight=PRIOR_WEIGHT,
                    counters_fingerprint="sizing")
    assert lp is not None
    return lp.prior


def test_served_counters_change_the_next_published_table(controller_server, tmp_path):
    m = tiny()
    ident = EngineIdentity(gpu="cpu", vllm_version="0.32.0+cpu", model=str(m.target_dir), drafter=str(m.draft_dir),
                           method="draft_model", max_k=3, max_num_seqs=16)
    cells = tuple(StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms,), launch_k=3)
                  for k, row in linear_profile().items() for b, ms in row.items())
    profile = StepTimeProfile(identity=ident, cells=cells)
    measured = AcceptancePrior(rates=(0.9, 0.8, 0.7), num_drafts=4800, drafted_per_pos=(4800, 4800, 4800),
                               accepted_per_pos=(4320, 3840, 3360), prompt_fingerprint="f" * 64, prompt_count=160,
                               source="measured", deployment=DEPLOYMENT)
    store = TableTuneStore(tmp_path / "tt.duckdb")
    key = store.upsert_identity(ident)
    store.write_profile_cells(ident, list(cells))
    store.write_acceptance_prior(measured, key)
    pub, live = published_path(controller_server), tmp_path / "live" / f"{DEPLOYMENT}.jsonl"
    live.parent.mkdir()  # the operator's folder for the export (the controller creates none)
    # Observe mode: the controller serves the published table as it is and only counts, so the
    # table served changes only through the pipeline (the loop under test, not the controller's own).
    fleet_controller = {"mode": "observe", "export_every_steps": 100, "export_every_s": 1.0}

    def publish(table, prior):
        store.write_table(table)
        return store.publish(DEPLOYMENT, table, pub, document_fields=controller_fields(
            identity=store.find_identity(table.identity_key), prior=prior, controller=fleet_controller,
            live_counters=live, allowed_k=[0, 1, 2, 3]))

    v1_table = derive_table(profile, measured).table
    # The sizing holds: half the served drafts already move the table, even where the live rates read
    # 3 binomial standard errors above the served truth (the blend a shorter run would give).
    half = blended(measured, LIVE_DRAFTS // 2, TRUE_RATES, 3.0)
    assert derive_table(profile, half).table.ranges != v1_table.ranges, half.rates
    doc1 = publish(v1_table, measured)
    assert load_published(pub).controller["export_path"] == str(live)

    srv = controller_server
    srv.set_synthetic_rates(list(TRUE_RATES))
    load = closed_loop(srv, 8).start()
    try:
        # Serve until the export holds LIVE_DRAFTS drafts at position 3 in at least 8 windows: a count of
        # work, not of seconds (a machine 3x slower takes 3x longer; the deadline only bounds a stall).
        deadline = time.monotonic() + 420

        def enough() -> bool:
            ws = read_live_counters(live).windows if live.exists() else []
            return len(ws) >= 8 and sum(w.drafted_per_pos[2] for w in ws) >= LIVE_DRAFTS

        while not enough():
            assert time.monotonic() < deadline, f"too few exported drafts after 420 s:\n{srv.log_tail(20)}"
            time.sleep(1.0)
        # --- the pipeline's week run: ingest the counters, derive, publish
        read = read_live_counters(live)
        now = datetime.now(timezone.utc)
        week_start = (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
        week = week_start.date().isoformat()
        wins = windows_in_week(read.windows, DEPLOYMENT, week_start, week_start + timedelta(days=7))
        assert len(wins) >= 8 and all(w.identity_key == key for w in wins)
        lp = live_prior(DEPLOYMENT, week, wins, max_k=3, measured=measured, prior_weight=PRIOR_WEIGHT,
                        counters_fingerprint=read.fingerprint)
        assert lp is not None and lp.prior.source == "live" and lp.blended_with == measured.prior_id
        store.write_acceptance_prior(lp.prior, key)
        v2_table = derive_table(profile, lp.prior).table
        print(f"\n[loop] v1 {doc1['table']['ranges']} from {measured.rates}; live counts {lp.drafted} / "
              f"{lp.accepted} over {lp.windows} windows -> live prior {[round(r, 3) for r in lp.prior.rates]}; "
              f"v2 {[list(r) for r in v2_table.ranges]}")
        assert all(a < b for a, b in zip(lp.prior.rates, measured.rates))  # moved towards the truth
        assert v2_table.ranges != v1_table.ranges
        doc2 = publish(v2_table, lp.prior)
        v2 = doc1["version"] + 1  # one above the shared file's version (the controller installs only newer ones)
        assert doc2["version"] == v2 and doc2["prior"]["source"] == "live"
        # --- the serving engine picks the new version up
        deadline = time.monotonic() + 240  # one poll and the next window: seconds here, minutes on a slow machine
        got = None
        while time.monotonic() < deadline and got is None:
            got = next((w for w in read_live_counters(live).windows if w.table_version == v2), None)
            time.sleep(0.5)
    finally:
        load.stop()
    assert load.errors == [] and got is not None
    assert got.controller["published_version"] == v2 and got.controller["prior"] == list(lp.prior.rates)
    assert got.controller["table"] == [list(r) for r in v2_table.ranges]  # served now
    assert f"published v{v2} of local-cpu loaded" in srv.log_path.read_text()
