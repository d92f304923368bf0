"""``options.options_from_mapping``: the one rule by which every options class is read from a dict."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tabletune_pipelines.formats.controller_settings import ControllerSettings
from tabletune_pipelines.tuning.deployments import AcceptanceOptions
from tabletune_pipelines.errors import EngineConfigError, SettingsError
from tabletune_pipelines.engine.plan import ProfileOptions
from tabletune_pipelines.errors import InvalidValueError, TableTuneError
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
from tabletune_pipelines.options import field_docs, options_from_mapping


class OwnError(TableTuneError, ValueError):
    pass


@dataclass(frozen=True)
class Opts:
    n: int = 1
    """How many."""
    x: float = 0.5
    """A fraction."""

    def __post_init__(self) -> None:
        if not 0 <= self.x <= 1:
            raise OwnError(f"x = {self.x!r} must be in [0, 1]")


def test_none_is_every_default_and_a_mapping_sets_fields():
    assert options_from_mapping(Opts, None, where="w", error=InvalidValueError) == Opts()
    assert options_from_mapping(Opts, {"n": 3}, where="w", error=InvalidValueError) == Opts(n=3)


def test_unknown_keys_are_named_with_where_and_the_known_keys_in_the_callers_error():
    with pytest.raises(InvalidValueError, match=r"^my opts: unknown key\(s\) \['m', 'y'\]; known keys: \['n', 'x'\]$"):
        options_from_mapping(Opts, {"y": 1, "m": 2, "n": 3}, where="my opts", error=InvalidValueError)
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) \['m'\]; known settings: \['n', 'x'\]"):
        options_from_mapping(Opts, {"m": 2}, where="w", error=SettingsError, noun="setting")
    with pytest.raises(EngineConfigError, match="w must be a mapping of key names to values, got list"):
        options_from_mapping(Opts, [1, 2], where="w", error=EngineConfigError)  # type: ignore[arg-type]


def test_the_classes_own_errors_keep_their_class_and_gain_where():
    with pytest.raises(OwnError, match=r"^fleet: x = 2.0 must be in \[0, 1\]$"):
        options_from_mapping(Opts, {"x": 2.0}, where="fleet", error=InvalidValueError)


def test_exact_numbers_converts_only_exactly():
    got = options_from_mapping(Opts, {"n": 3.0, "x": 1}, where="w", error=InvalidValueError, exact_numbers=True)
    assert got == Opts(n=3, x=1.0) and type(got.n) is int and type(got.x) is float
    assert options_from_mapping(Opts, {"n": 2.5}, where="w", error=InvalidValueError, exact_numbers=True).n == 2.5
    assert options_from_mapping(Opts, {"n": 1e300}, where="w", error=InvalidValueError, exact_numbers=True).n == 1e300
    assert options_from_mapping(Opts, {"n": 3.0}, where="w", error=InvalidValueError).n == 3.0  # off: as given


@pytest.mark.parametrize(("cls", "error"), [
    (ProfileOptions, EngineConfigError), (AcceptanceOptions, InvalidValueError),
    (ServedVerificationOptions, InvalidValueError), (ControllerSettings, SettingsError),
])
def test_every_options_class_reads_a_mapping_by_the_one_rule(cls, error):
    assert cls.from_mapping(None) == cls()
    with pytest.raises(error, match=r"^here: unknown (key|setting)\(s\) \['nope'\]; known (keys|settings): \["):
        cls.from_mapping({"nope": 1}, where="here")
    with pytest.raises(error, match="^here must be a mapping"):
        cls.from_mapping([("nope", 1)], where="here")


def test_field_docs_reads_the_docstring_under_each_field():
    assert field_docs(Opts) == {"n": "How many.", "x": "A fraction."}
    assert field_docs(int) == {}
