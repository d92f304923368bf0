"""Controller settings: defaults, and every override checked by name."""

from __future__ import annotations

import pytest

from tabletune_pipelines.controller.settings import ControllerSettings, SettingsError


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
    ({"mode": "auto"}, "mode = 'auto' must be one of"),
    ({"min_prior_weight": 3000.0}, "must be <= prior_weight"),
    ({"step_time_outlier_ratio": 1.0}, "step_time_outlier_ratio = 1.0"),
    ({"export_path": ""}, "export_path = ''"),
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
