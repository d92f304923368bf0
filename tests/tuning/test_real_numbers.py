"""The pieces behind the real-model numbers, without an engine: the real prompt mixes read from their
packages, sample weeks in the logged-prompt format, which mix a measurement's sample came from,
the intervals of a_i, and the docs' table comparison."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tabletune_pipelines.formats import prompt_mixes as pm
from tabletune_pipelines.core.acceptance_ci import Interval, differ, group_intervals, prior_intervals, wilson
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.engine.acceptance import sample_prompts
from tabletune_pipelines.formats.prompts import load_prompts
from tabletune_pipelines.tuning.run_report import compare_to_docs, docs_table


def prior(acc, drafted):
    return AcceptancePrior(rates=tuple(a / d for a, d in zip(acc, drafted)), num_drafts=drafted[0],
                           drafted_per_pos=tuple(drafted), accepted_per_pos=tuple(acc), prompt_fingerprint="x",
                           prompt_count=10)


# -- prompt mixes ------------------------------------------------------------------------------

def test_the_mixes_come_from_their_packages_and_differ_in_kind():
    code, prose = pm.load_mix("code"), pm.load_mix("prose")
    assert len(code) == 164  # every HumanEval problem
    assert 150 <= len(prose) <= 200  # the English WritingBench requests up to PROSE_MAX_CHARS
    assert all("def " in p for p in code)
    assert sum("def " in p for p in prose) < 0.05 * len(prose)
    assert all(len(p) <= pm.PROSE_MAX_CHARS and sum(c.isascii() for c in p) >= 0.95 * len(p) for p in prose)
    assert not set(code) & set(prose)


def test_a_sample_week_is_a_logged_prompt_file_with_the_asked_mix(tmp_path):
    path = pm.write_week(tmp_path / "2026-11-16.jsonl", "code:0.25,prose:0.75", n=200, seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(r) == {"prompt", "mix"} for r in rows)  # nothing but what the measurement needs, and the label
    assert sum(r["mix"] == "code" for r in rows) == 50 and sum(r["mix"] == "prose" for r in rows) == 150
    assert load_prompts(path) == [r["prompt"] for r in rows]  # the measurement's reader takes it as it is
    assert pm.write_week(tmp_path / "again.jsonl", "code:0.25,prose:0.75", n=200, seed=3).read_text() == path.read_text()
    assert pm.write_week(tmp_path / "other.jsonl", "code:0.25,prose:0.75", n=200, seed=4).read_text() != path.read_text()


def test_sample_mix_names_the_prompts_the_measurement_samples(tmp_path):
    path = pm.write_week(tmp_path / "w.jsonl", "code:0.5,prose:0.5", n=300, seed=1)
    prompts = load_prompts(path)
    label = {json.loads(line)["prompt"]: json.loads(line)["mix"] for line in path.read_text().splitlines()}
    for seed in (0, 5):
        drawn = sample_prompts(prompts, 160, seed=seed)  # what engine.acceptance measures
        want = {m: sum(label[p] == m for p in drawn) for m in ("code", "prose")}
        assert pm.sample_mix(path, 160, seed=seed) == want
    plain = tmp_path / "user.jsonl"
    plain.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(20)))
    assert pm.sample_mix(plain, 160) == {"unlabelled": 20}


def test_unknown_mixes_and_bad_weights_are_refused():
    from tabletune_pipelines.errors import InvalidValueError, NotFoundError

    with pytest.raises(NotFoundError):
        pm.parse_weights("poetry")
    for bad in ("code:-1", "code:x", "", "code:nan", "code:inf"):  # a weight, not a name: out of its bounds
        with pytest.raises(InvalidValueError):
            pm.parse_weights(bad)


# -- intervals ---------------------------------------------------------------------------------

def test_wilson_interval_matches_newcombe():
    iv = wilson(81, 263)  # Newcombe (1998), example: 81/263 -> 0.2553 to 0.3662
    assert iv.lo == pytest.approx(0.2553, abs=5e-4) and iv.hi == pytest.approx(0.3662, abs=5e-4)
    assert wilson(0, 0) == Interval(0.0, 0.0, 1.0)


def test_prior_intervals_narrow_with_counts_and_cover_the_rate():
    small, big = prior_intervals(prior([60, 40, 20], [100, 100, 100])), prior_intervals(prior([600, 400, 200], [1000] * 3))
    for s, b in zip(small, big):
        assert s.lo <= s.value <= s.hi and b.lo <= b.value <= b.hi
        assert b.hi - b.lo < s.hi - s.lo


def test_group_intervals_see_spread_between_prompts_that_counts_do_not():
    rng = random.Random(0)
    # groups whose true rate differs a lot (clustered prompts) vs groups with one rate
    spread = [prior([int(1000 * p), int(800 * p), int(600 * p)], [1000] * 3) for p in (0.3, 0.9, 0.5, 0.7, 0.2, 0.8)]
    flat = [prior([500 + rng.randint(-15, 15), 400, 300], [1000] * 3) for _ in range(6)]
    w_spread, w_flat = group_intervals(spread)[0], group_intervals(flat)[0]
    assert w_spread.hi - w_spread.lo > 5 * (w_flat.hi - w_flat.lo)
    pooled = prior([sum(p.accepted_per_pos[0] for p in spread)] * 3, [6000] * 3)
    assert w_spread.hi - w_spread.lo > 3 * (prior_intervals(pooled)[0].hi - prior_intervals(pooled)[0].lo)
    assert differ([Interval(0.5, 0.4, 0.6)], [Interval(0.7, 0.61, 0.8)]) == [0]
    assert differ([Interval(0.5, 0.4, 0.6)], [Interval(0.7, 0.59, 0.8)]) == []


# -- the docs' table ---------------------------------------------------------------------------

def test_docs_table_is_cut_to_the_engine():
    assert docs_table(16, 3) == [[1, 16, 3]]
    assert docs_table(128, 2) == [[1, 64, 2], [65, 128, 1]]
    assert docs_table(256, 3) == [[1, 64, 3], [65, 128, 1], [129, 256, 0]]


class _Evidence:
    def __init__(self, log_ratio, log_sd):
        self.log_ratio, self.log_sd = log_ratio, log_sd


def test_goodput_ratio_vs_docs_reads_the_evidence_where_the_tables_differ():
    ks, n = [0, 1, 2, 3], 4
    logg = np.log(np.array([[1.0] * n, [1.2] * n, [1.3] * n, [1.25, 1.25, 1.1, 1.0]]))
    lr = logg[:, None, :] - logg[None, :, :]
    sd = np.full((4, 4, n), 0.02)
    cmp = compare_to_docs(_Evidence(lr, sd), ks, [[1, 2, 3], [3, 4, 2]], n, 3)  # docs: k = 3 everywhere
    assert cmp.differing() == [3, 4]
    assert cmp.ratio[:2].tolist() == [1.0, 1.0] and cmp.sd[:2].tolist() == [0.0, 0.0]
    assert cmp.ratio[2] == pytest.approx(1.3 / 1.1) and cmp.ratio[3] == pytest.approx(1.3)
    assert cmp.sd[3] == pytest.approx(1.3 * 0.02)


def test_group_standard_errors_worked_numbers():
    from types import SimpleNamespace

    from tabletune_pipelines.core.acceptance_ci import group_standard_errors
    from tabletune_pipelines.errors import InvalidValueError

    g = [SimpleNamespace(drafted_per_pos=(10, 0), accepted_per_pos=(5, 0)),
         SimpleNamespace(drafted_per_pos=(10, 0), accepted_per_pos=(9, 0))]
    # pooled 14/20 = 0.7; ratio-estimator variance ((5 - 7)² + (9 - 7)²) / 1 / 2 / 10² = 0.04
    (p0, se0), (p1, se1) = group_standard_errors(g)
    assert p0 == pytest.approx(0.7) and se0 == pytest.approx(0.2)
    assert p1 == 0.0 and se1 == float("inf")  # nothing drafted at the second position
    with pytest.raises(InvalidValueError, match="at least two groups"):
        group_standard_errors(g[:1])
