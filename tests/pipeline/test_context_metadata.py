"""The acceptance asset's metadata of a prior measured per context bucket: each bucket's span, level,
n and rates, or why it serves the pooled rates (orchestration/metadata.py). A prior of one bucket
adds no key (tests/pipeline/test_metadata_keys.py holds that key set)."""

from __future__ import annotations

from tabletune_pipelines.orchestration.metadata import describe_acceptance
from tabletune_pipelines.tuning.gates import prior_gate
from tabletune_pipelines.tuning.measure import MeasuredPrior, WeekPriors
from tests.store.test_context_prior_store import ONE, SPLIT


def test_each_bucket_says_its_n_and_rates_or_pooled():
    week = WeekPriors(week="2026-01-05", without_prompts=(), measured=(
        MeasuredPrior("a", SPLIT, "key-a", prior_gate(SPLIT, 3, 200), {}),
        MeasuredPrior("b", ONE, "key-b", prior_gate(ONE, 2, 50), {})))
    md = describe_acceptance(week).metadata
    assert md["context_buckets"].value == {"a": [
        {"bucket": [1, 22], "level": 8, "n": 30, "num_drafts": 1200, "rates": [0.8, 0.6, 0.4]},
        {"bucket": [23, 100], "level": 64, "n": 10, "num_drafts": 400, "rates": "pooled: 10 prompts < 20"}]}
    one = describe_acceptance(WeekPriors(week="2026-01-05", without_prompts=(), measured=week.measured[1:]))
    assert "context_buckets" not in one.metadata
