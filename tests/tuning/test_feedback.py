"""Live counters → a live prior, as a plain function (the asset only reads files and stores the result)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.formats.live_counters import CounterWindow
from tabletune_pipelines.tuning.feedback import live_prior, windows_in_week
from tests.tuning.samples import prior

START = datetime(2026, 11, 16, tzinfo=timezone.utc)
END = START + timedelta(days=7)


def window(end: datetime, drafted, accepted, deployment="local-cpu", key=None) -> CounterWindow:
    return CounterWindow(deployment=deployment, window_start=end - timedelta(minutes=5), window_end=end,
                         num_drafts=max(drafted), drafted_per_pos=tuple(drafted), accepted_per_pos=tuple(accepted),
                         identity_key=key)


def test_windows_in_week_keeps_the_deployments_windows_ending_in_the_week():
    inside = window(START + timedelta(hours=1), [10], [5])
    at_start = window(START, [10], [5])
    at_end = window(END, [10], [5])  # belongs to the next week
    other = window(START + timedelta(hours=1), [10], [5], deployment="other")
    assert windows_in_week([inside, at_start, at_end, other], "local-cpu", START, END) == [inside, at_start]


def test_blend_with_the_measured_prior():
    measured = prior(rates=(0.7, 0.5, 0.3), drafts=2400)
    wins = [window(START + timedelta(days=1), [4000, 4000, 2000], [3600, 3000, 1000], key="ident-1")]
    live = live_prior("local-cpu", "2026-11-16", wins, max_k=3, measured=measured, prior_weight=2000,
                      counters_fingerprint="abc")
    # â_i = (2000·a_i + accepted_i) / (2000 + drafted_i)
    assert live.prior.rates == pytest.approx((5000 / 6000, 4000 / 6000, 1600 / 4000))
    assert live.prior.source == "live" and live.prior.week == "2026-11-16" and live.prior.num_drafts == 4000
    assert live.drafted == (4000, 4000, 2000) and live.accepted == (3600, 3000, 1000)
    assert live.blended_with == measured.prior_id and "w = 2000" in live.basis
    assert live.identity_key == "ident-1" and live.windows == 1


def test_without_a_measured_prior_the_counts_stand_alone_and_never_increase():
    wins = [window(START + timedelta(days=1), [100, 100, 0], [50, 60, 0]),
            window(START + timedelta(days=2), [100, 100, 0], [50, 60, 0])]
    live = live_prior("local-cpu", "2026-11-16", wins, max_k=3, measured=None, prior_weight=2000,
                      counters_fingerprint="abc")
    # Position 2 accepted more than position 1 per draft: pooled down; never-drafted position 3 is 0.
    assert live.prior.rates == pytest.approx((0.5, 0.5, 0.0))
    assert live.blended_with is None and "live counters only" in live.basis and live.windows == 2
    assert live.identity_key is None


def test_a_measured_prior_shorter_than_the_counts_is_not_blended():
    wins = [window(START + timedelta(days=1), [100, 100, 100, 100], [80, 60, 40, 20])]
    live = live_prior("local-cpu", "2026-11-16", wins, max_k=4, measured=prior(), prior_weight=2000,
                      counters_fingerprint="abc")
    assert live.blended_with is None and live.prior.rates == pytest.approx((0.8, 0.6, 0.4, 0.2))


def test_no_windows_no_prior_and_the_id_follows_the_counts():
    assert live_prior("local-cpu", "2026-11-16", [], max_k=3, measured=None, prior_weight=2000,
                      counters_fingerprint="abc") is None
    wins = [window(START + timedelta(days=1), [100, 100, 100], [80, 60, 40])]
    a = live_prior("local-cpu", "2026-11-16", wins, max_k=3, measured=None, prior_weight=2000, counters_fingerprint="a")
    b = live_prior("local-cpu", "2026-11-16", wins, max_k=3, measured=None, prior_weight=2000, counters_fingerprint="b")
    assert a.prior.prior_id != b.prior.prior_id
