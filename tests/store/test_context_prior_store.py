"""A prior measured per context bucket in a real DuckDB file: its bucket rows, its round trip, and
stores written before the bucket table existed (a writing open creates it; their priors, one bucket
each, load unchanged and serve their rates everywhere; a read-only open reads no buckets)."""

from __future__ import annotations

import re

import duckdb

from tabletune_pipelines.core.context_acceptance import bucket_acceptance
from tabletune_pipelines.formats.documents import AcceptancePrior
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.store.schema import SCHEMA_SQL

BUCKETS = bucket_acceptance((8, 64), ((1, 22), (23, 100)), [
    (30, 1200, (1200, 1200, 1200), (960, 720, 480)),   # own rates 0.8, 0.6, 0.4
    (10, 400, (400, 400, 400), (160, 80, 40))])         # 10 prompts: pooled
SPLIT = AcceptancePrior(rates=(0.7, 0.5, 0.325), num_drafts=1600, drafted_per_pos=(1600,) * 3,
                        accepted_per_pos=(1120, 800, 520), prompt_fingerprint="f" * 64, prompt_count=40,
                        week="2026-01-05", deployment="a", context=BUCKETS)
ONE = AcceptancePrior(rates=(0.6, 0.3), num_drafts=100, drafted_per_pos=(100, 100), accepted_per_pos=(60, 30),
                      prompt_fingerprint="e" * 64, prompt_count=12, week="2026-01-05", deployment="b")


def old_store(path) -> None:
    """A store as TableTune wrote it before ``acceptance_prior_buckets``, with one prior."""
    sql = re.sub(r"-- A prior's acceptance per context bucket.*?\n\);\n", "", SCHEMA_SQL, flags=re.S)
    assert "acceptance_prior_buckets" not in sql
    conn = duckdb.connect(str(path))
    conn.execute(sql)
    conn.execute("INSERT INTO acceptance_priors VALUES (?, ?, ?, NULL, 'measured', ?, ?, ?, ?, 0.0, ?, now())",
                 [ONE.prior_id, ONE.deployment, ONE.week, list(ONE.rates), ONE.num_drafts, ONE.prompt_fingerprint,
                  ONE.prompt_count, ONE.to_json()])
    conn.close()


def test_a_split_prior_round_trips_with_its_bucket_rows(tmp_path):
    path = tmp_path / "tt.duckdb"
    s = TableTuneStore(path)
    pid = s.write_acceptance_prior(SPLIT)
    s.write_acceptance_prior(SPLIT)  # rewriting replaces, never duplicates, its bucket rows
    assert s.acceptance_prior(pid) == SPLIT
    assert s.context_rates(pid) == {8: (0.8, 0.6, 0.4), 64: (0.7, 0.5, 0.325)} == SPLIT.rates_by_context()
    conn = duckdb.connect(str(path), read_only=True)
    rows = conn.execute("SELECT context_level, ctx_lo, ctx_hi, prompt_count, num_drafts, rates, pooled, reason "
                        "FROM acceptance_prior_buckets ORDER BY context_level").fetchall()
    conn.close()
    assert rows == [(8, 1, 22, 30, 1200, [0.8, 0.6, 0.4], False, ""),
                    (64, 23, 100, 10, 400, [0.4, 0.2, 0.1], True, "10 prompts < 20")]


def test_an_old_store_is_migrated_and_its_priors_serve_one_bucket(tmp_path):
    path = tmp_path / "old.duckdb"
    old_store(path)
    ro = TableTuneStore(path, read_only=True)  # read-only: untouched, no buckets to read
    assert ro.acceptance_prior(ONE.prior_id) == ONE and ro.context_rates(ONE.prior_id) == {}
    s = TableTuneStore(path)  # a writing open creates the bucket table
    assert s.query("SELECT count(*) FROM acceptance_prior_buckets") == [(0,)]
    old = s.acceptance_prior(ONE.prior_id)
    assert old.context is None and old.prior_id == ONE.prior_id
    assert s.context_rates(ONE.prior_id) == {} and old.rates_by_context((32,)) == {32: (0.6, 0.3)}
    pid = s.write_acceptance_prior(SPLIT)
    assert s.context_rates(pid)[64] == (0.7, 0.5, 0.325)
    assert s.latest_acceptance_prior("a") == SPLIT
