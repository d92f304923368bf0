"""Controller settings: defaults, and every override checked by name."""

from __future__ import annotations

import pytest

from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.errors import SettingsError


def test_defaults_are_the_methods():
    s = ControllerSettings()
    assert (s.prior_weight, s.exploration_every_steps, s.rebuild_every_steps, s.hysteresis) == (2000.0, 50, 100, 2)
    assert s.prior_decay and s.halve_after_rebuild and s.step_time_correction and s.mode == "control"
    assert s.poll_every_s == 1.0
    assert ControllerSettings.from_mapping(None) == s
    assert ControllerSettings.from_mapping(s.to_dict()) == s


def test_json_numbers_are_accepted_when_exact():
    s = ControllerSettings.from_mapping({"rebuild_every_steps": 50.0, "prior_weight": 500})
    assert s.rebuild_every_steps == 50 and s.prior_weight == 500.0


@pytest.mark.parametrize("data,message", [
    ({"prior_wieght": 1}, "unknown setting(s) ['prior_wieght']"),
    ({"rebuild_every_steps": 0}, "rebuild_every_steps = 0 must be an integer >= 1"),
    ({"rebuild_every_steps": 2.5}, "rebuild_every_steps = 2.5"),
    ({"rebuild_every_steps": True}, "rebuild_every_steps = True"),
    ({"prior_weight": float("nan")}, "prior_weight = nan"),
    ({"prior_weight": -1.0}, "prior_weight = -1.0"),
    ({"poll_every_s": 0.1}, "poll_every_s = 0.1 must be a finite number >= 1"),
    ({"prior_decay": "yes"}, "prior_decay = 'yes' must be true or false"),
    ({"merge_islands": 1}, "merge_islands = 1 must be true or false"),
    ({"mode": "auto"}, "mode = 'auto' must be one of"),
    ({"min_prior_weight": 3000.0}, "must be <= prior_weight"),
    ({"step_time_outlier_ratio": 1.0}, "step_time_outlier_ratio = 1.0"),
    ({"export_path": ""}, "export_path = ''"),
    # Finite but meaningless: every number has an upper bound as well as a lower one.
    ({"hysteresis": 10 ** 20}, "hysteresis = 100000000000000000000 must be an integer >= 0 and <= 4096"),
    ({"hysteresis": 1e20}, "hysteresis = 1e+20 must be an integer >= 0 and <= 4096"),
    ({"poll_every_s": 1e30}, "poll_every_s = 1e+30 must be a finite number >= 1 and <= 300"),
    ({"poll_every_s": 301}, "poll_every_s = 301.0 must be a finite number >= 1 and <= 300"),
    ({"rebuild_every_steps": 10 ** 9}, "rebuild_every_steps = 1000000000 must be an integer >= 1 and <= 100000"),
    ({"rebuild_every_steps": 1e300}, "rebuild_every_steps = 1e+300 must be an integer"),
    ({"prior_weight": 10 ** 400}, "prior_weight = 100000000000000000000000... (401 characters) must be a finite "
                                  "number >= 0.001 and <= 1e+12"),
    ({"prior_weight": 1e-300}, "prior_weight = 1e-300 must be a finite number >= 0.001"),
    ({"live_count_floor": 1e13}, "live_count_floor = 10000000000000.0 must be a finite number >= 0 and <= 1e+12"),
    ({"stickiness": 11.0}, "stickiness = 11.0 must be a finite number >= 0 and <= 10"),
    ({"nightjar_exploration": 1e9}, "nightjar_exploration = 1000000000.0 must be a finite number >= 0 and <= 10"),
    ({"turbospec_forget": 1e-9}, "turbospec_forget = 1e-09 must be a finite number >= 0.5 and <= 1"),
    ({"step_time_max_count": 1e10}, "step_time_max_count = 10000000000.0 must be a finite number >= 1"),
    ({"step_time_outlier_ratio": 1e6}, "step_time_outlier_ratio = 1000000.0 must be a finite number > 1 and <= 1000"),
    ({"rebuild_budget_ms": 1e9}, "rebuild_budget_ms = 1000000000.0 must be a finite number >= 1e-06 and <= 60000"),
    ({"rebuild_budget_ms": 1e-9}, "rebuild_budget_ms = 1e-09 must be a finite number >= 1e-06"),
    ({"export_every_steps": 10 ** 9}, "export_every_steps = 1000000000 must be an integer >= 1 and <= 1000000"),
    ({"export_every_s": 1e9}, "export_every_s = 1000000000.0 must be a finite number >= 1 and <= 3600"),
    ({"export_every_s": 0.5}, "export_every_s = 0.5 must be a finite number >= 1"),
    ({"log_unchanged_every_s": 1e7}, "log_unchanged_every_s = 10000000.0 must be a finite number >= 0 and <= 86400"),
    ({"exploration_every_steps": 10 ** 6}, "exploration_every_steps = 1000000 must be an integer >= 0 and <= 100000"),
    ({"exploration_every_steps": 3}, "exploration_every_steps = 3 must be 0 (off) or more than exploration_run_steps"),
    ({"exploration_run_steps": 65}, "exploration_run_steps = 65 must be an integer >= 1 and <= 64"),
    ({"step_time_prior_weight": 2e9}, "step_time_prior_weight = 2000000000.0 must be a finite number >= 0.001 and "
                                      "<= 1e+09"),
    ({"export_path": "x" * 5000}, "must be a non-empty path of at most 4096 characters"),
    ({"export_path": "a\tb"}, "without control characters"),
])
def test_bad_settings_name_the_key(data, message):
    with pytest.raises(SettingsError) as err:
        ControllerSettings.from_mapping(data, where="fleet.yaml: deployment d: controller")
    assert message in str(err.value) and "fleet.yaml: deployment d: controller" in str(err.value)


def test_not_a_mapping():
    with pytest.raises(SettingsError, match="must be a mapping"):
        ControllerSettings.from_mapping([1, 2])  # type: ignore[arg-type]


def test_docs_list_every_setting_with_its_default():
    from dataclasses import fields
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "controller.md").read_text()
    for f in fields(ControllerSettings):
        row = next((ln for ln in doc.splitlines() if ln.startswith(f"| `{f.name}` |")), None)
        assert row is not None, f"docs/controller.md has no row for {f.name}"
        default = f.default
        if isinstance(default, bool):
            assert ("true" if default else "false") in row
        elif isinstance(default, (int, float)):
            assert f"| {default:g} |" in row, row


def test_every_number_has_bounds_and_the_docs_show_them():
    from dataclasses import fields
    from pathlib import Path

    from tabletune_pipelines.formats.controller_settings import BOUNDS

    numeric = {f.name for f in fields(ControllerSettings) if f.type in ("int", "float")}
    assert numeric == set(BOUNDS)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "controller.md").read_text()
    for name, bound in BOUNDS.items():
        assert bound.low < bound.high and bound.problem(getattr(ControllerSettings(), name)) is None
        row = next(ln for ln in doc.splitlines() if ln.startswith(f"| `{name}` |"))
        assert f"| {bound.doc()}" in row, row


def test_the_bounds_themselves_are_allowed():
    from tabletune_pipelines.formats.controller_settings import BOUNDS

    low = {n: (b.high if b.low_open else (int(b.low) if b.integer else b.low)) for n, b in BOUNDS.items()}
    high = {n: int(b.high) if b.integer else b.high for n, b in BOUNDS.items()}
    low["exploration_every_steps"] = 0  # 0: off (a positive value must exceed exploration_run_steps)
    assert ControllerSettings.from_mapping(low).hysteresis == 0
    assert ControllerSettings.from_mapping(high).hysteresis == 4096
