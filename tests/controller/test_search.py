"""The controller's lookups and table forms equal the core library's reference functions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.controller.search import (
    compact,
    dense_of,
    hysteresis_lookups,
)
from tabletune_pipelines.core.acceptance_estimate import BoundaryHysteresis
from tabletune_pipelines.core.table import DraftTable, vllm_layout


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_compact_and_dense_round_trip(ks):
    assert [list(r) for r in compact(ks)] == DraftTable.from_dense(ks).entries()
    assert dense_of(compact(ks), len(ks)).tolist() == ks
    assert vllm_layout(np.asarray(ks))[1:] == ks


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
