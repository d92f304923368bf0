"""Served calibration on the H200 MoE data (benchmarks/data/h200): the fixed-k windows the judges
measured correct the served price, and the table follows what serving measured."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tabletune_pipelines.core.served_calibration import ServedCalibration
from tabletune_pipelines.core.stepcost import Workload
from tabletune_pipelines.errors import InvalidValueError
from tabletune_pipelines.tuning.served_windows import calibration_from_judges
from tabletune_pipelines.formats.documents import StepTimeProfile
from tabletune_pipelines.tuning.derive import DeriveOptions, derive_table
from tests.tuning.test_h200_profiles import DATA, _prior

WORKLOAD = Workload(prompt_tokens=32, output_tokens=80)
JUDGES = ("2026-12-02-moe-judge-L96-L128/moe-judge.json", "2026-12-03-moe-judge-L64-L96/moe-judge.json",
          "2026-12-03-moe-served-calibration/moe-calibration.json")


def _profile() -> StepTimeProfile:
    return StepTimeProfile.from_dict(json.loads((DATA / "moe-served.json").read_text())["profile"])


def _calibration(names=JUDGES) -> ServedCalibration:
    return calibration_from_judges([(name, json.loads((DATA / name).read_text())) for name in names])


def _k_at(table, b):
    return next(k for s, e, k in table.as_vllm() if s <= b <= e)


def test_served_measurements_move_load_96_to_the_k_serving_measured_best():
    prior = _prior((0.7, 0.5, 0.3))
    priced = derive_table(_profile(), prior, DeriveOptions(workload=WORKLOAD)).table
    cal = _calibration()
    assert {(p.k, p.load) for p in cal.points} == {(k, load) for k in (1, 2, 3) for load in (64, 96, 128)}
    tuned = derive_table(_profile(), prior, DeriveOptions(workload=WORKLOAD, served_calibration=cal)).table
    # The price alone runs k = 2 at B = 89..117: fixed k = 3 served 1.09-1.17x fixed k = 2 at load 96 (B ~ 92).
    assert _k_at(priced, 92) == 2 and _k_at(tuned, 92) == 3
    # At load 128 (B ~ 123) every launch measured k = 1 best; the calibrated table runs it there.
    assert _k_at(tuned, 123) == 1 and _k_at(tuned, 128) == 1
    prov = tuned.served_cost["calibration"]
    assert len(prov["points"]) == 9 and set(prov["offset_ms"]) == {"0", "1", "2", "3"}


def test_a_calibration_needs_a_workload():
    prior = dataclasses.replace(_prior((0.7, 0.5, 0.3)), workload=None)
    with pytest.raises(InvalidValueError, match="needs a workload"):
        derive_table(_profile(), prior, DeriveOptions(served_calibration=_calibration(JUDGES[:1])))


ALL = (*JUDGES, "2026-12-03-moe-judge-calibrated-L96-L128/moe-judge.json", "2026-12-03-moe-judge-L96/moe-judge.json",
       "2026-12-03-moe-judge-L128-two-range-table/moe-judge.json")


def test_within_the_noise_the_table_keeps_its_neighbour_k_until_a_launch_resolves_it():
    """Four launches leave k = 1 and 2 within the noise at B = 107..128, so the evidence rule keeps
    k = 2 there (no boundary it cannot support); judged at load 128 under the balanced order, that
    table served 0.899 ± 0.026 of fixed k = 1 (ten rounds, 2026-12-03-moe-judge-L128-two-range-table).
    With that launch's fixed-k windows added, k = 1 is supported from B = 119 on; load 96 stays on k = 3."""
    prior = _prior((0.7, 0.5, 0.3))
    four = derive_table(_profile(), prior, DeriveOptions(workload=WORKLOAD, served_calibration=_calibration(ALL[:4])))
    six = _calibration(ALL)
    tuned = derive_table(_profile(), prior, DeriveOptions(workload=WORKLOAD, served_calibration=six))
    assert _k_at(four.table, 92) == 3 and _k_at(four.table, 123) == 2
    assert {1, 2} <= set(four.evidence.summary()["within_noise"]["123"])
    assert _k_at(tuned.table, 92) == 3 and _k_at(tuned.table, 123) == 1 and _k_at(tuned.table, 128) == 1
    # Ten more rounds at load 128 narrowed the k = 2 point there (the one that was wide).
    se = {(p.k, p.load): p.se_ms for p in six.points}
    se4 = {(p.k, p.load): p.se_ms for p in _calibration(ALL[:4]).points}
    assert se[(2, 128)] < se4[(2, 128)]


def test_the_judged_launch_keeps_the_table_and_a_raised_ceiling_prices_k3_everywhere():
    """A launch on 2026-12-03 judged the six-launch table at load 128 (0.990 ± 0.029 of fixed k =
    1); its fixed-k windows, pooled as a seventh launch, keep k = 1 at load 128 and k = 3 at load
    96. The same profile priced at a 1024-token capture ceiling (no served step crosses it) gives k
    = 3 at every batch size: the policy that served best in the launch at that ceiling (11209 ± 196
    tok/s against 7205 ± 307 for k = 1,
    data/h200/2026-12-03-moe-judge-capture1024-L128/moe-judge.json)."""
    prior = _prior((0.7, 0.5, 0.3))
    seven = derive_table(_profile(), prior, DeriveOptions(
        workload=WORKLOAD, served_calibration=_calibration((*ALL, "2026-12-03-moe-judge-L128/moe-judge.json"))))
    assert _k_at(seven.table, 92) == 3 and _k_at(seven.table, 123) == 1 and _k_at(seven.table, 128) == 1
    prof = _profile()
    raised = dataclasses.replace(prof, identity=dataclasses.replace(prof.identity, capture_ceiling=1024))
    assert derive_table(raised, prior, DeriveOptions(workload=WORKLOAD)).table.as_vllm() == [[1, 128, 3]]
    assert _k_at(derive_table(prof, prior, DeriveOptions(workload=WORKLOAD)).table, 128) == 1
