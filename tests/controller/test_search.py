"""The controller's fast search and lookups equal the core library's reference functions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.controller.search import (
    compact,
    dense_from_ranges,
    hysteresis_lookups,
    sticky_choice,
    vllm_lookup,
)
from tabletune_pipelines.core.acceptance import BoundaryHysteresis
from tabletune_pipelines.core.table import choose_draft_lengths, compact_ranges


@st.composite
def problems(draw):
    n = draw(st.integers(1, 64))
    ks = sorted(draw(st.sets(st.integers(0, 5), min_size=1, max_size=5)))
    k_max = max(ks) if max(ks) > 0 else 1
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=k_max, max_size=k_max))
    rates = list(np.minimum.accumulate(np.asarray(raw)))
    # Coarse step times so exact ties (the tie-break rule) come up often.
    t = np.asarray(draw(st.lists(st.integers(1, 12), min_size=len(ks) * n, max_size=len(ks) * n)),
                   dtype=float).reshape(len(ks), n) / 2.0
    stick = draw(st.sampled_from([0.0, 0.005, 0.05, 0.3]))
    return t, ks, rates, stick


@settings(max_examples=400, deadline=None)
@given(problems())
def test_sticky_choice_equals_core_search(p):
    t, ks, rates, stick = p
    ref = choose_draft_lengths(t, ks, rates, stickiness=stick).chosen
    assert tuple(sticky_choice(t, ks, rates, stick).tolist()) == ref


def test_worked_example():
    # tau = 1, 1.5, 1.75 for rates (0.5, 0.25); at B = 1 k = 2 wins (1.75/5 > 1.5/4.5 > 1/4),
    # at B = 2 k = 1 is within 0.5 % of nothing better... see the numbers below.
    t = np.array([[4.0, 4.0], [4.5, 4.0], [5.0, 6.0]])
    got = sticky_choice(t, [0, 1, 2], [0.5, 0.25], 0.005).tolist()
    # B=1: G ∝ (1/4, 1.5/4.5, 1.75/5) = (.25, .333, .35) → k=2. B=2: (.5, .75, .583) → k=1 beats k=2 by 28 %.
    assert got == [2, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_compact_and_dense_round_trip(ks):
    assert [list(r) for r in compact(ks)] == compact_ranges(ks)
    assert dense_from_ranges(compact(ks), len(ks)).tolist() == ks
    assert vllm_lookup(np.asarray(ks))[1:] == ks


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 4))
def test_hysteresis_lookups_equal_boundary_hysteresis(ks, h):
    dense = np.asarray(ks)
    lookups = hysteresis_lookups(dense, [0, 1, 2, 3], h)
    ref = BoundaryHysteresis(h)
    for cur in (0, 1, 2, 3):
        for b in range(1, len(ks) + 1):
            assert lookups[cur][b] == ref.select(ks, b, cur), (ks, h, cur, b)
    assert hysteresis_lookups(dense, [0, 1], 0) == {}
