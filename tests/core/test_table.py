"""Table search, the table type (``DraftTable``: validation, lookups, compaction, the 3- and 5-item
forms, diff); worked numbers, property tests and agreement with vLLM's own validator."""

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune_pipelines.core.table import Axes, DraftTable, TableChange, choose_draft_lengths
from tabletune_pipelines.errors import InvalidTableError, InvalidValueError

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
    table = DraftTable.from_entries(ranges, max_num_seqs=max_num_seqs, max_k=max(max(ks), 1))
    assert table.entries() == ranges
    assert table.vllm_lookup(max_num_seqs, max(max(ks), 1))[1:] == list(choice.chosen)
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


def test_from_dense_compacts_runs_of_equal_k():
    assert DraftTable.from_dense([3, 3, 1, 1, 1, 0]).entries() == [[1, 2, 3], [3, 5, 1], [6, 6, 0]]
    with pytest.raises(InvalidTableError):
        DraftTable.from_dense([])


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
        DraftTable.from_entries(table, max_num_seqs=8, max_k=3)


def test_allowed_ks_from_docs_table():
    docs_eagle3 = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]
    assert DraftTable.from_entries(docs_eagle3).allowed_ks() == [0, 1, 3, 4, 5]


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
        ours = [tuple(e) for e in DraftTable.from_entries(table).entries()]
    except InvalidTableError:
        ours = None
    assert ours == theirs
    if theirs is not None:
        ours_lookup = DraftTable.from_entries(table).vllm_lookup(max_num_seqs, max_k)
        assert ours_lookup == build_dynamic_sd_schedule_lookup(table, max_num_seqs, max_k)


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed here")
def test_vllm_agreement_on_named_examples():
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    good = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
    ours = [tuple(e) for e in DraftTable.from_entries(good).entries()]
    assert ours == validate_and_normalize_dynamic_sd_schedule(good)
    for bad in ([[1, 4, 3], [4, 8, 1]], [[2, 8, 1]], []):
        with pytest.raises(ValueError):
            validate_and_normalize_dynamic_sd_schedule(bad)
        with pytest.raises(InvalidTableError):
            DraftTable.from_entries(bad)


# -- the table type: worked numbers ------------------------------------------------------------------

DOCS = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
#: Two batch-size ranges by three context buckets (the 5-item form).
GRID = [[1, 16, 1, 1024, 3], [1, 16, 1025, 4096, 2], [1, 16, 4097, 32768, 0],
        [17, 64, 1, 1024, 1], [17, 64, 1025, 4096, 1], [17, 64, 4097, 32768, 0]]


def test_a_3_item_table_gives_k_per_batch_size_for_every_context():
    t = DraftTable.from_entries(DOCS)
    assert t.axes == Axes(((1, 64), (65, 128), (129, 512)))
    assert t.ks == ((3,), (1,), (0,))
    assert [t.k_at(b) for b in (1, 64, 65, 128, 129, 512, 600)] == [3, 3, 1, 1, 0, 0, 0]
    assert t.k_at(70, ctx=100_000) == 1  # context is not read without a context axis
    assert t.cell(1) == 1 and t.allowed_ks() == [0, 1, 3]
    assert t.entries() == DOCS and t.entry_tuples() == ((1, 64, 3), (65, 128, 1), (129, 512, 0))


def test_a_gap_carries_the_previous_k_forward_as_vllm_does():
    t = DraftTable.from_entries([[1, 4, 3], [8, 10, 1]])
    assert t.dense(12).tolist() == [3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1]
    assert t.vllm_lookup(12, 2) == [0, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1]
    with pytest.raises(InvalidTableError, match="gap between ranges \\[1, 4, 3\\] and \\[8, 10, 1\\]"):
        DraftTable.from_entries([[1, 4, 3], [8, 10, 1]], max_num_seqs=10, max_k=3)


def test_a_5_item_table_gives_k_per_batch_size_and_context():
    t = DraftTable.from_entries(GRID, allow_context=True)
    assert t.axes.context == ((1, 1024), (1025, 4096), (4097, 32768))
    assert t.axes.shape == (2, 3) and t.ks == ((3, 2, 0), (1, 1, 0))
    assert [t.k_at(8, c) for c in (1, 1024, 1025, 4096, 4097, 10**6)] == [3, 3, 2, 2, 0, 0]
    assert [t.k_at(b, 2000) for b in (1, 16, 17, 64, 100)] == [2, 2, 1, 1, 1]
    assert t.cell(0, 1) == 2 and t.allowed_ks() == [0, 1, 2, 3]
    assert t.dense(3).tolist() == [[3, 2, 0]] * 3
    assert t.vllm_lookup(2) == [[0, 0, 0], [3, 2, 0], [3, 2, 0]]
    assert t.entries() == GRID
    with pytest.raises(InvalidTableError, match="needs the context length"):
        t.k_at(8)


@pytest.mark.parametrize("entries,needle", [
    ([[1, 8, 3], [9, 16, 1, 100, 2]], "3-item"),  # a 5-item entry where context is not allowed
    (GRID[:2] + GRID[3:], "must be rectangular"),
    ([[1, 8, 2, 100, 3]], "starts at 2; the buckets must be contiguous from 1"),
    ([[1, 8, 1, 100, 3], [1, 8, 200, 300, 1]], "starts at 200"),
    ([[1, 8, 1, 100, 3], [1, 8, 1, 100, 1]], "repeats the cell"),
    ([[1, 8, 50, 10, 3]], "context bucket 50..10"),
    ([[1, 8, 1, 100, 3], [9, 16, 2]], "mix 3-item and 5-item"),
    ([[1, 8, 1, 100, 9]], "k = 9"),
])
def test_bad_5_item_tables_name_the_problem(entries, needle):
    allow = needle != "3-item"
    with pytest.raises(InvalidTableError, match=needle):
        DraftTable.from_entries(entries, allow_context=allow, max_num_seqs=8 if needle == "k = 9" else None,
                                max_k=3 if needle == "k = 9" else None)


@pytest.mark.parametrize("axes,needle", [
    (dict(batch=()), "empty"),
    (dict(batch=((2, 8),)), "starts at 2"),
    (dict(batch=((1, 8), (5, 9))), "\\[1, 8\\] and \\[5, 9\\] overlap"),
    (dict(batch=((1, 0),)), "must be positive"),
    (dict(batch=((1, 8),), context=((1, 10), (12, 20))), "starts at 12"),
    (dict(batch=((1, 8),), context=()), "context axis is empty"),
])
def test_bad_axes_name_the_bad_value(axes, needle):
    with pytest.raises(InvalidTableError, match=needle):
        Axes(**axes)


def test_a_grid_of_the_wrong_shape_is_refused():
    with pytest.raises(InvalidTableError, match="not 2 x 1"):
        DraftTable(Axes(((1, 4), (5, 8))), ((3,),))
    with pytest.raises(InvalidTableError, match="k = -1"):
        DraftTable(Axes(((1, 4),)), ((-1,),))


def test_diff_names_each_cell_that_changes():
    a = DraftTable.from_entries([[1, 4, 3], [5, 8, 1]])
    b = DraftTable.from_entries([[1, 3, 3], [4, 8, 1]])
    assert a.diff(b) == (TableChange(4, None, 3, 1),)
    assert b.diff(a) == (TableChange(4, None, 1, 3),)
    assert a.diff(a) == () and a.diff(b, n=3) == ()
    # A 3-item table against a 5-item one: the 3-item k holds in every bucket.
    g = DraftTable.from_entries([[1, 8, 1, 100, 3], [1, 8, 101, 200, 0]], allow_context=True)
    flat = DraftTable.from_entries([[1, 8, 3]])
    assert flat.diff(g) == tuple(TableChange(b, (101, 200), 3, 0) for b in range(1, 9))


# -- the table type: properties ----------------------------------------------------------------------

@st.composite
def tables_3(draw):
    """A valid 3-item table (gaps allowed, as vLLM allows them)."""
    n = draw(st.integers(1, 6))
    starts = sorted(draw(st.sets(st.integers(2, 60), max_size=n - 1)) | {1})
    out = []
    for i, s in enumerate(starts):
        nxt = starts[i + 1] if i + 1 < len(starts) else s + draw(st.integers(0, 20)) + 1
        e = draw(st.integers(s, nxt - 1))
        out.append([s, e, draw(st.integers(0, 5))])
    return out


@st.composite
def tables_5(draw):
    """A valid 5-item table: contiguous batch ranges by contiguous context buckets from 1."""
    cuts = sorted(draw(st.sets(st.integers(2, 40), max_size=4)))
    batch = list(zip([1, *cuts], [c - 1 for c in cuts] + [draw(st.integers(max([1, *cuts]), 64))]))
    ccuts = sorted(draw(st.sets(st.integers(2, 9000), max_size=3)))
    ctx = list(zip([1, *ccuts], [c - 1 for c in ccuts] + [draw(st.integers(max([1, *ccuts]), 10_000))]))
    return [[lo, hi, c0, c1, draw(st.integers(0, 4))] for lo, hi in batch for c0, c1 in ctx]


@settings(max_examples=200, deadline=None)
@given(tables_3())
def test_3_item_entries_round_trip_and_the_dense_lookup_is_k_at(entries):
    t = DraftTable.from_entries(entries)
    assert t.entries() == entries and DraftTable.from_entries(t.entries()) == t
    n = entries[-1][1] + 5
    lookup = t.vllm_lookup(n)
    assert lookup[0] == 0 and len(lookup) == n + 1
    assert lookup[1:] == [t.k_at(b) for b in range(1, n + 1)] == t.dense(n).tolist()
    assert DraftTable.from_dense(t.dense(n)).dense(n).tolist() == t.dense(n).tolist()


@settings(max_examples=200, deadline=None)
@given(tables_5(), st.integers(1, 12_000))
def test_5_item_entries_round_trip_and_the_dense_lookup_is_k_at(entries, ctx):
    t = DraftTable.from_entries(entries, allow_context=True)
    assert t.entries() == entries and DraftTable.from_entries(entries[::-1], allow_context=True) == t
    n = t.axes.batch[-1][1] + 3
    lookup, col = t.vllm_lookup(n), t.axes.context_column(ctx)
    assert [row[col] for row in lookup[1:]] == [t.k_at(b, ctx) for b in range(1, n + 1)]
    again = DraftTable.from_dense(t.dense(n), context=t.axes.context)
    assert again.dense(n).tolist() == t.dense(n).tolist()


@settings(max_examples=200, deadline=None)
@given(tables_3(), tables_3())
def test_diff_is_exactly_the_batch_sizes_where_k_differs(a, b):
    ta, tb = DraftTable.from_entries(a), DraftTable.from_entries(b)
    n = max(a[-1][1], b[-1][1])
    want = [(x, ta.k_at(x), tb.k_at(x)) for x in range(1, n + 1) if ta.k_at(x) != tb.k_at(x)]
    assert [(c.batch_size, c.before, c.after) for c in ta.diff(tb)] == want
    assert [(c.batch_size, c.after, c.before) for c in tb.diff(ta)] == want


def test_context_buckets_split_at_the_geometric_mean_of_neighbouring_levels():
    from tabletune_pipelines.core.table import context_buckets
    assert context_buckets([256, 1024, 4096], 8192) == ((1, 512), (513, 2048), (2049, 8192))
    assert context_buckets([100], 2048) == ((1, 2048),)
    assert context_buckets([100, 300], 300) == ((1, 173), (174, 300))  # isqrt(30000) = 173
    for bad in ([], [0, 5], [5, 5], [9, 3]):
        with pytest.raises(InvalidTableError):
            context_buckets(bad, 8192)
    with pytest.raises(InvalidTableError, match="below the last context level 4096"):
        context_buckets([256, 4096], 2048)


def test_context_buckets_are_valid_table_axes():
    from tabletune_pipelines.core.table import Axes, context_buckets
    axes = Axes(batch=((1, 16),), context=context_buckets([32, 96, 288], 512))
    assert [axes.context_column(c) for c in (1, 32, 55, 56, 96, 166, 167, 512, 9999)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_aggregate_context_reads_one_length_per_step():
    from tabletune_pipelines.core.table import aggregate_context
    assert aggregate_context([100, 200, 601]) == 300          # mean 300.33
    assert aggregate_context([100, 200, 601], "median") == 200
    assert aggregate_context([100, 200, 601], "max") == 601
    assert aggregate_context([1, 2]) == 2                     # 1.5 rounds half up
    assert aggregate_context([]) == 1
    with pytest.raises(InvalidValueError, match="'p90'"):
        aggregate_context([5], "p90")  # type: ignore[arg-type]  # a hostile value on purpose


def test_from_columns_merges_adjacent_buckets_that_agree_at_every_batch_size():
    short, mid, long = [3, 3, 2, 2], [3, 3, 2, 2], [1, 1, 1, 0]
    table = DraftTable.from_columns([short, mid, long], ((1, 512), (513, 2048), (2049, 8192)))
    assert table.axes.context == ((1, 2048), (2049, 8192))
    assert table.entries() == [[1, 2, 1, 2048, 3], [1, 2, 2049, 8192, 1], [3, 3, 1, 2048, 2],
                               [3, 3, 2049, 8192, 1], [4, 4, 1, 2048, 2], [4, 4, 2049, 8192, 0]]
    assert (table.k_at(1, 2048), table.k_at(4, 2049)) == (3, 0)


def test_from_columns_with_one_bucket_left_is_the_3_item_table():
    table = DraftTable.from_columns([[3, 3, 1], [3, 3, 1]], ((1, 1024), (1025, 8192)))
    assert table.axes.context is None and table == DraftTable.from_dense([3, 3, 1])
    assert table.entries() == [[1, 2, 3], [3, 3, 1]]


def test_from_columns_refuses_mismatched_columns_and_buckets():
    with pytest.raises(InvalidTableError, match="2 column"):
        DraftTable.from_columns([[1], [2]], ((1, 10),))
    with pytest.raises(InvalidTableError, match=r"cover \[2, 3\] batch sizes"):
        DraftTable.from_columns([[1, 1], [2, 2, 2]], ((1, 10), (11, 20)))
    with pytest.raises(InvalidTableError, match="contiguous from 1"):
        DraftTable.from_columns([[1], [1]], ((2, 10), (11, 20)))
