"""evaluation.synthetic, worked numbers: the linear profile, the reference table built from it, the
quarter of that table (the repair experiment's wrong table), the fixed prior and the published file."""

from __future__ import annotations

import numpy as np
import pytest

from tabletune_pipelines.errors import PublishedTableError
from tabletune_pipelines.evaluation.simulator import quartered
from tabletune_pipelines.evaluation.synthetic import (
    IDENTITY,
    LAUNCH,
    REBUILD_BUDGET_MS,
    K,
    N,
    dense,
    fixed_prior,
    linear_profile,
    publish,
    true_table,
)
from tabletune_pipelines.formats.published import load_published

RATES = (0.7, 0.5, 0.3)


def test_the_test_engine_lists_every_k_in_its_launch_table():
    assert (N, K) == (16, 3)
    assert LAUNCH == ((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 16, 3))
    assert IDENTITY["max_k"] == K and IDENTITY["max_num_seqs"] == N and IDENTITY["method"] == "draft_model"


def test_linear_profile_worked_numbers():
    p = linear_profile()
    assert sorted(p) == [0, 1, 2, 3] and all(sorted(row) == list(range(1, 17)) for row in p.values())
    # T(B, k) = 4 + 0.6 k + B (0.1 + 0.1 k) ms
    assert p[0][1] == pytest.approx(4.1)
    assert p[2][8] == pytest.approx(4 + 1.2 + 8 * 0.3)  # 7.6
    assert p[3][16] == pytest.approx(4 + 1.8 + 16 * 0.4)  # 12.2
    q = linear_profile(4, 1, c0=1.0, c1=2.0, d0=0.5, d1=0.25)
    assert q == {0: {1: 1.5, 2: 2.0, 3: 2.5, 4: 3.0}, 1: {1: 3.75, 2: 4.5, 3: 5.25, 4: 6.0}}


def test_dense_is_one_row_per_k_and_one_column_per_batch_size():
    p = linear_profile(4, 1, c0=1.0, c1=2.0, d0=0.5, d1=0.25)
    np.testing.assert_allclose(dense(p, (1, 0), 4), [[3.75, 4.5, 5.25, 6.0], [1.5, 2.0, 2.5, 3.0]])
    assert dense(linear_profile(), (0, 1, 2, 3)).shape == (4, N)


def test_true_table_worked_example():
    # goodput B (1 + a_1 + ... + a_k) / T(B, k), tokens per ms, on the linear profile with a = (0.7, 0.5, 0.3):
    #   B = 1:  k = 2: 2.2 / 5.5 = 0.4000; k = 3: 2.5 / 6.2 = 0.4032 (0.8 % better: k = 3)
    #   B = 2:  k = 2: 4.4 / 5.8 = 0.7586; k = 3: 5.0 / 6.6 = 0.7576 (within the 0.5 % stickiness: k = 3 kept)
    #   B = 3:  k = 2: 6.6 / 6.1 = 1.0820; k = 3: 7.5 / 7.0 = 1.0714 (1 % worse: k = 2)
    #   B = 16: k = 1: 27.2 / 7.8 = 3.487; k = 2: 35.2 / 10.0 = 3.520; k = 3: 40 / 12.2 = 3.279
    assert true_table(linear_profile(), RATES) == [[1, 2, 3], [3, 16, 2]]
    assert true_table(linear_profile(), RATES, ks=(0, 1)) == [[1, 16, 1]]
    assert true_table(linear_profile(), (0.9, 0.8, 0.7)) == [[1, 16, 3]]
    assert true_table(linear_profile(), (0.3, 0.1, 0.05)) == [[1, 9, 1], [10, 16, 0]]
    # without stickiness B = 2 goes to the better k = 2
    assert true_table(linear_profile(), RATES, stickiness=0.0)[0] == [1, 1, 3]


def test_the_quarter_of_the_reference_table():
    # ends divided by 4, rounded up: 2 -> 1, 16 -> 4; no speculation above
    assert quartered(true_table(linear_profile(), RATES), N) == [[1, 1, 3], [2, 4, 2], [5, 16, 0]]
    assert quartered([[1, 16, 3]], N) == [[1, 4, 3], [5, 16, 0]]


def test_fixed_prior_has_the_rates_and_no_drafts():
    p = fixed_prior([0.7, 0.5, 0.3])
    assert p.rates == RATES and p.num_drafts == 0 and p.source == "synthetic"
    assert p.drafted_per_pos == (0, 0, 0) and p.accepted_per_pos == (0, 0, 0)
    assert p.prompt_fingerprint == "synthetic" and p.prompt_count == 0
    assert fixed_prior(RATES).prior_id == p.prior_id


def test_publish_writes_a_file_the_strict_reader_accepts(tmp_path):
    path = publish(tmp_path / "pub.json", ranges=[(1, 4, 3), (5, 16, 1)], rates=RATES, version=3,
                   allowed_k=[0, 1, 3], controller={"mode": "observe"})
    t = load_published(path)
    assert t.version == 3 and t.ranges == ((1, 4, 3), (5, 16, 1)) and (t.max_num_seqs, t.max_k) == (N, K)
    assert t.prior.rates == RATES and t.prior.source == "synthetic" and t.allowed_k == (0, 1, 3)
    assert t.identity == IDENTITY
    assert t.controller == {"rebuild_budget_ms": REBUILD_BUDGET_MS, "mode": "observe"}
    # the default profile is the linear one
    assert t.step_ms[3][16] == pytest.approx(12.2) and t.step_ms[0][1] == pytest.approx(4.1)
    assert t.document["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 16, 1]]


def test_publish_for_another_engine_size_and_over_a_broken_file(tmp_path):
    path = tmp_path / "pub.json"
    path.write_text("{not json")
    with pytest.raises(PublishedTableError):
        publish(path, ranges=[(1, 8, 2)], rates=(0.6, 0.4), n=8, k_max=2, identity=None)
    publish(path, ranges=[(1, 8, 2)], rates=(0.6, 0.4), n=8, k_max=2, identity=None, over_junk=True)
    t = load_published(path)
    assert (t.max_num_seqs, t.max_k) == (8, 2) and t.identity is None and sorted(t.step_ms) == [0, 1, 2]
