"""Profile + prior → table, and the markdown/plot views of it (plain calls, scripted step times)."""

from __future__ import annotations

import pytest

from tabletune_pipelines.errors import InvalidAcceptanceError
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table, table_step_and_tau
from tabletune_pipelines.tuning.report import (
    goodput_markdown,
    goodput_plot,
    identity_markdown,
    priors_markdown,
    profile_markdown,
    table_markdown,
)
from tests.tuning.samples import IDENT, prior, profile, scripted_ms


def test_the_scripted_crossover_gives_k3_at_small_and_shorter_k_at_large_batch():
    tuned = derive_table(profile(), prior())
    ranges = tuned.table.ranges
    assert ranges[0][0] == 1 and ranges[0][2] == 3
    assert ranges[-1][1] == 16 and ranges[-1][2] < 3
    assert tuned.table.identity_key == IDENT.key and tuned.table.prior_id == prior().prior_id
    assert not tuned.corrected  # no all-accepted cells in the profile
    assert 0.0 <= tuned.table.predicted_worst_loss < 0.03


def test_allowed_ks_restrict_the_table():
    tuned = derive_table(profile(), prior(), DeriveOptions(allowed_ks=(1, 3)))
    assert {k for _, _, k in tuned.table.ranges} <= {1, 3}


def test_a_prior_shorter_than_the_profile_is_refused_with_what_to_do():
    with pytest.raises(InvalidAcceptanceError, match=r"has 2 acceptance rates .* measure acceptance at K = 3"):
        derive_table(profile(), prior(rates=(0.7, 0.5)))


def test_table_step_and_tau_follow_the_tables_k():
    table = derive_table(profile(), prior()).table
    t, tau = table_step_and_tau(table)
    assert len(t) == len(tau) == 16
    k_at_1 = table.ranges[0][2]
    assert t[0] == pytest.approx(scripted_ms(k_at_1, 1))
    assert tau[0] == pytest.approx(1 + sum(prior().rates[:k_at_1]))


def test_markdown_views():
    tuned = derive_table(profile(), prior())
    assert table_markdown(tuned.table.ranges).splitlines()[:2] == ["| batch sizes | k |", "|---|---|"]
    assert "chosen k" in goodput_markdown(tuned).splitlines()[0]
    assert f"| key | `{IDENT.key}` |" in identity_markdown(IDENT)
    md = profile_markdown(profile())
    assert md.splitlines()[0] == "| B | k=0 | k=1 | k=2 | k=3 | no-spec |" and len(md.splitlines()) == 2 + 6
    assert f"`{prior().prior_id}`" in priors_markdown([("local-cpu", prior())])


def test_goodput_plot_is_a_png():
    table = derive_table(profile(), prior()).table
    png = goodput_plot(table, profile().no_spec_ms(), "title")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
