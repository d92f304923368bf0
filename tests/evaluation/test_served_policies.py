"""Which policies a load of the served verification serves, and how a load is judged when the table
equals a fixed k there or a reference table: worked numbers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tabletune_pipelines.tuning.served_plan import load_batch_sizes, load_policies, plausible_fixed_ks
from tabletune_pipelines.tuning.served_verdict import judge
from tabletune_pipelines.tuning.served_windows import CANDIDATE, Window

TABLE = [[1, 96, 3], [97, 128, 2]]
DOCS = [[1, 64, 3], [65, 128, 1]]


def test_a_load_runs_at_its_top_quarter_of_batch_sizes():
    assert list(load_batch_sizes(128)) == list(range(96, 129))
    assert list(load_batch_sizes(64)) == list(range(48, 65))
    assert list(load_batch_sizes(1)) == [1]


def test_plausible_fixed_ks_are_the_tables_k_their_noise_and_neighbours():
    # Load 64: the table runs k = 3 at B = 48..64; its neighbour is 2; k = 0 and 1 are not served.
    assert plausible_fixed_ks(TABLE, 64, max_k=3, max_num_seqs=128) == (2, 3)
    # Load 128: k = 3 (B = 96) and 2 (B = 97..128) run; neighbours add 1.
    assert plausible_fixed_ks(TABLE, 128, max_k=3, max_num_seqs=128) == (1, 2, 3)
    # The profile's evidence widens the set: k = 0 within noise at B = 60.
    assert plausible_fixed_ks(TABLE, 64, max_k=3, max_num_seqs=128, within_noise={60: (0, 3)}) == (0, 1, 2, 3)


def test_a_table_equal_to_a_fixed_k_at_a_load_is_not_served_twice_and_references_stand_in():
    lp = load_policies(TABLE, 64, max_k=3, max_num_seqs=128, fixed_ks=(2, 3), references={"docs": DOCS})
    assert lp.same == "k=3" and CANDIDATE not in lp.policies and list(lp.policies) == ["k=2", "k=3"]
    assert lp.references == {"docs": CANDIDATE}  # docs' table runs k = 3 at B = 48..64: A/A
    lp = load_policies(TABLE, 128, max_k=3, max_num_seqs=128, fixed_ks=(1, 2, 3), references={"docs": DOCS})
    assert lp.same is None and list(lp.policies) == [CANDIDATE, "k=1", "k=2", "k=3"]
    assert lp.references == {"docs": "k=1"}  # docs' table runs k = 1 there: fixed k = 1's windows stand for it
    lp = load_policies(TABLE, 128, max_k=3, max_num_seqs=128, fixed_ks=(2, 3), references={"docs": DOCS})
    assert lp.references == {"docs": None} and lp.policies["docs"] == DOCS  # no stand-in: served itself


def _windows(load, goodputs):
    """Windows at ``load``: policy -> per-round goodput (kept tokens over 1 s)."""
    return [Window(p, load, r, g, 1.0, 100, float(load), 0) for p, gs in goodputs.items() for r, g in enumerate(gs)]


def test_a_load_where_the_table_is_a_fixed_k_is_judged_against_the_other_fixed_k():
    ws = _windows(64, {"k=3": [100, 104, 98, 102], "k=2": [90, 95, 88, 91]})
    _, (v,) = judge(ws, [64], ["k=0", "k=1", "k=2", "k=3"], tolerance=0.03, same={64: "k=3"},
                    references={64: {"docs": CANDIDATE}})
    # Against k = 2, not against itself (which would be 1.000 ± 0.000, an A/A pair).
    assert v.best_fixed == "k=2" and v.candidate_is == "k=3"
    assert abs(v.ratio - (100 / 90 + 104 / 95 + 98 / 88 + 102 / 91) / 4) < 1e-12
    assert v.status == "pass" and "judged against the other fixed k" in v.reason
    assert v.references[0].same_as == CANDIDATE and v.references[0].ratio is None


def test_a_reference_is_read_through_the_fixed_k_that_stands_for_it():
    ws = _windows(128, {CANDIDATE: [120, 126, 118], "k=1": [100, 110, 100], "k=2": [119, 125, 120]})
    _, (v,) = judge(ws, [128], ["k=1", "k=2"], tolerance=0.03, references={128: {"docs": "k=1"}})
    ref = v.references[0]
    assert ref.same_as == "k=1" and ref.rounds == 3
    assert abs(ref.ratio - (1.2 + 126 / 110 + 1.18) / 3) < 1e-12 and ref.ratio_se > 0
    assert "vs docs: " in ref.line() and "docs is k=1 here" in ref.line()


@given(st.lists(st.integers(0, 3), min_size=16, max_size=16), st.integers(1, 16))
def test_the_candidates_own_ks_at_a_load_are_always_served(ks, load):
    table = [[b, b, k] for b, k in enumerate(ks, start=1)]
    served = plausible_fixed_ks(table, load, max_k=3, max_num_seqs=16)
    assert {ks[b - 1] for b in load_batch_sizes(load)} <= set(served)
    lp = load_policies(table, load, max_k=3, max_num_seqs=16, fixed_ks=served)
    assert (lp.same is None) == (CANDIDATE in lp.policies)
