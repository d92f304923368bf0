"""Live counters of two engines in one file are never pooled into one prior.

The choice (tuning/feedback.py): given the deployment's current engine identity, only that engine's
windows count and the others are reported (``LivePrior.left_out``, ``EngineWindows``); without it,
windows of several engines are refused. Worked example: engine A kept (80, 30, 10) of (100, 50, 25)
drafts; engine B — the same deployment before an upgrade — kept none of 1000. Pooled, a_1 would be
80 / 1100 = 0.07; A's own a_1 is 0.8.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.live_counters import CounterWindow
from tabletune_pipelines.tuning.feedback import live_prior, windows_of_engine

A = "cpu__vllm-0.32.0-cpu__m__d__draft_model__k3__n16__aaaa"
B = "cpu__vllm-0.31.0-cpu__m__d__draft_model__k3__n16__bbbb"
T0 = datetime(2026, 11, 17, 9, tzinfo=timezone.utc)


def window(i: int, key: str | None, drafted, accepted, source="h:1:1") -> CounterWindow:
    return CounterWindow(deployment="local-cpu", window_start=T0 + timedelta(minutes=5 * i),
                         window_end=T0 + timedelta(minutes=5 * i + 5), num_drafts=drafted[0],
                         drafted_per_pos=tuple(drafted), accepted_per_pos=tuple(accepted), identity_key=key,
                         source=source, seq=i)


WINDOWS = [
    window(0, B, [1000, 1000, 1000], [0, 0, 0], source="old:1:1"),
    window(1, A, [60, 30, 15], [48, 18, 6]),
    window(2, None, [500, 500, 500], [500, 500, 500], source="hand:1:1"),
    window(3, A, [40, 20, 10], [32, 12, 4]),
]


def live(windows, **kw):
    return live_prior("local-cpu", "2026-11-16", windows, max_k=3, measured=None, prior_weight=2000,
                      counters_fingerprint="f", **kw)


def test_only_the_current_engines_windows_count_and_the_others_are_reported():
    lp = live(WINDOWS, identity_key=A)
    assert lp.windows == 2 and lp.drafted == (100, 50, 25) and lp.accepted == (80, 30, 10)
    assert lp.prior.rates == pytest.approx((0.8, 0.6, 0.4))  # pooled: (580 / 1600, ...) = 0.3625
    assert lp.prior.num_drafts == 100 and lp.identity_key == A
    assert lp.left_out == {B: 1, "": 1}


def test_windows_of_engine_says_what_it_left_out():
    split = windows_of_engine(WINDOWS, A)
    assert [w.seq for w in split.kept] == [1, 3] and split.left_out == {B: 1, "": 1} and split.left_out_count == 2
    assert split.describe_left_out() == (f"2 window(s) of other engines left out (only {A} is counted): "
                                         f"without an identity key (1), {B} (1)")
    assert windows_of_engine(WINDOWS[1:2], A).describe_left_out() == ""


def test_without_the_engine_named_mixed_windows_are_refused_not_pooled():
    with pytest.raises(InvalidValueError, match=rf"live counters of 'local-cpu' for the week of 2026-11-16 mix windows "
                                                rf"of 3 engines \(no identity key, {B}, {A}\)"):
        live(WINDOWS)
    one = live(WINDOWS[1:2] + WINDOWS[3:])  # one engine: counted as before
    assert one.identity_key == A and one.drafted == (100, 50, 25) and one.left_out == {}


def test_a_week_of_other_engines_only_gives_no_live_prior():
    assert live([WINDOWS[0], WINDOWS[2]], identity_key=A) is None
