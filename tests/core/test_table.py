"""Table search, compaction and validation; property tests and agreement with vLLM's own validator."""

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.table import (
    allowed_ks_from_table,
    choose_draft_lengths,
    compact_ranges,
    expand_table,
    validate_table,
    validate_vllm_schedule,
)
from tabletune_pipelines.errors import InvalidTableError

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@st.composite
def search_inputs(draw):
    max_num_seqs = draw(st.integers(1, 64))
    ks = sorted(draw(st.sets(st.integers(0, 5), min_size=1, max_size=6)))
    kmax = max(max(ks), 1)
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=kmax, max_size=kmax))
    rates = tuple(np.minimum.accumulate(sorted(raw, reverse=True)))
    times = np.array(
        [[draw(st.floats(0.5, 100.0)) for _ in range(max_num_seqs)] for _ in ks]
    )
    allowed = draw(st.one_of(st.none(), st.sets(st.sampled_from(ks), min_size=1)))
    return max_num_seqs, ks, rates, times, allowed


@settings(max_examples=300, deadline=None)
@given(search_inputs())
def test_built_tables_are_valid_near_optimal_and_use_allowed_ks(inp):
    max_num_seqs, ks, rates, times, allowed = inp
    choice = choose_draft_lengths(times, ks, rates, allowed_ks=allowed)
    ranges = choice.ranges
    # Covers 1..max_num_seqs with valid, contiguous ranges.
    assert validate_table(ranges, max_num_seqs, max(max(ks), 1)) == [tuple(r) for r in ranges]
    assert expand_table(ranges, max_num_seqs, max(max(ks), 1)) == list(choice.chosen)
    permitted = set(ks) if allowed is None else set(allowed)
    assert set(choice.chosen) <= permitted
    # Each chosen k is within 0.5% of the best allowed goodput at its batch size.
    rows = [i for i, k in enumerate(ks) if k in permitted]
    for b, k in enumerate(choice.chosen):
        best = max(choice.goodput[i, b] for i in rows)
        assert choice.goodput[ks.index(k), b] * 1.005 >= best * (1 - 1e-12)


def test_stickiness_keeps_near_ties_together():
    # k=1 and k=3 alternate being better by 0.2%: stickiness keeps one range.
    rates = (1.0, 1.0, 1.0)
    t1 = np.full(8, 2.0 / 1.0)  # tau(1)=2 → 1 token/ms per request
    t3 = np.array([4.0 / (1.002 if b % 2 else 0.998) for b in range(8)])  # tau(3)=4
    choice = choose_draft_lengths(np.vstack([t1, t3]), (1, 3), rates)
    assert len(choice.ranges) == 1
    # Without stickiness the near-ties fragment the table.
    loose = choose_draft_lengths(np.vstack([t1, t3]), (1, 3), rates, stickiness=0.0)
    assert len(loose.ranges) > 1


def test_crossover_table_from_design_cpu_measurements():
    # Medium target on CPU (docs/engine-facts.md, "CPU build"), B = 1 / 4 / 16, interpolated per B.
    from tabletune_pipelines.core.steptime import StepTimeSurface
    from tabletune_pipelines.core.table import build_table

    s = StepTimeSurface.from_cells({
        0: {1: 14.1, 4: 15.3, 16: 25.6},
        1: {1: 16.9, 4: 22.6, 16: 42.3},
        3: {1: 17.4, 4: 28.1, 16: 64.6},
    })
    choice = build_table(s, (0.7, 0.5, 0.3), 16)
    assert choice.chosen[0] == 3 and choice.chosen[-1] == 1
    assert choice.ranges[0][:2] == [1, choice.ranges[0][1]] and choice.ranges[-1][1] == 16


def test_compact_ranges():
    assert compact_ranges([3, 3, 1, 1, 1, 0]) == [[1, 2, 3], [3, 5, 1], [6, 6, 0]]
    with pytest.raises(InvalidTableError):
        compact_ranges([])


@pytest.mark.parametrize(
    "table,needle",
    [
        ([[1, 4, 3], [4, 8, 1]], "overlap"),
        ([[1, 4, 3], [6, 8, 1]], "gap between ranges \\[1, 4, 3\\] and \\[6, 8, 1\\]"),
        ([[2, 8, 1]], "starts at 2"),
        ([[1, 8, 4]], "k = 4"),
        ([[1, 6, 1]], "ends at 6"),
        ([], "empty"),
        ([[1, 8]], "3-item"),
        ([[1, "x", 3]], "end 'x' is not an integer"),
        ([[3, 1, 1]], "start 3 is after end 1"),
        ([[1, 8, -1]], "k = -1"),
        ("1-8:3", "non-empty list"),
    ],
)
def test_bad_tables_name_the_problem(table, needle):
    with pytest.raises(InvalidTableError, match=needle):
        validate_table(table, 8, 3)


def test_allowed_ks_from_docs_table():
    docs_eagle3 = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]
    assert allowed_ks_from_table(docs_eagle3) == [0, 1, 3, 4, 5]


# -- agreement with vLLM ---------------------------------------------------------------------

entry_values = st.one_of(st.integers(-3, 40), st.sampled_from(["2", "x", 1.5, None]))
tables = st.one_of(
    st.lists(st.lists(entry_values, min_size=3, max_size=3), max_size=5),
    st.lists(st.lists(st.integers(-1, 40), min_size=2, max_size=4), max_size=4),
    st.just(None),
    st.just("not a list"),
)


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed here")
@settings(max_examples=400, deadline=None)
@given(tables, st.integers(1, 48), st.integers(1, 6))
def test_validator_and_expansion_agree_with_vllm(table, max_num_seqs, max_k):
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    try:
        theirs = validate_and_normalize_dynamic_sd_schedule(table)
    except (ValueError, TypeError):
        theirs = None
    try:
        ours = validate_vllm_schedule(table)
    except InvalidTableError:
        ours = None
    assert ours == theirs
    if theirs is not None:
        assert expand_table(table, max_num_seqs, max_k) == build_dynamic_sd_schedule_lookup(table, max_num_seqs, max_k)[1:]


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed here")
def test_vllm_agreement_on_named_examples():
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    good = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
    assert validate_vllm_schedule(good) == validate_and_normalize_dynamic_sd_schedule(good)
    for bad in ([[1, 4, 3], [4, 8, 1]], [[2, 8, 1]], []):
        with pytest.raises(ValueError):
            validate_and_normalize_dynamic_sd_schedule(bad)
        with pytest.raises(InvalidTableError):
            validate_vllm_schedule(bad)
