"""The (B, ctx) derivation: one search per context level, merged into one table
(``tuning.derive_context``). Worked numbers: under rates (0.7, 0.5, 0.3), tau(k) = 1, 1.7, 2.2, 2.5.
At the short level T(k) = 10, 11, 12, 13 ms at every B, so goodput per request tau/T is 0.100,
0.155, 0.183, 0.192 per ms: k = 3 wins by 4.9 % over k = 2. At the long level T(k) = 20, 22, 30,
40 ms: 0.050, 0.077, 0.073, 0.063 per ms, k = 1 wins by 5.4 % over k = 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, StepTimeProfile
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table
from tabletune_pipelines.tuning.derive_context import derive_context_table, rates_per_level, stored_context_surface
from tests.tuning import samples

N = samples.IDENT.max_num_seqs  # 16
SHORT = StepTimes((0, 1, 2, 3), np.repeat([[10.0], [11.0], [12.0], [13.0]], N, axis=1))
LONG = StepTimes((0, 1, 2, 3), np.repeat([[20.0], [22.0], [30.0], [40.0]], N, axis=1))
DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def test_k3_at_short_context_and_k1_at_long_give_a_two_bucket_table():
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: LONG}, max_model_len=8192)
    table = tuned.table
    assert table.context_entries == ((1, 16, 1, 1024, 3), (1, 16, 1025, 8192, 1))
    assert table.ranges == ((1, 16, 3),)  # the base (shortest) level's batch-only table
    assert table.ctx_agg == "mean"
    full = table.full_table
    assert full.axes.context == ((1, 1024), (1025, 8192))
    assert (full.k_at(8, 900), full.k_at(8, 1025), full.k_at(16, 100_000)) == (3, 1, 1)
    assert [(s.level, s.bucket, s.pooled) for s in tuned.by_context] == [
        (256, (1, 1024), True), (4096, (1025, 8192), True)]
    g = tuned.by_context[1].evidence.choice.goodput[:, 0]  # B = 1, tokens/s
    assert g == pytest.approx([1000 * 1.0 / 20, 1000 * 1.7 / 22, 1000 * 2.2 / 30, 1000 * 2.5 / 40])


def test_the_table_document_round_trips_and_keeps_its_5_item_entries():
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: LONG}, max_model_len=8192)
    back = DraftLengthTable.from_json(tuned.table.to_json())
    assert back == tuned.table and back.table_id == tuned.table.table_id
    body, _ = tuned.table.published_parts()
    assert [list(e) for e in body["context_entries"]] == [[1, 16, 1, 1024, 3], [1, 16, 1025, 8192, 1]]
    assert body["ctx_agg"] == "mean" and [list(r) for r in body["ranges"]] == [[1, 16, 3]]
    spec = tuned.table.speculative_config({"method": "draft_model"}, context_schedule=True)
    assert spec == {"method": "draft_model", "num_speculative_tokens": 3, "ctx_agg": "mean",
                    "speculative_token_schedule": [[1, 16, 1, 1024, 3], [1, 16, 1025, 8192, 1]]}
    plain = tuned.table.speculative_config({"method": "draft_model"})
    assert plain == {"method": "draft_model", "num_speculative_tokens": 3,
                     "num_speculative_tokens_per_batch_size": [[1, 16, 3]]}


def test_each_bucket_carries_the_column_the_controller_corrects_it_from():
    decode = {256: StepTimes(SHORT.ks, SHORT.ms - 1.0), 4096: StepTimes(LONG.ks, LONG.ms - 2.0),
              1024: StepTimes(SHORT.ks, SHORT.ms - 0.5)}
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 1024: SHORT, 4096: LONG},
                                 max_model_len=8192, rates={4096: (0.6, 0.4, 0.2)}, decode=decode)
    short, long = tuned.table.context_columns
    # buckets (1, 512) and (513, 2048) agree and merge: the merged bucket is priced by its first level, 256
    assert (short["ctx"], short["level"], short["pooled"]) == ([1, 2048], 256, True)
    assert short["acceptance_rates"] == list(samples.prior().rates) and short["step_ms"]["3"]["16"] == 12.0
    assert (long["ctx"], long["level"], long["pooled"]) == ([2049, 8192], 4096, False)
    assert long["acceptance_rates"] == [0.6, 0.4, 0.2] and long["step_ms"]["1"]["1"] == 20.0
    body, _ = tuned.table.published_parts()
    assert list(body["context_columns"]) == [short, long]
    back = DraftLengthTable.from_json(tuned.table.to_json())
    assert back == tuned.table and back.table_id == tuned.table.table_id
    # one bucket: no columns, the document as without the context axis
    one = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: SHORT}, max_model_len=8192)
    assert one.table.context_columns == () and "context_columns" not in one.table.to_dict()


def test_adjacent_levels_that_agree_merge_into_one_bucket():
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 1024: SHORT, 4096: LONG},
                                 max_model_len=8192)
    # buckets (1, 512), (513, 2048), (2049, 8192); the first two agree at every B
    assert tuned.table.context_entries == ((1, 16, 1, 2048, 3), (1, 16, 2049, 8192, 1))


def test_levels_that_all_agree_give_todays_table_without_a_context_axis():
    one = derive_context_table(samples.profile(), samples.prior(), {256: SHORT})
    both = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: SHORT}, max_model_len=8192)
    today = derive_table(samples.profile(), samples.prior(), judged=SHORT)
    assert one.table.to_json() == both.table.to_json() == today.table.to_json()
    assert "context_entries" not in today.table.to_dict() and both.table.context_entries == ()


def test_per_level_rates_decide_their_bucket():
    # The same step times at both levels; the long level's own rates (0.05, 0.02, 0.01) give
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: SHORT},
                                 rates={4096: (0.05, 0.02, 0.01)}, max_model_len=8192)
    # tau = 1, 1.05, 1.07, 1.08: per ms 0.100, 0.0955, 0.0892, 0.0831 -> k = 0 at long context
    assert tuned.table.context_entries == ((1, 16, 1, 1024, 3), (1, 16, 1025, 8192, 0))
    assert [s.pooled for s in tuned.by_context] == [True, False]


def _long_k2(sd_ms: float) -> StepTimes:
    # T(k) = 10, 11, 11.5, 13.6 ms: per ms 0.100, 0.155, 0.191, 0.184 -> k = 2 leads k = 3 by 4.1 %
    ms = np.repeat([[10.0], [11.0], [11.5], [13.6]], N, axis=1)
    return StepTimes((0, 1, 2, 3), ms, np.full(ms.shape, sd_ms ** 2))


def test_a_longer_level_changes_k_only_where_the_evidence_beats_the_shorter_levels_k():
    short = StepTimes((0, 1, 2, 3), SHORT.ms, np.full(SHORT.ms.shape, 1e-6))
    # A 4 % lead measured to 0.01 ms moves the long bucket to k = 2 ...
    sharp = derive_context_table(samples.profile(), samples.prior(), {256: short, 4096: _long_k2(0.01)},
                                 max_model_len=8192)
    assert sharp.table.context_entries == ((1, 16, 1, 1024, 3), (1, 16, 1025, 8192, 2))
    # ... the same lead at 1 ms per cell (about 8 %) is a lead the noise could flip: the long level
    # keeps the short level's k = 3 and the table has no context axis.
    noisy = derive_context_table(samples.profile(), samples.prior(), {256: short, 4096: _long_k2(1.0)},
                                 max_model_len=8192)
    assert noisy.table.context_entries == ()
    assert noisy.by_context[1].evidence.choice.chosen == (3,) * N
    alone = noisy.by_context[1].evidence.choice.goodput[:, 0]  # searched alone, k = 2 has the best point estimate
    assert int(np.argmax(alone)) == 2


def test_bad_input_is_one_clear_error():
    with pytest.raises(InvalidValueError, match="context level 256 cover batch sizes 1..4"):
        derive_context_table(samples.profile(), samples.prior(), {256: StepTimes((0, 1), np.ones((2, 4)))})
    with pytest.raises(InvalidValueError, match=r"context level\(s\) \[512\]"):
        derive_context_table(samples.profile(), samples.prior(), {256: SHORT}, rates={512: (0.5, 0.3, 0.1)})
    with pytest.raises(InvalidValueError, match="ctx_agg = 'p99'"):
        derive_context_table(samples.profile(), samples.prior(), {256: SHORT}, ctx_agg="p99")  # type: ignore[arg-type]


def _committed_profiles() -> list[Path]:
    return sorted([*DATA.rglob("*.one_launch.json"), *DATA.rglob("*.profile.json")])


@pytest.mark.parametrize("path", _committed_profiles(), ids=lambda p: p.name[:60])
def test_committed_profiles_derive_byte_identically_through_one_level(path):
    profile = StepTimeProfile.from_json(path.read_text())
    k = profile.identity.max_k
    prior = samples.prior(rates=(0.7, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02)[:k])
    options = DeriveOptions()
    today = derive_table(profile, prior, options)
    surface = stored_context_surface(profile, prior, options)
    assert list(surface) == [32]  # committed profiles hold one level, the plan's prompt_tokens
    via = derive_context_table(profile, prior, surface, options=options)
    assert via.table.to_json() == today.table.to_json()
    assert via.table.table_id == today.table.table_id
    same = derive_context_table(profile, prior, {32: surface[32], 2048: surface[32]}, max_model_len=4096,
                                options=options)
    assert same.table.to_json() == today.table.to_json()


def test_a_prior_document_for_a_level_is_used_with_its_counts():
    level_prior = samples.prior(rates=(0.05, 0.02, 0.01), drafts=500, week="2026-11-23")
    assert isinstance(level_prior, AcceptancePrior)
    tuned = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: SHORT},
                                 rates={4096: level_prior}, max_model_len=8192)
    assert tuned.table.context_entries[-1][-1] == 0


def test_the_published_file_carries_the_full_table_and_the_engine_gets_what_it_accepts(tmp_path):
    import json

    from tabletune_pipelines.engine.installed import context_schedule_support
    from tabletune_pipelines.store import TableTuneStore

    table = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: LONG},
                                 max_model_len=8192).table
    store = TableTuneStore(tmp_path / "tt.duckdb")
    path = tmp_path / "pub" / "local.json"
    store.publish("local", table, path, context_schedule=context_schedule_support().accepted)
    doc = json.loads(path.read_text())
    assert doc["table"]["context_entries"] == [[1, 16, 1, 1024, 3], [1, 16, 1025, 8192, 1]]
    assert doc["table"]["ctx_agg"] == "mean" and doc["table"]["ranges"] == [[1, 16, 3]]
    # vLLM 0.32's CPU build takes 3-item entries only: the batch-only table goes to the engine
    assert doc["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 16, 3]]
    assert "speculative_token_schedule" not in doc["speculative_config"]
    store.publish("local", table, path, context_schedule=True)
    spec = json.loads(path.read_text())["speculative_config"]
    assert spec["speculative_token_schedule"] == [[1, 16, 1, 1024, 3], [1, 16, 1025, 8192, 1]]
    assert spec["ctx_agg"] == "mean" and "num_speculative_tokens_per_batch_size" not in spec
    stored = store.query("SELECT ranges_json FROM draft_length_tables WHERE table_id = ?", [table.table_id])
    assert json.loads(stored[0][0]) == [[1, 16, 1, 1024, 3], [1, 16, 1025, 8192, 1]]
    assert store.table(table.table_id) == table


def test_the_grid_has_a_row_per_batch_range_and_a_column_per_bucket():
    from tabletune_pipelines.core.table import DraftTable
    from tabletune_pipelines.tuning.report import context_grid_lines

    table = DraftTable.from_columns([[3, 3, 2, 2], [1, 1, 1, 0]], ((1, 1024), (1025, 8192)))
    assert context_grid_lines(table) == ["B \\ ctx | 1-1024 | 1025-8192",
                                         "    1-2 |      3 |         1",
                                         "      3 |      2 |         1",
                                         "      4 |      2 |         0"]
    assert context_grid_lines(DraftTable.from_dense([3, 3, 1])) == ["B \\ ctx | every ctx", "    1-2 |         3",
                                                                    "      3 |         1"]


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_the_table_plot_is_a_heat_map_with_a_context_axis_and_todays_plot_without():
    from tabletune_pipelines.tuning.report import goodput_plot, table_plot

    two = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: LONG}, max_model_len=8192)
    one = derive_context_table(samples.profile(), samples.prior(), {256: SHORT})
    assert _png_size(table_plot(two, None, "t")) == (990, 360)  # 11 x 4 in at 90 dpi: heat-map and curves
    assert table_plot(one, None, "t") == goodput_plot(one.table, None, "t")
    assert _png_size(goodput_plot(one.table, None, "t")) == (630, 360)


def test_a_stored_table_with_bad_context_entries_is_one_clear_error():
    from tabletune_pipelines.errors import TableTuneError

    body = derive_context_table(samples.profile(), samples.prior(), {256: SHORT, 4096: LONG},
                                max_model_len=8192).table.to_dict()
    for bad, words in (([[1, 16, 3]], "must be 5-item"), ([[1, 16, 2, 1024, 3], [1, 16, 1025, 8192, 1]],
                                                          "contiguous from 1"),
                       ([[1, 16, 1, 1024, 9], [1, 16, 1025, 8192, 1]], "num_speculative_tokens = 3")):
        with pytest.raises(TableTuneError, match=words):
            DraftLengthTable.from_dict({**body, "context_entries": bad})
    with pytest.raises(TableTuneError, match="ctx_agg = 'p99'"):
        DraftLengthTable.from_dict({**body, "ctx_agg": "p99"})


def test_a_profile_of_several_levels_is_judged_level_by_level():
    import dataclasses

    profile = samples.profile()
    long = [dataclasses.replace(c, context_tokens=1024, median_ms=c.median_ms * (1.0 + 0.5 * (c.k or 0)),
                                repetitions_ms=tuple(r * (1.0 + 0.5 * (c.k or 0)) for r in c.repetitions_ms))
            for c in profile.cells]
    two = dataclasses.replace(profile, cells=profile.cells + tuple(long))
    prior = samples.prior()
    surface = stored_context_surface(two, prior, DeriveOptions())
    assert sorted(surface) == [32, 1024]
    assert np.array_equal(surface[32].ms, stored_context_surface(profile, prior, DeriveOptions())[32].ms)
    b = profile.identity.max_num_seqs
    # k = 3 costs 2.5x its short-context step at 1024 tokens; k = 0 the same
    assert surface[1024].at(3, b)[0] > 2 * surface[32].at(3, b)[0]
    assert surface[1024].at(0, b)[0] == pytest.approx(surface[32].at(0, b)[0], rel=0.05)


def test_per_level_rates_come_from_a_breakdown_at_the_profiles_levels():
    prior = samples.prior()
    assert rates_per_level(prior, [32, 1024]) == ({}, None)  # no breakdown: the pooled prior everywhere
